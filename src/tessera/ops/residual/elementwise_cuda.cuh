// tessera/ops/residual/elementwise_cuda.cuh — device pieces shared by the memory-bound elementwise kernels
// (residual, activation, embedding): dropout masks from the shared Philox, and the fixed-order column-sum
// reduction that makes bias gradients deterministic. CUDA sources only.
#pragma once
#include <algorithm>

#include "tessera/core/cuda_util.cuh"
#include "tessera/core/philox.h"

namespace tessera::cuda {

// 1 / (1 - p) in f32, as the references compute keep_scale in their T (= float for the f32 build).
__host__ __device__ __forceinline__ float dropout_keep_scale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

// The dropout factor of element `index` (0 or keep_scale): philox_keep(seed, stream, index, p), as the reference.
__device__ __forceinline__ float dropout_factor(uint64_t seed, uint64_t stream, uint64_t index, float p,
                                                float keep_scale) {
  return philox_keep(seed, stream, index, p) ? keep_scale : 0.0f;
}

// W consecutive elements of T at p as f32: one 16-byte access when W is the pack width, else W == 1.
template <typename T, int W>
__device__ __forceinline__ void load_f32(const T* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = to_f32(*p);
  } else {
    static_assert(W == Pack<T>::kVec, "a vector access is one 16-byte pack");
    const Pack<T> q = load_pack(p);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = to_f32(q.v[k]);
  }
}
template <typename T, int W>
__device__ __forceinline__ void store_f32(T* p, const float (&v)[W]) {
  if constexpr (W == 1) {
    *p = from_f32<T>(v[0]);
  } else {
    static_assert(W == Pack<T>::kVec, "a vector access is one 16-byte pack");
    Pack<T> q;
#pragma unroll
    for (int k = 0; k < W; ++k) q.v[k] = from_f32<T>(v[k]);
    store_pack(p, q);
  }
}
// v rounded to T and back: the value a reference computing in T would hold after storing it.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_f32(from_f32<T>(v)); }

// Dropout factors of the kN consecutive elements index0 .. index0 + kN - 1, kN 4 or a multiple of 8 and index0 %
// kN == 0: one Philox block holds the 16-bit draws of 8 consecutive indices (philox_u16: block index >> 3, word
// (index >> 1) & 3, half index & 1), so a 16-byte pack of 8 takes one block and a pack of 4 half of one. The keep
// rule is philox_keep's: u16 / 2^16 >= p.
template <int kN>
__device__ __forceinline__ void dropout_factors(uint64_t seed, uint64_t stream, uint64_t index0, float p,
                                                float keep_scale, float (&f)[kN]) {
  static_assert(kN == 4 || kN % 8 == 0, "dropout_factors takes half a Philox block or whole ones");
  const auto block_words = [&](uint64_t block) {
    const Philox4 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(stream),
                       static_cast<uint32_t>(stream >> 32)}};
    return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  };
  const auto factor = [&](uint32_t word, int half) {
    const uint32_t u = half ? word >> 16 : word & 0xffffu;
    return static_cast<float>(u) * (1.0f / 65536.0f) >= p ? keep_scale : 0.0f;
  };
  if constexpr (kN == 4) {
    const Philox4 r = block_words(index0 >> 3);
    const bool upper = (index0 & 4) != 0;  // elements 4..7 of the block: words 2 and 3
    const uint32_t w0 = upper ? r.v[2] : r.v[0], w1 = upper ? r.v[3] : r.v[1];
    f[0] = factor(w0, 0);
    f[1] = factor(w0, 1);
    f[2] = factor(w1, 0);
    f[3] = factor(w1, 1);
  } else {
#pragma unroll
    for (int q = 0; q < kN / 8; ++q) {
      const Philox4 r = block_words((index0 >> 3) + q);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[8 * q + k] = factor(r.v[k >> 1], k & 1);
    }
  }
}

// Dropout factors of W consecutive elements from index0: W == 1 draws one word; W > 1 (a pack, index0 % W == 0
// because rows hold a whole number of packs) draws a Philox block per 8 elements.
template <int W>
__device__ __forceinline__ void dropout_factors_w(uint64_t seed, uint64_t stream, uint64_t index0, float p,
                                                  float keep_scale, float (&f)[W]) {
  if constexpr (W == 1) f[0] = dropout_factor(seed, stream, index0, p, keep_scale);
  else dropout_factors<W>(seed, stream, index0, p, keep_scale, f);
}

// d_bias[c] += Σ_g partial[g, c], g = 0 .. groups-1 (deterministic; no atomics). partial: (groups, W) f32;
// d_bias: (W) in T. Launch with column_partials_reduce_grid / _block: block (32 columns, 8 lanes); lane y sums
// groups y, y + 8, ... in order, then lane 0 adds the 8 lane sums in order.
inline unsigned column_partials_reduce_grid(int W) { return ceil_div(W, 32); }
inline dim3 column_partials_reduce_block() { return dim3(32, 8); }
template <typename T>
__global__ void __launch_bounds__(256)
    column_partials_reduce_add(T* __restrict__ d_bias, const float* __restrict__ partial, int groups, int W) {
  __shared__ float lanes[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  // Unrolled so that 8 loads are in flight before the (ordered) adds: a rolled loop waits one memory latency
  // per partial (hundreds of groups: tens of microseconds).
  if (c < W)
#pragma unroll 8
    for (int g = threadIdx.y; g < groups; g += 8) s += partial[static_cast<size_t>(g) * W + c];
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= W) return;
  float t = 0.0f;
#pragma unroll
  for (int y = 0; y < 8; ++y) t += lanes[y][threadIdx.x];
  d_bias[c] = from_f32<T>(to_f32(d_bias[c]) + t);
}

// Row groups for a (row groups × column chunks) grid of blocks that each take kRowsPerBlock rows at a time:
// enough blocks to fill the GPU about 8 deep, never more groups than there are row tiles.
inline int elementwise_row_groups(int N, int col_chunks, int rows_per_block, int sm_count) {
  const int tiles = std::max(1, static_cast<int>(ceil_div(N, rows_per_block)));
  const int want = std::max(1, static_cast<int>(ceil_div(8LL * sm_count, std::max(col_chunks, 1))));
  return std::min({tiles, want, 65535});
}

}  // namespace tessera::cuda
