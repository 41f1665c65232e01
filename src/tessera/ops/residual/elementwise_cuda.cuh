// tessera/ops/residual/elementwise_cuda.cuh — pieces shared by the memory-bound kernels (residual, activation,
// embedding, norm): dropout masks from the shared Philox, the fixed-order column sums that make bias gradients
// deterministic (finished in the launch by the last block of each column chunk), and the host helpers that size
// one-wave grids. CUDA sources only.
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
__device__ __forceinline__ float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

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

// The column sums of a (column chunks × row groups) grid of (column units, row lanes) blocks (the residual and
// activation backwards, for their bias gradients), finished inside the same launch. Each block writes its chunk's
// column sums over its rows as one row of `partial` (row blockIdx.y, `width` floats), then calls
// last_block_of_chunk: the last block of the chunk to arrive adds the chunk's rows in group order into the output
// (column_partials_add), so the sum has a fixed order (deterministic, no float atomics) and needs no second kernel,
// whose launch and ramp would be a large part of a short kernel's time.
//
// Arrival is counted in *counter (Context::arrival_counters(), one per chunk: blockIdx.x), zero before the launch;
// the last block sets it back to zero for the next one. Returns true in that block only (uniform over the block).
__device__ __forceinline__ bool last_block_of_chunk(uint32_t* counter, uint32_t blocks) {
  __shared__ bool last;
  __threadfence();  // release: this thread's partial stores are visible device-wide before its block is counted
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(counter, 1u) == blocks - 1;
    if (last) atomicExch(counter, 0u);  // every block of the chunk has counted: ready for the next launch
  }
  __syncthreads();
  if (last) __threadfence();  // acquire: the other blocks' partials are read after their counts
  return last;
}

// W floats at p through L2 (ld.global.cg: the partials were written by other blocks of this launch, so not through
// L1 or the read-only path). W == 1, 4 or 8, p 4·W-byte aligned for W > 1.
template <int W>
__device__ __forceinline__ void load_cg(const float* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = __ldcg(p);
  } else {
    static_assert(W % 4 == 0, "vector loads of whole float4s");
#pragma unroll
    for (int q = 0; q < W / 4; ++q) {
      const float4 f = __ldcg(reinterpret_cast<const float4*>(p) + q);
      v[4 * q] = f.x;
      v[4 * q + 1] = f.y;
      v[4 * q + 2] = f.z;
      v[4 * q + 3] = f.w;
    }
  }
}

// out[c0 + k] += Σ_{g = 0..groups-1} partial[g * width + c0 + k], k < W, by every thread (tx, ty) of the
// (kCols, kLanes) block that last_block_of_chunk chose (threads with valid == false only take part in the barriers).
// Lane ty sums groups ty, ty + kLanes, ... in order, kAhead loads in flight; lane 0 then adds the kLanes lane sums in
// order, in f32, and rounds once into out. The same order on every run. lanes: kLanes × kCols W floats of the
// block's shared memory, free to reuse from the call on.
template <typename T, int W, int kCols, int kLanes>
__device__ __forceinline__ void column_partials_add(T* out, const float* partial, int groups, int width, int c0,
                                                    bool valid, float* lanes) {
  constexpr int kAhead = 4;
  // out as it was, loaded with the partials: read after the sums it would be one more memory round trip at the
  // very end.
  // Only this block writes it, and only below.
  float o[W] = {};
  if (threadIdx.y == 0 && valid)
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = to_f32(out[c0 + k]);
  float s[W];
#pragma unroll
  for (int k = 0; k < W; ++k) s[k] = 0.0f;
  if (valid) {
    for (int g0 = threadIdx.y; g0 < groups; g0 += kLanes * kAhead) {
      float v[kAhead][W];
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
        const int g = g0 + a * kLanes;
        if (g < groups) {
          load_cg<W>(partial + static_cast<size_t>(g) * width + c0, v[a]);
        } else {
#pragma unroll
          for (int k = 0; k < W; ++k) v[a][k] = 0.0f;
        }
      }
#pragma unroll
      for (int a = 0; a < kAhead; ++a)
#pragma unroll
        for (int k = 0; k < W; ++k) s[k] += v[a][k];
    }
  }
  float* mine = lanes + (threadIdx.y * kCols + threadIdx.x) * W;
  __syncthreads();  // the caller's last reads of lanes are done
#pragma unroll
  for (int k = 0; k < W; ++k) mine[k] = s[k];
  __syncthreads();
  if (threadIdx.y != 0 || !valid) return;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < kLanes; ++y) t += lanes[(y * kCols + threadIdx.x) * W + k];
    out[c0 + k] = from_f32<T>(o[k] + t);
  }
}

// Blocks of kKernel (kThreads threads, kSmem bytes of dynamic shared memory) that one SM holds at once. Asked once
// per kernel (a template on the kernel itself, so each has its own static; the answer depends on the kernel and the
// architecture only): the query costs microseconds of host time, which a 20-microsecond kernel would wait for.
template <auto kKernel, int kThreads, size_t kSmem = 0>
int blocks_per_sm() {
  static const int per_sm = [] {
    int n = 0;
    TS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, kSmem));
    return std::max(n, 1);
  }();
  return per_sm;
}

// Row groups for a (column chunks × row groups) grid that the GPU holds in one wave (each block then loops over
// its rows): fewer partial rows for the fused column sums to add, and no partial last wave; one wave measured
// faster than deeper grids (bench/results/2026-12-01-one-wave-tails-h200.md). Never more groups than row tiles of
// rows_per_block, nor than a grid's y limit.
inline int one_wave_row_groups(int N, int col_chunks, int rows_per_block, int blocks_per_sm, int sm_count) {
  const int tiles = std::max(1, static_cast<int>(ceil_div(N, rows_per_block)));
  const int resident = blocks_per_sm * sm_count;
  return std::max(1, std::min({tiles, resident / std::max(col_chunks, 1), 65535}));
}

}  // namespace tessera::cuda
