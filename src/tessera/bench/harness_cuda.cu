// tessera/bench/harness_cuda.cu — cudaEvent timing for BenchHarness (see harness.h).
#include <cuda_runtime.h>

#include "tessera/bench/harness.h"
#include "tessera/core/cuda_check.h"

namespace tessera {

namespace {

// One cudaEvent, destroyed with its owner.
class Event {
 public:
  Event() { TS_CHECK_CUDA(cudaEventCreate(&e_)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace

std::vector<double> time_cuda_runs(Context& ctx, const std::function<void()>& fn, const std::function<void()>& before,
                                   int iters) {
  const cudaStream_t s = ctx.stream();
  std::vector<double> ms;
  ms.reserve(iters);
  Event start, stop;
  for (int i = 0; i < iters; ++i) {
    before();
    TS_CHECK_CUDA(cudaEventRecord(start.get(), s));
    fn();
    TS_CHECK_CUDA(cudaEventRecord(stop.get(), s));
    // One run at a time: the events are reused, and a run never overlaps the next one's flush.
    TS_CHECK_CUDA(cudaEventSynchronize(stop.get()));
    float t = 0;
    TS_CHECK_CUDA(cudaEventElapsedTime(&t, start.get(), stop.get()));
    ms.push_back(t);
  }
  return ms;
}

void copy_d2d_async(void* dst, const void* src, size_t bytes, Context& ctx) {
  TS_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
}

}  // namespace tessera
