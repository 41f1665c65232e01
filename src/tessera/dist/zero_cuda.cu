// ZeRO-1's global-norm clipping on a GPU (zero.h): the squared norm of this rank's gradient range, and the
// clip applied to that range once the ranks' squared norms are summed. No host round trip: the all-reduce of the
// f64 scalar sits between the two launches on the streams.
#include <cuda_runtime.h>

#include <algorithm>

#include "tessera/core/cuda_check.h"
#include "tessera/core/cuda_util.cuh"
#include "tessera/dist/zero.h"

namespace tessera {

namespace {

constexpr int kThreads = 256;

// x: (n) T. Grid P (fixed per device); block b strides over elements b·256 + t, (b + P)·256 + t, ... summing x² in
// f32 registers; partials[b] = the block's sum (block_sum: fixed order, so the result is deterministic).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    zero_sum_squares_partials(float* __restrict__ partials, const T* __restrict__ x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float v = cuda::to_f32(x[i]);
    acc += v * v;
  }
  __shared__ float smem[32];
  acc = cuda::block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: sum_sq[0] = Σ partials in f64, thread t taking partials t, t + 256, ... then a fixed tree.
__global__ void __launch_bounds__(kThreads)
    zero_sum_partials(double* __restrict__ sum_sq, const float* __restrict__ partials, int count) {
  __shared__ double smem[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  smem[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) sum_sq[0] = smem[0];
}

// x ← c · x with c = min(1, max_norm / (sqrt(sum_sq) + 1e-6)) (as clip_grad_norm_ref); block 0 stores the norm.
template <typename T>
__global__ void __launch_bounds__(kThreads) zero_clip(T* __restrict__ x, int64_t n, const double* __restrict__ sum_sq,
                                                      float max_norm, float* __restrict__ norm_out) {
  const double norm = sqrt(sum_sq[0]);
  if (blockIdx.x == 0 && threadIdx.x == 0) *norm_out = static_cast<float>(norm);
  const double coef = max_norm > 0.0f ? max_norm / (norm + 1e-6) : 1.0;
  if (coef >= 1.0) return;
  const float c = static_cast<float>(coef);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    x[i] = cuda::from_f32<T>(cuda::to_f32(x[i]) * c);
}

int grid_for(int64_t n, const Context& ctx) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cuda::ceil_div(n, kThreads), 8 * ctx.gpu().sm_count)));
}

}  // namespace

void zero_sum_squares_cuda(DType dtype, const void* x, int64_t n, double* sum_sq, Context& ctx) {
  if (n == 0) {
    TS_CHECK_CUDA(cudaMemsetAsync(sum_sq, 0, sizeof(double), ctx.stream()));
    return;
  }
  const int grid = grid_for(n, ctx);
  float* partials = static_cast<float*>(ctx.scratch(static_cast<size_t>(grid) * sizeof(float)));
  cuda::dispatch_float(dtype, "zero_sum_squares", [&](auto t) {
    using T = decltype(t);
    zero_sum_squares_partials<T><<<grid, kThreads, 0, ctx.stream()>>>(partials, static_cast<const T*>(x), n);
    TS_CHECK_LAUNCH();
  });
  zero_sum_partials<<<1, kThreads, 0, ctx.stream()>>>(sum_sq, partials, grid);
  TS_CHECK_LAUNCH();
}

void zero_clip_cuda(DType dtype, void* x, int64_t n, const double* sum_sq, float max_norm, float* norm, Context& ctx) {
  const int grid = grid_for(n, ctx);
  cuda::dispatch_float(dtype, "zero_clip", [&](auto t) {
    using T = decltype(t);
    zero_clip<T><<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(x), n, sum_sq, max_norm, norm);
    TS_CHECK_LAUNCH();
  });
}

}  // namespace tessera
