// Fused LayerNorm / RMSNorm kernels (see norm.h for the math and the launch strategy).
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/elementwise_cuda.cuh"

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

// Both directions use the same layout. A row is taken by a group of G threads (G a power of two, 32 .. 256) and
// a block of kThreads holds R = kThreads / G groups, i.e. R rows in flight. A row is cut into units of U elements
// (U = one 16-byte pack when the row allows it, else 1); thread t of a group owns units t, t + G, ..., at most
// kUnits(U) of them, and keeps them in registers: every load of a row is issued before the first reduction (a loop
// that reloads the row for its second pass keeps one load in flight per lane), and the row is read from memory once.
constexpr int kThreads = 256;
// Units per thread: 16 scalars, 4 packs of 4 f32 or 3 packs of 8 16-bit values, so that C = kNormMaxC fits in a
// block of kThreads and a thread's registers (the backward holds d_out and x of its units as packed values, and
// f32 d_w / d_b sums for each element) stay under the 128 that two blocks per SM allow.
template <int U>
constexpr int kUnits = U == 1 ? 16 : (U == 4 ? 4 : 3);

// The group size for a row of `units` units: the smallest power of two >= 32 with units <= G * max units.
int group_size(int units, int max_units) {
  int g = 32;
  while (g * max_units < units) g *= 2;
  return g;
}

// Σa and Σb over the G threads of each group, returned to all of them. G == 32: warp shuffles only. G > 32: the
// warps of a group meet in shared memory (one __syncthreads pair, reached by the whole block: every thread of the
// block calls this the same number of times). red: kThreads / 32 float2.
__device__ __forceinline__ float2 group_sum2(float a, float b, int G, float2* red) {
  a = cuda::warp_sum(a);
  b = cuda::warp_sum(b);
  if (G == 32) return make_float2(a, b);
  const int warp = threadIdx.x >> 5, first = (threadIdx.x / G) * (G >> 5);
  __syncthreads();  // the previous row's reads of red are done
  if ((threadIdx.x & 31) == 0) red[warp] = make_float2(a, b);
  __syncthreads();
  float2 s = make_float2(0.0f, 0.0f);
  for (int w = first; w < first + (G >> 5); ++w) {  // fixed order: the same sums on every run
    s.x += red[w].x;
    s.y += red[w].y;
  }
  return s;
}

template <typename T, int U>
__device__ __forceinline__ void load_unit(const T* p, float (&v)[U]) {
  if constexpr (U == 1) {
    v[0] = to_f32(*p);
  } else {
    const cuda::Pack<T> q = cuda::load_pack(p);
#pragma unroll
    for (int i = 0; i < U; ++i) v[i] = to_f32(q.v[i]);
  }
}
template <typename T, int U>
__device__ __forceinline__ void store_unit(T* p, const float (&v)[U]) {
  if constexpr (U == 1) {
    *p = from_f32<T>(v[0]);
  } else {
    cuda::Pack<T> q;
#pragma unroll
    for (int i = 0; i < U; ++i) q.v[i] = from_f32<T>(v[i]);
    cuda::store_pack(p, q);
  }
}

// The residual add fused ahead of the norm forward (norm_residual_forward_cuda): the kernel reads residual and y
// in place of x and makes x = mid = residual + Drop(y + bias) in registers, in residual_forward's order of
// operations ((y + bias) f + residual in f32, rounded once), stores it, and normalises that.
template <typename T>
struct ResidualHead {
  T* mid = nullptr;
  const T* residual = nullptr;
  const T* y = nullptr;
  const T* bias = nullptr;  // or null
  float dropout = 0.0f, keep_scale = 1.0f;
  uint64_t seed = 0, stream = 0;
  const uint64_t* stream_base = nullptr;  // Context::philox_stream_base (CUDA graphs)
};

// x, out: (N, C); mean, rstd: (N) f32. One pass: Σ(x - x0) and Σ(x - x0)² together, shifted by the row's first
// element so that a large common offset does not cancel the variance away; then out from the registers.
// With the residual fused the kernel loads no row ahead: two rows of residual and y cost too many registers (2 blocks
// per SM, or spills at 3). One row of two inputs in flight per
// group, at 3 blocks per SM, keeps as many bytes in flight as the norm alone with its row ahead (packed rows; the
// scalar path would spill). The norm alone on packed rows is bounded to 4 blocks per SM (64 registers, no spill):
// unbounded the compiler leaves room for 3, too few to hide the memory latency.
// Launched through cuda::launch (a programmatic dependent under Context::pdl): it waits before any global access.
template <typename T, bool kLayerNorm, int U, bool kRes>
__global__ void __launch_bounds__(kThreads, U > 1 ? (kRes ? 3 : 4) : 1)
    norm_forward_row_groups(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                            const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, int N, int C,
                            int G, float eps, ResidualHead<T> res) {
  cuda::dependent_prologue();
  constexpr int K = kUnits<U>, KY = kRes ? K : 1;
  __shared__ float2 red[kThreads / 32];
  const int t = threadIdx.x % G, R = kThreads / G, units = C / U, stride = gridDim.x * R;
  if constexpr (kRes) {
    if (res.stream_base && res.dropout > 0.0f) res.stream += *res.stream_base;
    x = res.residual;
  }
  // The group's next row is loaded while this one is reduced and written: two rows in flight per group, as one row
  // leaves the kernel stalled on memory latency.
  auto load_row = [&](int row, cuda::RawUnit<T, U>(&dst)[K], cuda::RawUnit<T, U>(&dst_y)[KY], float& first) {
    if (row >= N) return;
    const T* xr = x + static_cast<size_t>(row) * C;
    first = to_f32(xr[0]);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int u = t + k * G;
      if (u < units) {
        dst[k] = cuda::load_raw<T, U>(xr + u * U);
        if constexpr (kRes) dst_y[k] = cuda::load_raw<T, U>(res.y + static_cast<size_t>(row) * C + u * U);
      }
    }
  };
  cuda::RawUnit<T, U> v[K], vy[KY];
  float x0 = 0.0f;
  __shared__ float first_mid[kThreads / 32];  // per group, G > 32: mid's first element, the LayerNorm shift
  if constexpr (!kRes) load_row(blockIdx.x * R + threadIdx.x / G, v, vy, x0);
  for (int row0 = blockIdx.x * R; row0 < N; row0 += stride) {  // uniform over the block
    const int row = row0 + threadIdx.x / G;
    const bool live = row < N;
    constexpr int KN = kRes ? 1 : K;  // the row ahead: none with the residual fused
    cuda::RawUnit<T, U> next[KN], next_y[1];
    float next_x0 = 0.0f;
    if constexpr (kRes) load_row(row, v, vy, x0);
    else load_row(row + stride, next, next_y, next_x0);
    if constexpr (kRes) {
      // mid = (y + bias) f + residual, stored; the norm below reads it from v.
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int u = t + k * G;
        if (live && u < units) {
          const size_t e0 = static_cast<size_t>(row) * C + u * U;
          float m[U], f[U];
#pragma unroll
          for (int i = 0; i < U; ++i) m[i] = to_f32(vy[k].v[i]);
          if (res.bias) {
            float bv[U];
            load_unit<T, U>(res.bias + u * U, bv);
#pragma unroll
            for (int i = 0; i < U; ++i) m[i] += bv[i];
          }
          if (res.dropout > 0.0f) {
            cuda::dropout_factors_w<U>(res.seed, res.stream, static_cast<uint64_t>(e0), res.dropout, res.keep_scale, f);
#pragma unroll
            for (int i = 0; i < U; ++i) m[i] *= f[i];
          }
#pragma unroll
          for (int i = 0; i < U; ++i) {
            m[i] += to_f32(v[k].v[i]);
            v[k].v[i] = from_f32<T>(m[i]);
          }
          cuda::store_raw<T, U>(res.mid + e0, v[k]);
        }
      }
      // The shift is mid's first element, as the unfused norm's is (x's): a constant row (C = 1) then has a
      // variance of exactly 0, where the residual's first element left rounding noise as large as eps.
      if constexpr (kLayerNorm) {
        float first = t == 0 ? to_f32(v[0].v[0]) : 0.0f;
        if (G == 32) {
          first = __shfl_sync(0xffffffffu, first, 0);  // the group is the warp; its thread 0 is lane 0
        } else {
          __syncthreads();  // the previous row's reads of first_mid are done
          if (t == 0) first_mid[threadIdx.x / G] = first;
          __syncthreads();
          first = first_mid[threadIdx.x / G];
        }
        x0 = first;
      }
    }
    float s = 0.0f, ss = 0.0f;
    const float shift = kLayerNorm && live ? x0 : 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int u = t + k * G;
      if (live && u < units) {
#pragma unroll
        for (int i = 0; i < U; ++i) {
          const float d = to_f32(v[k].v[i]) - shift;
          s += d;
          ss += d * d;
        }
      }
    }
    const float2 sums = group_sum2(s, ss, G, red);
    if (live) {
      float m = 0.0f, rs;
      if constexpr (kLayerNorm) {
        const float ms = sums.x / C;
        m = ms + shift;
        rs = rsqrtf(fmaxf(sums.y / C - ms * ms, 0.0f) + eps);
      } else {
        rs = rsqrtf(sums.y / C + eps);
      }
      if (t == 0) {
        if constexpr (kLayerNorm) mean[row] = m;
        rstd[row] = rs;
      }
      T* orow = out + static_cast<size_t>(row) * C;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int u = t + k * G;
        if (u < units) {
          float wv[U], o[U];
          load_unit<T, U>(w + u * U, wv);
          if (b) {
            float bv[U];
            load_unit<T, U>(b + u * U, bv);
#pragma unroll
            for (int i = 0; i < U; ++i) o[i] = (to_f32(v[k].v[i]) - m) * rs * wv[i] + bv[i];
          } else {
#pragma unroll
            for (int i = 0; i < U; ++i) o[i] = (to_f32(v[k].v[i]) - m) * rs * wv[i];
          }
          store_unit<T, U>(orow + u * U, o);
        }
      }
    }
    if constexpr (!kRes) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = next[k];
      x0 = next_x0;
    }
  }
}

// d_x += rstd * (g - mean(g) - xhat * mean(g * xhat))  (LayerNorm; RMSNorm drops mean(g)), g = d_out * w: one
// group reduction per row for the two sums. Each thread sums its columns' d_w (d_out * xhat) and d_b (d_out) over
// the rows it sees in f32, in shared memory that only it touches (acc: a row of 2 K U + 1 floats per thread, d_w's
// then d_b's; the odd length puts a warp's 32 accesses in 32 banks, and the offsets are compile-time constants, which
// a [K U][thread] layout's runtime stride G was not): in registers these sums would take a third of the kernel's
// registers and its occupancy with them. The registers this frees load d_x together with d_out and x: one memory
// round trip per row, not two. (3 blocks per SM would cap registers at 80: the bf16 instance then spills, as
// ptxas -v shows, so the bound stays at 2.)
// At the end the R groups of the block add theirs in group order, and the block writes one row of partial_w /
// partial_b (gridDim.x, C) f32, which norm_param_grad_reduce adds in a fixed order: deterministic, no atomics.
// With the residual backward fused in (kRes), each thread's row also holds the residual bias sums: 3 K U + 1.
template <int U, bool kRes = false>
constexpr size_t norm_backward_smem_bytes() {
  return ((kRes ? 3 : 2) * static_cast<size_t>(kUnits<U>) * U + 1) * kThreads * sizeof(float);
}

// The residual add's backward fused into the norm backward (norm_residual_backward_cuda): d_y = f ⊙ d_x (d_x as
// stored, f the add's dropout factors: residual_backward's Philox draws), and its column sums for the bias.
template <typename T>
struct ResidualTail {
  T* d_y = nullptr;
  float* partial = nullptr;  // (gridDim.x, C), or null without a bias
  float dropout = 0.0f, keep_scale = 1.0f;
  uint64_t seed = 0, stream = 0;
  const uint64_t* stream_base = nullptr;  // Context::philox_stream_base (CUDA graphs)
};

template <typename T, bool kLayerNorm, int U, bool kRes>
__global__ void __launch_bounds__(kThreads, 2)
    norm_backward_row_groups(T* __restrict__ d_x, float* __restrict__ partial_w, float* __restrict__ partial_b,
                             const T* __restrict__ d_out, const T* __restrict__ x, const T* __restrict__ w,
                             const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C, int G,
                             ResidualTail<T> res) {
  cuda::allow_dependent_launch();  // norm_param_grad_reduce may take the SMs as this kernel's blocks leave them
  constexpr int K = kUnits<U>, KU = K * U, S = (kRes ? 3 : 2) * KU + 1;
  __shared__ float2 red[kThreads / 32];
  extern __shared__ float acc[];  // norm_backward_smem_bytes<U, kRes>(): thread i's row at acc + i * S
  const int t = threadIdx.x % G, group = threadIdx.x / G, R = kThreads / G, units = C / U;
  float* acc_w = acc + threadIdx.x * S;  // element j of d_w: acc_w[j]; of d_b: acc_w[KU + j]; of the residual
  float* acc_b = acc_w + KU;             // bias (kRes): acc_w[2 KU + j]
  float* acc_r = acc_b + KU;
  if constexpr (kRes)
    if (res.stream_base && res.dropout > 0.0f) res.stream += *res.stream_base;
#pragma unroll
  for (int j = 0; j < KU; ++j) {
    acc_w[j] = acc_b[j] = 0.0f;
    if constexpr (kRes) acc_r[j] = 0.0f;
  }
  for (int row0 = blockIdx.x * R; row0 < N; row0 += gridDim.x * R) {  // uniform over the block
    const int row = row0 + group;
    const bool live = row < N;
    const size_t off = static_cast<size_t>(live ? row : 0) * C;
    const float m = kLayerNorm && live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
    cuda::RawUnit<T, U> dy[K], xv[K], dxv[K];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int u = t + k * G;
      if (live && u < units) {
        dy[k] = cuda::load_raw<T, U>(d_out + off + u * U);
        xv[k] = cuda::load_raw<T, U>(x + off + u * U);
        dxv[k] = cuda::load_raw<T, U>(d_x + off + u * U);
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int u = t + k * G;
      if (live && u < units) {
        float wv[U];
        load_unit<T, U>(w + u * U, wv);
#pragma unroll
        for (int i = 0; i < U; ++i) {
          // g = d_out * w rounded once (__fmul_rn is never contracted into an FMA), the same g as the d_x pass
          // below: with a contracted `dy * w - mean_g` there, a constant row (C = 1) left d_x off by rstd times
          // the product's rounding error instead of exactly unchanged.
          const float g = __fmul_rn(to_f32(dy[k].v[i]), wv[i]), xh = (to_f32(xv[k].v[i]) - m) * rs;
          sum_g += g;
          sum_gx += g * xh;
        }
      }
    }
    const float2 sums = group_sum2(sum_g, sum_gx, G, red);
    if (!live) continue;
    const float mean_g = kLayerNorm ? sums.x / C : 0.0f, mean_gx = sums.y / C;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int u = t + k * G;
      if (u < units) {
        float wv[U], dx[U];
        load_unit<T, U>(w + u * U, wv);
#pragma unroll
        for (int i = 0; i < U; ++i) {
          const float dyi = to_f32(dy[k].v[i]), xh = (to_f32(xv[k].v[i]) - m) * rs;
          dx[i] = to_f32(dxv[k].v[i]) + rs * (__fmul_rn(dyi, wv[i]) - mean_g - xh * mean_gx);
          acc_w[k * U + i] += dyi * xh;
          acc_b[k * U + i] += dyi;
        }
        store_unit<T, U>(d_x + off + u * U, dx);
        if constexpr (kRes) {
          // residual_backward on d_x as stored: d_y = f d_x, the bias sums over d_y as stored.
          float f[U];
          if (res.dropout > 0.0f) {
            cuda::dropout_factors_w<U>(res.seed, res.stream, static_cast<uint64_t>(off + u * U), res.dropout,
                                       res.keep_scale, f);
          } else {
#pragma unroll
            for (int i = 0; i < U; ++i) f[i] = 1.0f;
          }
#pragma unroll
          for (int i = 0; i < U; ++i) {
            dx[i] = cuda::round_to<T>(dx[i]) * f[i];
            acc_r[k * U + i] += cuda::round_to<T>(dx[i]);
          }
          store_unit<T, U>(res.d_y + off + u * U, dx);
        }
      }
    }
  }
  // The block's sums, column by column: groups 0 .. R-1 added in order.
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kThreads) {
    const int u = c / U, j = (u / G) * U + c % U, tc = u % G;
    float sw = 0.0f, sb = 0.0f, sr = 0.0f;
    for (int r = 0; r < R; ++r) {
      const float* a = acc + (r * G + tc) * S + j;
      sw += a[0];
      sb += a[KU];
      if constexpr (kRes) sr += a[2 * KU];
    }
    partial_w[static_cast<size_t>(blockIdx.x) * C + c] = sw;
    if (partial_b) partial_b[static_cast<size_t>(blockIdx.x) * C + c] = sb;
    if constexpr (kRes)
      if (res.partial) res.partial[static_cast<size_t>(blockIdx.x) * C + c] = sr;
  }
}

// d_w[c] += Σ_blocks partial_w[block, c], and d_b likewise (blockIdx.y: 0 for w, 1 for b). Block (32 columns,
// 32 lanes): lane y sums blocks y, y + 32, ... in order, all its loads issued at once, then a warp adds a column's
// 32 lane sums in a fixed tree: the same order on every run. (Fewer lanes leave each thread a longer chain of
// dependent loads.)
// Launched as a programmatic dependent of the row kernel (cuda::launch_dependent), so that its launch and ramp
// overlap the row kernel's last blocks. Summing in the row kernel's own last blocks instead measured slower
// (bench/results/2026-12-01-copy-size-and-pdl-h200.md).
// Up to three sums (d_w, d_b and the fused residual's bias), one per blockIdx.y.
constexpr int kReduceLanes = 32;
static_assert(kReduceLanes == 32, "a warp adds a column's lane sums: one lane sum per lane");
template <typename T>
struct ParamGradSums {
  T* out[3] = {};
  const float* partial[3] = {};
  int count = 0;
  void add(T* o, const float* p) {
    out[count] = o;
    partial[count++] = p;
  }
};
template <typename T>
__global__ void __launch_bounds__(32 * kReduceLanes) norm_param_grad_reduce(ParamGradSums<T> sums, int blocks, int C) {
  __shared__ float lanes[kReduceLanes][33];
  T* out = sums.out[blockIdx.y];
  // d_w / d_b as they were, loaded before the wait: the row kernel does not write them, and the kernels before it
  // have finished (it is an ordinary launch). Read after the sums they would be one more memory round trip in the
  // tail.
  const int col = blockIdx.x * 32 + threadIdx.y;
  const float before = threadIdx.x == 0 && col < C ? to_f32(out[col]) : 0.0f;
  cuda::wait_for_primary_grid();  // the row kernel's partials
  const float* partial = sums.partial[blockIdx.y];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  // kBatch loads in flight before the (ordered) adds: one L2 round trip for up to 32 kBatch blocks.
  constexpr int kBatch = 16;
  if (c < C)
    for (int i0 = threadIdx.y; i0 < blocks; i0 += kReduceLanes * kBatch) {
      float v[kBatch];
#pragma unroll
      for (int a = 0; a < kBatch; ++a) {
        const int i = i0 + a * kReduceLanes;
        v[a] = i < blocks ? partial[static_cast<size_t>(i) * C + c] : 0.0f;
      }
#pragma unroll
      for (int a = 0; a < kBatch; ++a) s += v[a];
    }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  // Warp y adds column y's 32 lane sums with a fixed shuffle tree (the odd row length keeps the reads in 32 banks).
  const float total = cuda::warp_sum(lanes[threadIdx.x][threadIdx.y]);
  if (threadIdx.x == 0 && col < C) out[col] = from_f32<T>(before + total);
}

// Packs when every row holds whole, aligned packs; else one element per unit.
template <typename T>
bool rows_vectorizable(int C, std::initializer_list<const void*> ptrs) {
  if (C % cuda::Pack<T>::kVec != 0) return false;
  for (const void* p : ptrs)
    if (p && !cuda::aligned16(p)) return false;
  return true;
}

// Blocks to launch: as many as fit on the GPU at once (the kernels loop over rows), never more than the rows need.
template <auto kKernel, size_t kSmem = 0>
int resident_blocks(int rows_per_block, int N, const Context& ctx) {
  return std::max(1, std::min(cuda::blocks_per_sm<kKernel, kThreads, kSmem>() * ctx.gpu().sm_count,
                              static_cast<int>(ceil_div(N, rows_per_block))));
}

// rp / mid / residual / y / bias: the fused residual add when mid is given (norm_residual_forward_cuda); x is
// then unused.
template <bool kLayerNorm>
void norm_forward_launch(const NormParams& p, DType dtype, void* out, float* mean, float* rstd, const void* x,
                         const void* w, const void* b, Context& ctx, const ResidualParams* rp = nullptr,
                         void* mid = nullptr, const void* residual = nullptr, const void* y = nullptr,
                         const void* bias = nullptr) {
  if (p.N == 0) return;
  TS_CHECK(p.C <= kNormMaxC, "norm forward: C ", p.C, " exceeds ", kNormMaxC);
  const char* what = mid ? "norm_residual_forward" : kLayerNorm ? "layernorm_forward" : "rmsnorm_forward";
  cuda::dispatch_float(dtype, what, [&](auto t) {
    using T = decltype(t);
    const auto launch = [&](auto unit, auto fused) {
      constexpr int U = decltype(unit)::value;
      constexpr bool kRes = decltype(fused)::value;
      const int G = group_size(p.C / U, kUnits<U>);
      constexpr auto kernel = norm_forward_row_groups<T, kLayerNorm, U, kRes>;
      const int blocks = resident_blocks<kernel>(kThreads / G, p.N, ctx);
      ResidualHead<T> res;
      if constexpr (kRes)
        res = {.mid = static_cast<T*>(mid),
               .residual = static_cast<const T*>(residual),
               .y = static_cast<const T*>(y),
               .bias = static_cast<const T*>(bias),
               .dropout = rp->dropout,
               .keep_scale = cuda::dropout_keep_scale(rp->dropout),
               .seed = rp->seed,
               .stream = rp->stream,
               .stream_base = ctx.philox_stream_base()};
      cuda::launch(kernel, dim3(blocks), dim3(kThreads), 0, ctx, static_cast<T*>(out), mean, rstd,
                   static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), p.N, p.C, G, p.eps,
                   res);
      TS_CHECK_LAUNCH();
    };
    const bool vec = rows_vectorizable<T>(p.C, {x, out, w, b, mid, residual, y, bias});
    constexpr int V = cuda::Pack<T>::kVec;
    if (mid) {
      if (vec) launch(std::integral_constant<int, V>{}, std::true_type{});
      else launch(std::integral_constant<int, 1>{}, std::true_type{});
    } else {
      if (vec) launch(std::integral_constant<int, V>{}, std::false_type{});
      else launch(std::integral_constant<int, 1>{}, std::false_type{});
    }
  });
}

// rp / d_y / d_bias: the fused residual backward when d_y is given (norm_residual_backward_cuda).
template <bool kLayerNorm>
void norm_backward_launch(const NormParams& p, DType dtype, void* d_x, void* d_w, void* d_b, const void* d_out,
                          const void* x, const void* w, const float* mean, const float* rstd, Context& ctx,
                          const ResidualParams* rp = nullptr, void* d_y = nullptr, void* d_bias = nullptr) {
  if (p.N == 0) return;
  TS_CHECK(p.C <= kNormMaxC, "norm backward: C ", p.C, " exceeds ", kNormMaxC);
  const char* what = d_y ? "norm_residual_backward" : kLayerNorm ? "layernorm_backward" : "rmsnorm_backward";
  cuda::dispatch_float(dtype, what, [&](auto t) {
    using T = decltype(t);
    const auto launch = [&](auto unit, auto fused) {
      constexpr int U = decltype(unit)::value;
      constexpr bool kRes = decltype(fused)::value;
      const int G = group_size(p.C / U, kUnits<U>);
      constexpr auto kernel = norm_backward_row_groups<T, kLayerNorm, U, kRes>;
      constexpr size_t smem = norm_backward_smem_bytes<U, kRes>();
      // Above 48 KB a kernel must ask for its dynamic shared memory, per device: asked at every launch (a host call
      // of about a microsecond; allowed inside a graph capture).
      TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      const int blocks = resident_blocks<kernel, smem>(kThreads / G, p.N, ctx);
      const size_t partial = static_cast<size_t>(blocks) * p.C;
      float* partial_w = static_cast<float*>(ctx.scratch(3 * partial * sizeof(float)));
      float* partial_b = d_b ? partial_w + partial : nullptr;
      ResidualTail<T> res;
      ParamGradSums<T> sums;
      sums.add(static_cast<T*>(d_w), partial_w);
      if (d_b) sums.add(static_cast<T*>(d_b), partial_b);
      if constexpr (kRes) {
        res = {.d_y = static_cast<T*>(d_y),
               .partial = d_bias ? partial_w + 2 * partial : nullptr,
               .dropout = rp->dropout,
               .keep_scale = cuda::dropout_keep_scale(rp->dropout),
               .seed = rp->seed,
               .stream = rp->stream,
               .stream_base = ctx.philox_stream_base()};
        if (d_bias) sums.add(static_cast<T*>(d_bias), res.partial);
      }
      kernel<<<blocks, kThreads, smem, ctx.stream()>>>(static_cast<T*>(d_x), partial_w, partial_b,
                                                       static_cast<const T*>(d_out), static_cast<const T*>(x),
                                                       static_cast<const T*>(w), mean, rstd, p.N, p.C, G, res);
      TS_CHECK_LAUNCH();
      cuda::launch_dependent(norm_param_grad_reduce<T>, dim3(ceil_div(p.C, 32), sums.count), dim3(32, kReduceLanes), 0,
                             ctx.stream(), sums, blocks, p.C);
      TS_CHECK_LAUNCH();
    };
    const bool vec = rows_vectorizable<T>(p.C, {d_x, d_out, x, w, d_y});
    constexpr int V = cuda::Pack<T>::kVec;
    if (d_y) {
      if (vec) launch(std::integral_constant<int, V>{}, std::true_type{});
      else launch(std::integral_constant<int, 1>{}, std::true_type{});
    } else {
      if (vec) launch(std::integral_constant<int, V>{}, std::false_type{});
      else launch(std::integral_constant<int, 1>{}, std::false_type{});
    }
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
void norm_residual_forward_cuda(const NormParams& p, DType dtype, const ResidualParams& rp, void* mid, void* out,
                                float* mean, float* rstd, const void* residual, const void* y, const void* bias,
                                const void* w, const void* b, Context& ctx) {
  TS_CHECK(mid && residual && y, "norm_residual_forward: mid, residual and y are required");
  if (mean) norm_forward_launch<true>(p, dtype, out, mean, rstd, nullptr, w, b, ctx, &rp, mid, residual, y, bias);
  else norm_forward_launch<false>(p, dtype, out, nullptr, rstd, nullptr, w, nullptr, ctx, &rp, mid, residual, y, bias);
}

void norm_residual_backward_cuda(const NormParams& p, DType dtype, void* d_x, void* d_w, void* d_b, const void* d_out,
                                 const void* x, const void* w, const float* mean, const float* rstd,
                                 const ResidualParams& rp, void* d_y, void* d_bias, Context& ctx) {
  TS_CHECK(d_y, "norm_residual_backward: d_y is required");
  if (mean) norm_backward_launch<true>(p, dtype, d_x, d_w, d_b, d_out, x, w, mean, rstd, ctx, &rp, d_y, d_bias);
  else norm_backward_launch<false>(p, dtype, d_x, d_w, nullptr, d_out, x, w, nullptr, rstd, ctx, &rp, d_y, d_bias);
}

}  // namespace tessera
