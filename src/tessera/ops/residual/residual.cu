// Fused bias + dropout + residual kernels (see residual.h for the math and the launch strategy).
#include <initializer_list>
#include <type_traits>

#include "tessera/ops/residual/elementwise_cuda.cuh"
#include "tessera/ops/residual/residual.h"

namespace tessera {
namespace {

using cuda::ceil_div;

constexpr int kThreads = 256;
constexpr int kBatch = 4;  // rows each backward thread loads before it stores
// Column units (of W elements) per backward block, threadIdx.x; the block's other kThreads / tile_cols rows are
// threadIdx.y. Packs: 8 units (128 bytes of a row), 32 rows. The last block of a column chunk adds the chunk's
// partial rows, one per row group: with 8 units a chunk is 64 columns (bf16), with fewer groups to add than 32
// units and 8 rows give (measured faster: bench/results/2026-12-03-exp2-on-fma-and-residual-chunks-h200.md).
// Single elements keep 32 units, so that a warp's row segment stays 32 elements wide.
template <int W>
constexpr int tile_cols() {
  return W > 1 ? 8 : 32;
}

// out[i] = residual[i] + f_i * (x[i] + bias[i % C]),  f_i = dropout factor of element i (1 without dropout).
// out, residual, x: (N, C) row-major; bias: (C) or null. One thread per W-element unit (W = 16-byte pack or 1),
// grid-stride. out may alias residual or x: each element is read, then written, by the same thread.
// Launched through cuda::launch (a programmatic dependent under Context::pdl): it waits before any global access.
template <typename T, int W>
__global__ void residual_forward_pack(T* out, const T* residual, const T* x, const T* __restrict__ bias, int64_t units,
                                      int C, float dropout, float keep_scale, uint64_t seed, uint64_t stream,
                                      const uint64_t* __restrict__ stream_base) {
  cuda::dependent_prologue();
  if (stream_base && dropout > 0.0f) stream += *stream_base;  // Context::philox_stream_base (CUDA graphs)
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e0 = u * W;
    // 32-bit division when the index fits (64-bit division is a long software sequence).
    const int c0 = e0 <= 0xffffffffLL ? static_cast<int>(static_cast<uint32_t>(e0) % static_cast<uint32_t>(C))
                                      : static_cast<int>(e0 % C);
    float v[W], r[W];
    cuda::load_f32<T, W>(x + e0, v);
    cuda::load_f32<T, W>(residual + e0, r);
    if (bias) {
      float b[W];
      cuda::load_f32<T, W>(bias + c0, b);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] += b[k];
    }
    if (dropout > 0.0f) {
      float f[W];
      cuda::dropout_factors_w<W>(seed, stream, static_cast<uint64_t>(e0), dropout, keep_scale, f);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] *= f[k];
    }
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] += r[k];
    cuda::store_f32<T, W>(out + e0, v);
  }
}

// d_x[i] = f_i * d_out[i];  d_bias[c] += Σ_n d_x[n, c] (as stored in T), when d_bias != null.
// Grid (ceil(C / W / X), groups), block (X, Y) with X = tile_cols<W>(), Y = kThreads / X: thread (tx, ty) owns
// columns c0 = (bx*X + tx)*W .. +W-1 and rows by*Y + ty, stepping gridDim.y*Y (kBatch rows loaded at a time). The Y
// row lanes are summed in shared memory in ty order into partial[group, c]; the chunk's last block adds the groups'
// rows in order into d_bias (cuda::last_block_of_chunk, counters: one per chunk). A fixed order, so d_bias is the
// same on every run. d_x may alias d_out.
// The kBatch rows are held as loaded (16-bit packs: 4 registers each, not 8 floats): f32 copies cost registers and
// occupancy; 3 blocks per SM cap it at 80 registers.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads, 3)
    residual_backward_row_tiles(T* d_x, T* __restrict__ d_bias, float* __restrict__ partial,
                                uint32_t* __restrict__ counters, const T* d_out, int N, int C, float dropout,
                                float keep_scale, uint64_t seed, uint64_t stream,
                                const uint64_t* __restrict__ stream_base) {
  if (stream_base && dropout > 0.0f) stream += *stream_base;  // Context::philox_stream_base (CUDA graphs)
  constexpr int kTileCols = tile_cols<W>(), kTileRows = kThreads / kTileCols;
  __shared__ float lanes[kTileRows][kTileCols * W];
  const int c0 = (blockIdx.x * kTileCols + threadIdx.x) * W;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;
  if (c0 < C) {
    // kBatch rows per step, all loaded before any store: d_x may alias d_out, so the compiler cannot move the
    // next row's load above this row's store by itself, and one load in flight per thread halves the bandwidth.
    const int step = gridDim.y * kTileRows;
    for (int n0 = blockIdx.y * kTileRows + threadIdx.y; n0 < N; n0 += kBatch * step) {
      cuda::RawUnit<T, W> raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (n0 + j * step < N) raw[j] = cuda::load_raw<T, W>(d_out + static_cast<int64_t>(n0 + j * step) * C + c0);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (n0 + j * step >= N) break;
        const int64_t e0 = static_cast<int64_t>(n0 + j * step) * C + c0;
        float g[W];
#pragma unroll
        for (int k = 0; k < W; ++k) g[k] = cuda::to_f32(raw[j].v[k]);
        if (dropout > 0.0f) {
          float f[W];
          cuda::dropout_factors_w<W>(seed, stream, static_cast<uint64_t>(e0), dropout, keep_scale, f);
#pragma unroll
          for (int k = 0; k < W; ++k) g[k] *= f[k];
        }
        cuda::store_f32<T, W>(d_x + e0, g);
        // The reference sums d_x as stored (in T).
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] += cuda::round_to<T>(g[k]);
      }
    }
  }
  if (d_bias == nullptr) return;  // uniform over the block
#pragma unroll
  for (int k = 0; k < W; ++k) lanes[threadIdx.y][threadIdx.x * W + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < C) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float s = 0.0f;
#pragma unroll
      for (int y = 0; y < kTileRows; ++y) s += lanes[y][threadIdx.x * W + k];
      partial[static_cast<size_t>(blockIdx.y) * C + c0 + k] = s;
    }
  }
  if (cuda::last_block_of_chunk(counters + blockIdx.x, gridDim.y))
    cuda::column_partials_add<T, W, kTileCols, kTileRows>(d_bias, partial, gridDim.y, C, c0, c0 < C, &lanes[0][0]);
}

bool vector_ok(int C, int vec, std::initializer_list<const void*> ptrs) {
  if (C % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && !cuda::aligned16(p)) return false;
  return true;
}

}  // namespace

void residual_forward_cuda(const ResidualParams& p, DType dtype, void* out, const void* residual, const void* x,
                           const void* bias, Context& ctx) {
  if (p.N == 0) return;
  const float keep_scale = cuda::dropout_keep_scale(p.dropout);
  cuda::dispatch_float(dtype, "residual_forward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::Pack<T>::kVec;
    const int64_t NC = static_cast<int64_t>(p.N) * p.C;
    const auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      const int64_t units = NC / W;
      const unsigned grid = std::min<int64_t>(ceil_div(units, kThreads), 2147483647LL);
      cuda::launch(residual_forward_pack<T, W>, dim3(grid), dim3(kThreads), 0, ctx, static_cast<T*>(out),
                   static_cast<const T*>(residual), static_cast<const T*>(x), static_cast<const T*>(bias), units, p.C,
                   p.dropout, keep_scale, p.seed, p.stream, ctx.philox_stream_base());
      TS_CHECK_LAUNCH();
    };
    if (vector_ok(p.C, V, {out, residual, x, bias})) launch(std::integral_constant<int, V>{});
    else launch(std::integral_constant<int, 1>{});
  });
}

void residual_backward_cuda(const ResidualParams& p, DType dtype, void* d_x, void* d_bias, const void* d_out,
                            Context& ctx) {
  if (p.N == 0) return;
  const float keep_scale = cuda::dropout_keep_scale(p.dropout);
  cuda::dispatch_float(dtype, "residual_backward", [&](auto t) {
    using T = decltype(t);
    constexpr int V = cuda::Pack<T>::kVec;
    const auto launch = [&](auto w) {
      constexpr int W = decltype(w)::value;
      constexpr int kTileCols = tile_cols<W>(), kTileRows = kThreads / kTileCols;
      const int col_chunks = static_cast<int>(ceil_div(p.C / W, kTileCols));
      TS_CHECK(col_chunks <= Context::kArrivalCounters, "residual_backward: C ", p.C, " is too wide");
      constexpr auto kernel = residual_backward_row_tiles<T, W>;
      const int groups = cuda::one_wave_row_groups(p.N, col_chunks, kTileRows, cuda::blocks_per_sm<kernel, kThreads>(),
                                                   ctx.gpu().sm_count);
      float* partial = d_bias ? static_cast<float*>(ctx.scratch(static_cast<size_t>(groups) * p.C * sizeof(float)))
                              : nullptr;
      const dim3 grid(col_chunks, groups), block(kTileCols, kTileRows);
      kernel<<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(d_x), static_cast<T*>(d_bias), partial,
                                               ctx.arrival_counters(), static_cast<const T*>(d_out), p.N, p.C,
                                               p.dropout, keep_scale, p.seed, p.stream, ctx.philox_stream_base());
      TS_CHECK_LAUNCH();
    };
    if (vector_ok(p.C, V, {d_x, d_out})) launch(std::integral_constant<int, V>{});
    else launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace tessera
