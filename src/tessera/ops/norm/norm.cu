// Fused LayerNorm / RMSNorm kernels (see norm.h for the math and the launch strategy).
#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/norm/norm.h"

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

constexpr int kFwdThreads = 256;  // 8 rows (warps) per block
constexpr int kBwdThreads = 256;
constexpr int kBwdPer = kNormMaxC / kBwdThreads;  // columns per thread in the backward

// x, out: (N, C); mean, rstd: (N) f32. One warp per row, one pass: Σ(x - x0) and Σ(x - x0)² together, shifted by
// the row's first element so that a large common offset does not cancel the variance away.
template <typename T, bool kLayerNorm, bool kVec>
__global__ void norm_forward_warp_row(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                      const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                      int N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* xr = x + static_cast<size_t>(row) * C;
  T* orow = out + static_cast<size_t>(row) * C;
  const float shift = kLayerNorm ? to_f32(xr[0]) : 0.0f;
  float s = 0.0f, ss = 0.0f;
  if constexpr (kVec) {
    constexpr int V = cuda::Pack<T>::kVec;
    for (int c = lane * V; c < C; c += 32 * V) {
      const cuda::Pack<T> p = cuda::load_pack(xr + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float v = to_f32(p.v[i]) - shift;
        s += v;
        ss += v * v;
      }
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float v = to_f32(xr[c]) - shift;
      s += v;
      ss += v * v;
    }
  }
  s = cuda::warp_sum(s);
  ss = cuda::warp_sum(ss);
  float m = 0.0f, rs;
  if constexpr (kLayerNorm) {
    const float ms = s / C;
    const float var = fmaxf(ss / C - ms * ms, 0.0f);
    m = ms + shift;
    rs = rsqrtf(var + eps);
  } else {
    rs = rsqrtf(ss / C + eps);
  }
  if (lane == 0) {
    if constexpr (kLayerNorm) mean[row] = m;
    rstd[row] = rs;
  }
  if constexpr (kVec) {
    constexpr int V = cuda::Pack<T>::kVec;
    for (int c = lane * V; c < C; c += 32 * V) {
      const cuda::Pack<T> px = cuda::load_pack(xr + c), pw = cuda::load_pack(w + c);
      cuda::Pack<T> po;
      if (b) {
        const cuda::Pack<T> pb = cuda::load_pack(b + c);
#pragma unroll
        for (int i = 0; i < V; ++i) po.v[i] = from_f32<T>((to_f32(px.v[i]) - m) * rs * to_f32(pw.v[i]) + to_f32(pb.v[i]));
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) po.v[i] = from_f32<T>((to_f32(px.v[i]) - m) * rs * to_f32(pw.v[i]));
      }
      cuda::store_pack(orow + c, po);
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float bias = b ? to_f32(b[c]) : 0.0f;
      orow[c] = from_f32<T>((to_f32(xr[c]) - m) * rs * to_f32(w[c]) + bias);
    }
  }
}

// Block sum of two values with one __syncthreads pair (the "one reduction" of the backward).
__device__ __forceinline__ float2 block_sum2(float a, float c, float2* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = cuda::warp_sum(a);
  c = cuda::warp_sum(c);
  __syncthreads();  // the previous row's reads of smem are done
  if (lane == 0) smem[warp] = make_float2(a, c);
  __syncthreads();
  float2 v = lane < warps ? smem[lane] : make_float2(0.0f, 0.0f);
  v.x = cuda::warp_sum(v.x);
  v.y = cuda::warp_sum(v.y);
  return v;
}

// d_x += rstd * (g - mean(g) - xhat * mean(g * xhat))  (LayerNorm; RMSNorm drops mean(g)), g = d_out * w.
// Block b takes rows b, b + gridDim.x, ...; thread t owns columns t + k * blockDim.x and sums its d_w / d_b
// contributions in registers, then writes them to partial_w / partial_b (gridDim.x, C) f32.
template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kBwdThreads) norm_backward_block_rows(
    T* __restrict__ d_x, float* __restrict__ partial_w, float* __restrict__ partial_b, const T* __restrict__ d_out,
    const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ mean, const float* __restrict__ rstd,
    int N, int C) {
  __shared__ float2 smem[32];
  float dw[kBwdPer], db[kBwdPer];
#pragma unroll
  for (int k = 0; k < kBwdPer; ++k) dw[k] = db[k] = 0.0f;
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const size_t off = static_cast<size_t>(row) * C;
    const float m = kLayerNorm ? mean[row] : 0.0f, rs = rstd[row];
    float xh[kBwdPer], g[kBwdPer], dy[kBwdPer];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < kBwdPer; ++k) {
      const int c = threadIdx.x + k * kBwdThreads;
      xh[k] = g[k] = dy[k] = 0.0f;
      if (c < C) {
        dy[k] = to_f32(d_out[off + c]);
        xh[k] = (to_f32(x[off + c]) - m) * rs;
        g[k] = dy[k] * to_f32(w[c]);
        sum_g += g[k];
        sum_gx += g[k] * xh[k];
      }
    }
    const float2 sums = block_sum2(sum_g, sum_gx, smem);
    const float mean_g = kLayerNorm ? sums.x / C : 0.0f, mean_gx = sums.y / C;
#pragma unroll
    for (int k = 0; k < kBwdPer; ++k) {
      const int c = threadIdx.x + k * kBwdThreads;
      if (c < C) {
        d_x[off + c] = from_f32<T>(to_f32(d_x[off + c]) + rs * (g[k] - mean_g - xh[k] * mean_gx));
        dw[k] += dy[k] * xh[k];
        db[k] += dy[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kBwdPer; ++k) {
    const int c = threadIdx.x + k * kBwdThreads;
    if (c < C) {
      partial_w[static_cast<size_t>(blockIdx.x) * C + c] = dw[k];
      if (partial_b) partial_b[static_cast<size_t>(blockIdx.x) * C + c] = db[k];
    }
  }
}

// d_w[c] += Σ_blocks partial_w[block, c] in block order (deterministic); same for d_b when given.
template <typename T>
__global__ void norm_param_grad_reduce(T* __restrict__ d_w, T* __restrict__ d_b, const float* __restrict__ partial_w,
                                       const float* __restrict__ partial_b, int blocks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (int i = 0; i < blocks; ++i) {
    sw += partial_w[static_cast<size_t>(i) * C + c];
    if (d_b) sb += partial_b[static_cast<size_t>(i) * C + c];
  }
  d_w[c] = from_f32<T>(to_f32(d_w[c]) + sw);
  if (d_b) d_b[c] = from_f32<T>(to_f32(d_b[c]) + sb);
}

template <bool kLayerNorm>
void norm_forward_launch(const NormParams& p, DType dtype, void* out, float* mean, float* rstd, const void* x,
                         const void* w, const void* b, Context& ctx) {
  if (p.N == 0) return;
  cuda::dispatch_float(dtype, kLayerNorm ? "layernorm_forward" : "rmsnorm_forward", [&](auto t) {
    using T = decltype(t);
    const bool vec = p.C % cuda::Pack<T>::kVec == 0 && cuda::aligned16(x) && cuda::aligned16(out) &&
                     cuda::aligned16(w) && (!b || cuda::aligned16(b));
    const unsigned grid = ceil_div(p.N, kFwdThreads / 32);
    auto kernel = vec ? norm_forward_warp_row<T, kLayerNorm, true> : norm_forward_warp_row<T, kLayerNorm, false>;
    kernel<<<grid, kFwdThreads, 0, ctx.stream()>>>(static_cast<T*>(out), mean, rstd, static_cast<const T*>(x),
                                                   static_cast<const T*>(w), static_cast<const T*>(b), p.N, p.C, p.eps);
    TS_CHECK_LAUNCH();
  });
}

template <bool kLayerNorm>
void norm_backward_launch(const NormParams& p, DType dtype, void* d_x, void* d_w, void* d_b, const void* d_out,
                          const void* x, const void* w, const float* mean, const float* rstd, Context& ctx) {
  if (p.N == 0) return;
  TS_CHECK(p.C <= kNormMaxC, "norm backward: C ", p.C, " exceeds ", kNormMaxC);
  const int blocks = std::min(p.N, 2 * ctx.gpu().sm_count);
  const size_t partial = static_cast<size_t>(blocks) * p.C;
  float* partial_w = static_cast<float*>(ctx.scratch(2 * partial * sizeof(float)));
  float* partial_b = d_b ? partial_w + partial : nullptr;
  cuda::dispatch_float(dtype, kLayerNorm ? "layernorm_backward" : "rmsnorm_backward", [&](auto t) {
    using T = decltype(t);
    norm_backward_block_rows<T, kLayerNorm><<<blocks, kBwdThreads, 0, ctx.stream()>>>(
        static_cast<T*>(d_x), partial_w, partial_b, static_cast<const T*>(d_out), static_cast<const T*>(x),
        static_cast<const T*>(w), mean, rstd, p.N, p.C);
    TS_CHECK_LAUNCH();
    norm_param_grad_reduce<T><<<ceil_div(p.C, 256), 256, 0, ctx.stream()>>>(
        static_cast<T*>(d_w), static_cast<T*>(d_b), partial_w, partial_b, blocks, p.C);
    TS_CHECK_LAUNCH();
  });
}

}  // namespace

void layernorm_forward_cuda(const NormParams& p, DType dtype, void* out, float* mean, float* rstd, const void* x,
                            const void* w, const void* b, Context& ctx) {
  norm_forward_launch<true>(p, dtype, out, mean, rstd, x, w, b, ctx);
}
void layernorm_backward_cuda(const NormParams& p, DType dtype, void* d_x, void* d_w, void* d_b, const void* d_out,
                             const void* x, const void* w, const float* mean, const float* rstd, Context& ctx) {
  norm_backward_launch<true>(p, dtype, d_x, d_w, d_b, d_out, x, w, mean, rstd, ctx);
}
void rmsnorm_forward_cuda(const NormParams& p, DType dtype, void* out, float* rstd, const void* x, const void* w,
                          Context& ctx) {
  norm_forward_launch<false>(p, dtype, out, nullptr, rstd, x, w, nullptr, ctx);
}
void rmsnorm_backward_cuda(const NormParams& p, DType dtype, void* d_x, void* d_w, const void* d_out, const void* x,
                           const void* w, const float* rstd, Context& ctx) {
  norm_backward_launch<false>(p, dtype, d_x, d_w, nullptr, d_out, x, w, nullptr, rstd, ctx);
}

}  // namespace tessera
