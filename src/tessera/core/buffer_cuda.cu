// tessera/core/buffer_cuda.cu — device allocation, copies and fills behind Buffer and copy().
#include <cuda_runtime.h>

#include "tessera/core/buffer.h"
#include "tessera/core/cuda_check.h"

namespace tessera {

void* device_malloc(size_t bytes, int device, const char* what) {
  TS_CHECK_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error so that the process can go on (and report) after an OOM
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    TS_THROW("out of GPU memory: ", what, " needs ", bytes / (1024.0 * 1024 * 1024), " GiB, ",
             free_b / (1024.0 * 1024 * 1024), " GiB free of ", total_b / (1024.0 * 1024 * 1024),
             " GiB on cuda:", device);
  }
  return p;
}

void device_free(void* p, int device) noexcept {
  cudaSetDevice(device);
  cudaFree(p);
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const Context& ctx) {
  TS_CHECK(ctx.is_cuda(), "copy between ", src_device.str(), " and ", dst_device.str(), " needs a CUDA context");
  TS_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx.stream()));
  if (dst_device.is_cpu()) TS_CHECK_CUDA(cudaStreamSynchronize(ctx.stream()));
}

void device_fill(void* dst, unsigned char byte, size_t bytes, const Context& ctx) {
  TS_CHECK_CUDA(cudaMemsetAsync(dst, byte, bytes, ctx.stream()));
}

}  // namespace tessera
