// The layout step of the layer-batched K/V projection (see cross_kv.h for the math, the layout and the shapes).
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "tessera/ops/cross_kv/cross_kv.h"
#include "tessera/ops/residual/elementwise_cuda.cuh"

namespace tessera {
namespace {

using cuda::ceil_div;

constexpr int kThreads = 256;

// kv[i][n, j..j+W) = P[n, i KV + j..) + bias[i KV + j..): one thread per W-element unit of the 2L slices, unit
// u = (i Nk + n) (KV / W) + j / W, grid-stride. P: (Nk, 2 L KV) row-major; bias (2 L KV) or null.
template <typename T, int W>
__global__ void cross_kv_layout_forward_pack(T* __restrict__ kv, const T* __restrict__ proj, const T* __restrict__ bias,
                                             int64_t units, int Nk, int KV, int64_t width, int64_t stride) {
  const int row_units = KV / W;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = u / row_units;  // i Nk + n
    const int j = static_cast<int>(u - row * row_units) * W;
    const int64_t i = row / Nk, n = row - i * Nk, col = i * KV + j;
    float v[W];
    cuda::load_f32<T, W>(proj + n * width + col, v);
    if (bias) {
      float b[W];
      cuda::load_f32<T, W>(bias + col, b);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] += b[k];
    }
    cuda::store_f32<T, W>(kv + i * stride + n * KV + j, v);
  }
}

// dP[n, i KV + j..j+W) = d_kv[i][n, j..): the same units as the forward, the copy reversed.
template <typename T, int W>
__global__ void cross_kv_layout_backward_pack(T* __restrict__ d_proj, const T* __restrict__ d_kv, int64_t units, int Nk,
                                              int KV, int64_t width, int64_t stride) {
  const int row_units = KV / W;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = u / row_units;
    const int j = static_cast<int>(u - row * row_units) * W;
    const int64_t i = row / Nk, n = row - i * Nk;
    float v[W];
    cuda::load_f32<T, W>(d_kv + i * stride + n * KV + j, v);
    cuda::store_f32<T, W>(d_proj + n * width + i * KV + j, v);
  }
}

// 16-byte packs when every row start is 16-byte aligned: KV and the slice stride multiples of the pack, and the
// pointers aligned (P's rows start at multiples of KV too, since its width is 2 L KV).
template <typename T>
bool packs_ok(const CrossKvParams& p, std::initializer_list<const void*> ptrs) {
  constexpr int V = cuda::Pack<T>::kVec;
  if (p.KV % V != 0 || p.stride() % V != 0) return false;
  for (const void* q : ptrs)
    if (q && !cuda::aligned16(q)) return false;
  return true;
}

template <typename T, typename Fn>
void with_width(const CrossKvParams& p, std::initializer_list<const void*> ptrs, Fn&& f) {
  if (packs_ok<T>(p, ptrs)) f(std::integral_constant<int, cuda::Pack<T>::kVec>{});
  else f(std::integral_constant<int, 1>{});
}

}  // namespace

void cross_kv_layout_forward_cuda(const CrossKvParams& p, DType dtype, void* kv, const void* proj, const void* bias,
                                  Context& ctx) {
  if (p.Nk == 0) return;
  cuda::dispatch_float(dtype, "cross_kv_forward", [&](auto t) {
    using T = decltype(t);
    with_width<T>(p, {kv, proj, bias}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      const int64_t units = 2 * int64_t{p.L} * p.Nk * (p.KV / W);
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(units, kThreads), 2147483647LL));
      cross_kv_layout_forward_pack<T, W>
          <<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(kv), static_cast<const T*>(proj),
                                                static_cast<const T*>(bias), units, p.Nk, p.KV, p.width(), p.stride());
      TS_CHECK_LAUNCH();
    });
  });
}

void cross_kv_layout_backward_cuda(const CrossKvParams& p, DType dtype, void* d_proj, const void* d_kv, Context& ctx) {
  if (p.Nk == 0) return;
  cuda::dispatch_float(dtype, "cross_kv_backward", [&](auto t) {
    using T = decltype(t);
    with_width<T>(p, {d_proj, d_kv}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      const int64_t units = 2 * int64_t{p.L} * p.Nk * (p.KV / W);
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(units, kThreads), 2147483647LL));
      cross_kv_layout_backward_pack<T, W><<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(d_proj),
                                                                               static_cast<const T*>(d_kv), units, p.Nk,
                                                                               p.KV, p.width(), p.stride());
      TS_CHECK_LAUNCH();
    });
  });
}

}  // namespace tessera
