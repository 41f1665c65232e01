// Fused bias + activation kernels: GELU (tanh), ReLU, SwiGLU (see activation.h for the math and the strategy).
#include <initializer_list>
#include <type_traits>

#include "tessera/ops/activation/activation.h"
#include "tessera/ops/activation/activation_math.cuh"
#include "tessera/ops/residual/elementwise_cuda.cuh"

namespace tessera {
namespace {

using cuda::ceil_div;
using namespace act_math;

constexpr int kThreads = 256;
constexpr int kTileCols = 32;  // column units (of W elements) per backward block: threadIdx.x
constexpr int kTileRows = 8;   // rows in flight per backward block: threadIdx.y
// Rows each backward thread loads before it stores: 1. The activation math already hides the load latency that the
// residual backward batches rows for, and more rows in flight would cost registers and occupancy.
constexpr int kBatch = 1;
// The output dropout of a launch (ActivationParams' dropout, its keep scale and streams).
struct ActDropout {
  float p = 0.0f, keep_scale = 1.0f;
  uint64_t seed = 0, stream = 0;
  const uint64_t* stream_base = nullptr;
};

// Gelu / Relu: out[n, f] = act(in[n, f] + bias[f]);  in, out: (N, F), bias: (F) or null.
// Swiglu (kGlu): out[n, f] = silu(g) * u, g = in[n, f] + bias[f], u = in[n, F + f] + bias[F + f];
//   in: (N, 2F) rows [gate | up], out: (N, F), bias: (2F) or null.
// One thread per W-element unit of out (W = 16-byte pack or 1), grid-stride over N * F / W units.
// kDrop: out times the dropout factors Z of its elements (index n F + f), as the reference draws them.
template <typename T, int W, bool kGlu, bool kDrop>
__global__ void activation_forward_pack(T* out, const T* in, const T* __restrict__ bias, int64_t units, int F, int act,
                                        ActDropout drop) {
  if constexpr (kDrop)
    if (drop.stream_base) drop.stream += *drop.stream_base;  // Context::philox_stream_base (CUDA graphs)
  const int units_per_row = F / W;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // 32-bit division when the index fits (64-bit division is a long software sequence).
    int64_t n;
    int f0;
    if (u <= 0xffffffffLL) {
      const uint32_t u32 = static_cast<uint32_t>(u), upr = static_cast<uint32_t>(units_per_row);
      n = u32 / upr;
      f0 = static_cast<int>(u32 - static_cast<uint32_t>(n) * upr) * W;
    } else {
      n = u / units_per_row;
      f0 = static_cast<int>(u - n * units_per_row) * W;
    }
    float y[W];
    if constexpr (kGlu) {
      const T* row = in + n * 2 * F;
      float g[W], up[W];
      cuda::load_f32<T, W>(row + f0, g);
      cuda::load_f32<T, W>(row + F + f0, up);
      if (bias) {
        float bg[W], bu[W];
        cuda::load_f32<T, W>(bias + f0, bg);
        cuda::load_f32<T, W>(bias + F + f0, bu);
#pragma unroll
        for (int k = 0; k < W; ++k) g[k] += bg[k], up[k] += bu[k];
      }
#pragma unroll
      for (int k = 0; k < W; ++k) y[k] = g[k] * sigmoid(g[k]) * up[k];
    } else {
      float x[W];
      cuda::load_f32<T, W>(in + n * F + f0, x);
      if (bias) {
        float b[W];
        cuda::load_f32<T, W>(bias + f0, b);
#pragma unroll
        for (int k = 0; k < W; ++k) x[k] += b[k];
      }
#pragma unroll
      for (int k = 0; k < W; ++k) y[k] = act_of<T>(act, x[k]);
    }
    if constexpr (kDrop) {
      float z[W];
      cuda::dropout_factors_w<W>(drop.seed, drop.stream, static_cast<uint64_t>(n * F + f0), drop.p, drop.keep_scale, z);
#pragma unroll
      for (int k = 0; k < W; ++k) y[k] *= z[k];
    }
    cuda::store_f32<T, W>(out + n * F + f0, y);
  }
}

// Backward. Gelu / Relu: d_in[n, f] = d_out[n, f] * act'(in[n, f] + bias[f]).
// Swiglu: d_in[n, f] = dy u s (1 + g (1 - s)), d_in[n, F + f] = dy g s, with s = sigmoid(g), dy = d_out[n, f].
// d_bias[c] += Σ_n d_in[n, c] (as stored in T, like the reference) over the in width (F, or 2F for Swiglu), when
// d_bias != null.
// Grid (ceil(F / W / 32), groups), block (32, 8): thread (tx, ty) owns out columns f0 = (bx*32 + tx)*W .. +W-1
// (and F + f0 .. for Swiglu) and rows by*8 + ty stepping gridDim.y*8; the 8 row lanes are summed in shared
// memory in ty order into partial[group, c], and the chunk's last block adds the groups' rows in order into d_bias
// (cuda::last_block_of_chunk, counters: one per chunk): deterministic.
// Blocks per SM: 5 without a gate (48 registers), 3 for SwiGLU (80 registers, no spill; it would spill at 5): bounds
// that keep the one-wave grid resident.
template <typename T, int W, bool kGlu, bool kDrop>
__global__ void __launch_bounds__(kTileCols* kTileRows, kGlu ? 3 : 5)
    activation_backward_row_tiles(T* d_in, T* __restrict__ d_bias, float* __restrict__ partial,
                                  uint32_t* __restrict__ counters, const T* d_out, const T* in,
                                  const T* __restrict__ bias, int N, int F, int act, ActDropout drop) {
  if constexpr (kDrop)
    if (drop.stream_base) drop.stream += *drop.stream_base;
  constexpr int kHalves = kGlu ? 2 : 1;
  __shared__ float lanes[kTileRows][kHalves][kTileCols * W];
  const int f0 = (blockIdx.x * kTileCols + threadIdx.x) * W;
  const int in_w = kHalves * F;
  float acc[kHalves][W];
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int k = 0; k < W; ++k) acc[h][k] = 0.0f;
  if (f0 < F) {
    float b[kHalves][W];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      if (bias) cuda::load_f32<T, W>(bias + h * F + f0, b[h]);
      else
#pragma unroll
        for (int k = 0; k < W; ++k) b[h][k] = 0.0f;
    }
    // kBatch rows per step, all loaded before any store: d_in may alias d_out (Gelu / Relu), so the compiler
    // cannot move the next row's loads above this row's stores by itself.
    const int step = gridDim.y * kTileRows;
    for (int n0 = blockIdx.y * kTileRows + threadIdx.y; n0 < N; n0 += kBatch * step) {
      float dy[kBatch][W], x[kBatch][kHalves][W];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int n = n0 + j * step;
        if (n >= N) break;
        cuda::load_f32<T, W>(d_out + static_cast<int64_t>(n) * F + f0, dy[j]);
        if constexpr (kDrop) {
          float z[W];
          cuda::dropout_factors_w<W>(drop.seed, drop.stream, static_cast<uint64_t>(n) * F + f0, drop.p, drop.keep_scale,
                                     z);
#pragma unroll
          for (int k = 0; k < W; ++k) dy[j][k] *= z[k];
        }
#pragma unroll
        for (int h = 0; h < kHalves; ++h)
          cuda::load_f32<T, W>(in + static_cast<int64_t>(n) * in_w + h * F + f0, x[j][h]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int n = n0 + j * step;
        if (n >= N) break;
        const int64_t row = static_cast<int64_t>(n) * in_w;
        if constexpr (kGlu) {
          float dg[W], du[W];
#pragma unroll
          for (int k = 0; k < W; ++k) {
            const float g = x[j][0][k] + b[0][k], up = x[j][1][k] + b[1][k];
            const float s = sigmoid(g);
            dg[k] = dy[j][k] * up * s * (1.0f + g * (1.0f - s));
            du[k] = dy[j][k] * g * s;
            acc[0][k] += cuda::round_to<T>(dg[k]);
            acc[1][k] += cuda::round_to<T>(du[k]);
          }
          cuda::store_f32<T, W>(d_in + row + f0, dg);
          cuda::store_f32<T, W>(d_in + row + F + f0, du);
        } else {
          float d[W];
#pragma unroll
          for (int k = 0; k < W; ++k) {
            const float u = x[j][0][k] + b[0][k];
            d[k] = dy[j][k] * act_grad_of<T>(act, u);
            acc[0][k] += cuda::round_to<T>(d[k]);
          }
          cuda::store_f32<T, W>(d_in + row + f0, d);
        }
      }
    }
  }
  if (d_bias == nullptr) return;  // uniform over the block
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int k = 0; k < W; ++k) lanes[threadIdx.y][h][threadIdx.x * W + k] = acc[h][k];
  __syncthreads();
  if (threadIdx.y == 0 && f0 < F) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float s = 0.0f;
#pragma unroll
        for (int y = 0; y < kTileRows; ++y) s += lanes[y][h][threadIdx.x * W + k];
        partial[static_cast<size_t>(blockIdx.y) * in_w + h * F + f0 + k] = s;
      }
  }
  if (cuda::last_block_of_chunk(counters + blockIdx.x, gridDim.y))
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      cuda::column_partials_add<T, W, kTileCols, kTileRows>(d_bias + h * F, partial + h * F, gridDim.y, in_w, f0,
                                                            f0 < F, &lanes[0][0][0]);
}

bool vector_ok(int F, int vec, std::initializer_list<const void*> ptrs) {
  if (F % vec != 0) return false;
  for (const void* p : ptrs)
    if (p && !cuda::aligned16(p)) return false;
  return true;
}

// Calls f(std::integral_constant<int, W>, std::bool_constant<kGlu>, std::bool_constant<kDrop>) for the kernel
// variant these arguments need (without dropout, the kernels compile as they would without the option).
template <typename T, typename Fn>
void with_variant(const ActivationParams& p, std::initializer_list<const void*> ptrs, Fn&& f) {
  constexpr int V = cuda::Pack<T>::kVec;
  const bool vec = vector_ok(p.d_ff, V, ptrs);
  const auto with_drop = [&](auto w, auto glu) {
    if (p.dropout > 0.0f) f(w, glu, std::true_type{});
    else f(w, glu, std::false_type{});
  };
  if (p.kind == Activation::Swiglu) {
    if (vec) with_drop(std::integral_constant<int, V>{}, std::true_type{});
    else with_drop(std::integral_constant<int, 1>{}, std::true_type{});
  } else {
    if (vec) with_drop(std::integral_constant<int, V>{}, std::false_type{});
    else with_drop(std::integral_constant<int, 1>{}, std::false_type{});
  }
}

ActDropout act_dropout(const ActivationParams& p, Context& ctx) {
  return {.p = p.dropout,
          .keep_scale = cuda::dropout_keep_scale(p.dropout),
          .seed = p.seed,
          .stream = p.stream,
          .stream_base = ctx.philox_stream_base()};
}

}  // namespace

void activation_forward_cuda(const ActivationParams& p, DType dtype, void* out, const void* in, const void* bias,
                             Context& ctx) {
  if (p.N == 0) return;
  const int act = act_code(p.kind);
  cuda::dispatch_float(dtype, "activation_forward", [&](auto t) {
    using T = decltype(t);
    with_variant<T>(p, {out, in, bias}, [&](auto w, auto glu, auto drop) {
      constexpr int W = decltype(w)::value;
      const int64_t units = static_cast<int64_t>(p.N) * (p.d_ff / W);
      const unsigned grid = std::min<int64_t>(ceil_div(units, kThreads), 2147483647LL);
      activation_forward_pack<T, W, decltype(glu)::value, decltype(drop)::value>
          <<<grid, kThreads, 0, ctx.stream()>>>(static_cast<T*>(out), static_cast<const T*>(in),
                                                static_cast<const T*>(bias), units, p.d_ff, act, act_dropout(p, ctx));
      TS_CHECK_LAUNCH();
    });
  });
}

void activation_backward_cuda(const ActivationParams& p, DType dtype, void* d_in, void* d_bias, const void* d_out,
                              const void* in, const void* bias, Context& ctx) {
  if (p.N == 0) return;
  const int act = act_code(p.kind);
  const int in_w = p.kind == Activation::Swiglu ? 2 * p.d_ff : p.d_ff;
  cuda::dispatch_float(dtype, "activation_backward", [&](auto t) {
    using T = decltype(t);
    with_variant<T>(p, {d_in, d_out, in, bias}, [&](auto w, auto glu, auto drop) {
      constexpr int W = decltype(w)::value;
      const int col_chunks = static_cast<int>(ceil_div(p.d_ff / W, kTileCols));
      TS_CHECK(col_chunks <= Context::kArrivalCounters, "activation_backward: d_ff ", p.d_ff, " is too wide");
      constexpr auto kernel = activation_backward_row_tiles<T, W, decltype(glu)::value, decltype(drop)::value>;
      const int groups = cuda::one_wave_row_groups(p.N, col_chunks, kTileRows,
                                                   cuda::blocks_per_sm<kernel, kTileCols * kTileRows>(),
                                                   ctx.gpu().sm_count);
      float* partial = d_bias ? static_cast<float*>(ctx.scratch(static_cast<size_t>(groups) * in_w * sizeof(float)))
                              : nullptr;
      const dim3 grid(col_chunks, groups), block(kTileCols, kTileRows);
      kernel<<<grid, block, 0, ctx.stream()>>>(static_cast<T*>(d_in), static_cast<T*>(d_bias), partial,
                                               ctx.arrival_counters(), static_cast<const T*>(d_out),
                                               static_cast<const T*>(in), static_cast<const T*>(bias), p.N, p.d_ff, act,
                                               act_dropout(p, ctx));
      TS_CHECK_LAUNCH();
    });
  });
}

}  // namespace tessera
