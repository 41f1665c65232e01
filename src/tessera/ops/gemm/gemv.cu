// The few-row product's CUDA kernel (gemv.h gives the math and the layout).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/activation/activation_math.cuh"
#include "tessera/ops/gemm/gemv.h"

namespace tessera {
namespace {

using cuda::Pack;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// 16 bytes of T: the weights stream (cache-streaming load, evict first: each is read once per product), the rows
// of a stay (they are read by every block).
template <typename T>
__device__ __forceinline__ Pack<T> load_streaming(const T* p) {
  const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(p));
  Pack<T> q;
  *reinterpret_cast<uint4*>(&q) = raw;
  return q;
}
template <typename T>
__device__ __forceinline__ Pack<T> load_kept(const T* p) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  Pack<T> q;
  *reinterpret_cast<uint4*>(&q) = raw;
  return q;
}

// The 128-byte lines of [p, p + n) into L2, spread over the block's threads (n > 0). A hint: whatever another kernel
// writes there meanwhile, a later load returns that, since L2 is where every SM's accesses meet.
template <typename T>
__device__ __forceinline__ void prefetch_l2(const T* p, long n) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / 128, last = (reinterpret_cast<uintptr_t>(p + n) - 1) / 128;
  for (uintptr_t line = first + threadIdx.x; line <= last; line += blockDim.x)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line * 128));
}

// Block: columns [n0, n0 + NC) for rows m < M <= MP. Warp w sums the packs [p0, p1) of K (a quarter of them);
// lane j takes packs p0 + j, p0 + j + 32, ... act < 0: no activation.
// Launched through cuda::launch: the block's weight rows (one contiguous span) are prefetched into L2 before the
// programmatic wait, so that under PDL their first reads overlap the tail of the kernel before (a prefetch keeps the
// wait's invariant: it changes no value a load returns).
template <typename T, int MP, int NC>
__global__ void __launch_bounds__(kThreads)
    gemv_rows(int M, int N, int K, long ldc, T* __restrict__ c, const T* __restrict__ a, const T* __restrict__ w,
              const T* __restrict__ bias, int act) {
  constexpr int V = Pack<T>::kVec;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = blockIdx.x * NC;
  prefetch_l2(w + static_cast<long>(n0) * K, static_cast<long>(min(NC, N - n0)) * K);
  cuda::dependent_prologue();
  const int packs = K / V, per = (packs + kWarps - 1) / kWarps;
  const int p0 = min(packs, warp * per), p1 = min(packs, p0 + per);
  float acc[MP][NC];
#pragma unroll
  for (int m = 0; m < MP; ++m)
#pragma unroll
    for (int j = 0; j < NC; ++j) acc[m][j] = 0.0f;

#pragma unroll 2
  for (int pk = p0 + lane; pk < p1; pk += 32) {
    float wv[NC][V];
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const int n = n0 + j;
      if (n < N) {
        const Pack<T> q = load_streaming(w + static_cast<long>(n) * K + static_cast<long>(pk) * V);
#pragma unroll
        for (int e = 0; e < V; ++e) wv[j][e] = cuda::to_f32(q.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) wv[j][e] = 0.0f;
      }
    }
#pragma unroll
    for (int m = 0; m < MP; ++m) {
      if (m >= M) break;
      const Pack<T> q = load_kept(a + static_cast<long>(m) * K + static_cast<long>(pk) * V);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float x = cuda::to_f32(q.v[e]);
#pragma unroll
        for (int j = 0; j < NC; ++j) acc[m][j] = fmaf(x, wv[j][e], acc[m][j]);
      }
    }
  }

  __shared__ float part[kWarps][MP][NC];
#pragma unroll
  for (int m = 0; m < MP; ++m) {
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const float s = cuda::warp_sum(acc[m][j]);
      if (lane == 0) part[warp][m][j] = s;
    }
  }
  __syncthreads();
  // Epilogue: the warps' sums in warp order (deterministic), the bias, the activation, one rounding.
  for (int t = threadIdx.x; t < MP * NC; t += kThreads) {
    const int m = t / NC, j = t - m * NC, n = n0 + j;
    if (m >= M || n >= N) continue;
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) s += part[q][m][j];
    if (bias) s += cuda::to_f32(bias[n]);
    if (act >= 0) s = act_math::act_of<T>(act, s);
    c[static_cast<long>(m) * ldc + n] = cuda::from_f32<T>(s);
  }
}

template <typename T, int MP>
void launch_rows(const GemvParams& p, void* c, const void* a, const void* w, const void* bias, int act, Context& ctx) {
  // More columns per block when there are many rows: each pack of a is then used against NC weight rows.
  constexpr int NC = MP >= 8 ? 4 : 2;
  cuda::launch(gemv_rows<T, MP, NC>, dim3(cuda::ceil_div(p.N, NC)), dim3(kThreads), 0, ctx, p.M, p.N, p.K,
               static_cast<long>(p.ld_c()), static_cast<T*>(c), static_cast<const T*>(a), static_cast<const T*>(w),
               static_cast<const T*>(bias), act);
  TS_CHECK_LAUNCH();
}

template <typename T>
void launch_typed(const GemvParams& p, void* c, const void* a, const void* w, const void* bias, Context& ctx) {
  const int act = p.act ? act_math::act_code(*p.act) : -1;
  if (p.M <= 1) launch_rows<T, 1>(p, c, a, w, bias, act, ctx);
  else if (p.M <= 2) launch_rows<T, 2>(p, c, a, w, bias, act, ctx);
  else if (p.M <= 4) launch_rows<T, 4>(p, c, a, w, bias, act, ctx);
  else if (p.M <= 8) launch_rows<T, 8>(p, c, a, w, bias, act, ctx);
  else launch_rows<T, 16>(p, c, a, w, bias, act, ctx);
}

}  // namespace

void gemv_cuda(const GemvParams& p, DType dtype, void* c, const void* a, const void* w, const void* bias,
               Context& ctx) {
  if (p.M == 0 || p.N == 0) return;
  static_assert(kGemvMaxRows == 16, "launch_typed's row paddings end at 16");
  if (dtype == DType::BF16) launch_typed<__nv_bfloat16>(p, c, a, w, bias, ctx);
  else if (dtype == DType::F16) launch_typed<__half>(p, c, a, w, bias, ctx);
  else TS_THROW("gemv: the CUDA kernel computes in bf16 or f16, not ", dtype_name(dtype));
}

}  // namespace tessera
