// The toy chain of pdl_chain.h: a reset kernel, then links that each add 1 to the other buffer's values.
#include "pdl_chain.h"
#include "tessera/core/cuda_check.h"
#include "tessera/core/cuda_util.cuh"

namespace tessera::test {
namespace {

constexpr int kThreads = 256;

__global__ void pdl_chain_reset(uint32_t* finished, int links) {
  cuda::dependent_prologue();
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < links; k += gridDim.x * blockDim.x) finished[k] = 0;
}

__global__ void pdl_chain_link(const int32_t* src, int32_t* dst, int n, int link, uint32_t* finished, uint32_t* early,
                               long long spin) {
  // The probe of the overlap (pdl_chain.h): an atomic read, ahead of the wait on purpose.
  if (link > 0 && blockIdx.x == 0 && threadIdx.x == 0 && atomicAdd(&finished[link - 1], 0u) < gridDim.x)
    atomicAdd(early, 1u);
  cuda::dependent_prologue();
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i] + 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(&finished[link], 1u);
  }
}

}  // namespace

void pdl_chain_enqueue(Context& ctx, int32_t* x, int32_t* y, int n, int links, uint32_t* finished, uint32_t* early,
                       int blocks, long long spin) {
  cuda::launch(pdl_chain_reset, dim3(1), dim3(kThreads), 0, ctx, finished, links);
  TS_CHECK_CUDA(cudaGetLastError());
  for (int k = 0; k < links; ++k) {
    const bool even = k % 2 == 0;
    cuda::launch(pdl_chain_link, dim3(blocks), dim3(kThreads), 0, ctx, even ? x : y, even ? y : x, n, k, finished,
                 early, spin);
    TS_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace tessera::test
