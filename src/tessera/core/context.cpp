#include "tessera/core/context.h"

namespace tessera {

#ifndef TESSERA_WITH_CUDA
GpuInfo probe_gpu() { return {}; }
#endif

Context Context::best_available() {
  // The CUDA kernels arrive with the CUDA-backend issue; until then training runs on the CPU path
  // even where a GPU is visible, and `tessera info` reports the GPU it found.
  return Context(Device::cpu());
}

}  // namespace tessera
