// cudaEvent timing of one collective for `tessera bench allreduce` (see allreduce.h).
#include <cuda_runtime.h>

#include "tessera/bench/allreduce.h"
#include "tessera/core/cuda_check.h"

namespace tessera {

double time_launch_cuda(Context& ctx, Stream after, const std::function<CommHandle()>& launch) {
  CudaEvent start, stop;
  // Both events on the communicator's stream: the figure is the collective's own time there.
  TS_CHECK_CUDA(cudaEventRecord(start.get(), after));
  CommHandle h = launch();
  TS_CHECK_CUDA(cudaEventRecord(stop.get(), after));
  h.wait();  // bounded by the communicator's timeout, unlike cudaEventSynchronize on a collective
  TS_CHECK_CUDA(cudaEventSynchronize(stop.get()));
  float ms = 0;
  TS_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

}  // namespace tessera
