// tessera/core/gpu_probe.cu — CUDA runtime probe, compiled only when nvcc is found (sm_90a).
#include <cuda_runtime.h>

#include "tessera/core/context.h"

namespace tessera {

GpuInfo probe_gpu() {
  GpuInfo info;
  int count = 0;
  // No driver or no device is the normal CPU-only case: clear the sticky error and report none.
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return info;
  }
  info.available = true;
  info.count = count;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

}  // namespace tessera
