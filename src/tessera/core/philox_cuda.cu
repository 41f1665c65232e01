#include "tessera/core/cuda_check.h"
#include "tessera/core/philox.h"
#include "tessera/core/philox_cuda.h"

namespace tessera {

namespace {
// out: (n) uint32; thread i writes word i of draw `stream`.
__global__ void philox_u32_fill(uint32_t* out, uint64_t seed, uint64_t stream, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = philox_u32(seed, stream, i);
}
}  // namespace

std::vector<uint32_t> philox_u32_cuda(uint64_t seed, uint64_t stream, size_t n) {
  std::vector<uint32_t> host(n);
  if (n == 0) return host;
  uint32_t* dev = nullptr;
  TS_CHECK_CUDA(cudaMalloc(&dev, n * sizeof(uint32_t)));
  constexpr int kThreads = 256;
  philox_u32_fill<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads>>>(dev, seed, stream, n);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(host.data(), dev, n * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(dev);
  TS_CHECK(err == cudaSuccess, "CUDA error in philox_u32_cuda: ", cudaGetErrorString(err));
  return host;
}

}  // namespace tessera
