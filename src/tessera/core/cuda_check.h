// tessera/core/cuda_check.h — TS_CHECK_CUDA: a failed CUDA runtime call throws tessera::Error (CUDA sources only).
#pragma once
#include <cuda_runtime.h>

#include "tessera/core/error.h"

#define TS_CHECK_CUDA(call) \
  do { \
    const cudaError_t ts_err_ = (call); \
    if (ts_err_ != cudaSuccess) TS_THROW("CUDA error in ", #call, ": ", cudaGetErrorString(ts_err_)); \
  } while (0)

// After a kernel launch: reports a bad launch configuration at once (debug builds also synchronize).
#ifdef NDEBUG
#define TS_CHECK_LAUNCH() TS_CHECK_CUDA(cudaGetLastError())
#else
#define TS_CHECK_LAUNCH() \
  do { \
    TS_CHECK_CUDA(cudaGetLastError()); \
    TS_CHECK_CUDA(cudaDeviceSynchronize()); \
  } while (0)
#endif

namespace tessera {

// One timing cudaEvent, destroyed with its owner (the bench harnesses' start and stop marks).
class CudaEvent {
 public:
  CudaEvent() { TS_CHECK_CUDA(cudaEventCreate(&e_)); }
  ~CudaEvent() { cudaEventDestroy(e_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace tessera
