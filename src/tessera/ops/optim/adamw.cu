// AdamW over the flat buffers in one launch, with the global gradient norm (see adamw.h for the math and strategy).
#include <algorithm>
#include <cmath>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/optim/adamw.h"

namespace tessera {
namespace {

using cuda::from_f32;
using cuda::to_f32;

constexpr int kAdamThreads = 256;
constexpr int kAdamPer = 8;                         // consecutive elements per thread: 16 B of bf16, 32 B of f32
constexpr int kAdamTile = kAdamThreads * kAdamPer;  // elements per block per tile
static_assert(kAdamTile == kAdamWTileElems, "the tile index of AdamWSegmentTable is built for this tile");

using AdamWConsts = AdamWStepScalars;  // adamw.h

// The smallest s in [lo, hi) with segs[s].end > i, or hi. Segments are sorted and disjoint, so ends increase.
__device__ __forceinline__ int segment_ending_after(const AdamWSegmentRecord* segs, int lo, int hi, int64_t i) {
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (segs[mid].end > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Where the thread's kAdamPer elements [i0, i0 + kAdamPer) lie. `in` / `dec`: bit e set when element i0 + e is in
// a segment / in a segment with decay. whole: all of them lie in one segment (then one decay for all).
// s_tile is the first segment ending after the tile's start: most threads find their elements there.
struct ElementGroup {
  bool whole;
  unsigned in, dec;
};
__device__ __forceinline__ ElementGroup locate_group(const AdamWSegmentRecord* segs, int nseg, int s_tile, int64_t i0) {
  int s = s_tile;
  if (segs[s].end <= i0) s = segment_ending_after(segs, s + 1, nseg, i0);  // s < nseg: i0 < the last segment's end
  const AdamWSegmentRecord r = segs[s];
  if (r.begin <= i0 && i0 + kAdamPer <= r.end) return {true, 0xffu, r.decay ? 0xffu : 0u};
  // Straddling a boundary or a gap: element by element. Segments are not empty, so s advances at most
  // kAdamPer times in all.
  ElementGroup g{false, 0u, 0u};
#pragma unroll
  for (int e = 0; e < kAdamPer; ++e) {
    const int64_t i = i0 + e;
    while (s < nseg && segs[s].end <= i) ++s;
    if (s < nseg && segs[s].begin <= i) {
      g.in |= 1u << e;
      if (segs[s].decay) g.dec |= 1u << e;
    }
  }
  return g;
}

template <typename T>
__device__ __forceinline__ void load_group(const T* p, float (&x)[kAdamPer]) {
  constexpr int kVec = cuda::Pack<T>::kVec;
#pragma unroll
  for (int k = 0; k < kAdamPer / kVec; ++k) {
    const cuda::Pack<T> pk = cuda::load_pack(p + k * kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[k * kVec + i] = to_f32(pk.v[i]);
  }
}
template <typename T>
__device__ __forceinline__ void store_group(T* p, const float (&x)[kAdamPer]) {
  constexpr int kVec = cuda::Pack<T>::kVec;
#pragma unroll
  for (int k = 0; k < kAdamPer / kVec; ++k) {
    cuda::Pack<T> pk;
#pragma unroll
    for (int i = 0; i < kVec; ++i) pk.v[i] = from_f32<T>(x[k * kVec + i]);
    cuda::store_pack(p + k * kVec, pk);
  }
}

// Fixed-order f64 block sum (warp shuffles, then warp 0 over the warps), returned to every thread.
__device__ __forceinline__ double block_sum_f64(double x, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  x = lane < warps ? smem[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// grads: (>= end) T; segs: nseg records. Grid P (fixed per device), block b strides over the tiles b, b + P, ...
// and sums g² of the in-segment elements in f32 registers; partials[b] = the block's sum (fixed-order reduction).
template <typename T>
__global__ void __launch_bounds__(kAdamThreads)
    adamw_grad_sq_partials_tiles(float* __restrict__ partials, const T* __restrict__ grads,
                                 const AdamWSegmentRecord* __restrict__ segs, int nseg,
                                 const int32_t* __restrict__ tile_seg, int64_t end, bool vec) {
  float acc = 0.0f;
  const int64_t tiles = (end + kAdamTile - 1) / kAdamTile;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t i0 = t * kAdamTile + threadIdx.x * kAdamPer;
    if (i0 >= end) continue;
    // The loads go out before the segment lookup (they do not depend on it; the buffers hold >= end elements).
    const bool full = vec && i0 + kAdamPer <= end;
    float g[kAdamPer];
    if (full) load_group(grads + i0, g);
    const ElementGroup grp = locate_group(segs, nseg, tile_seg[t], i0);
    if (full) {
#pragma unroll
      for (int e = 0; e < kAdamPer; ++e)
        if (grp.in >> e & 1u) acc += g[e] * g[e];  // a select, so a gap's garbage (even NaN) never enters
    } else {
#pragma unroll
      for (int e = 0; e < kAdamPer; ++e)
        if (grp.in >> e & 1u) {
          const float g = to_f32(grads[i0 + e]);
          acc += g * g;
        }
    }
  }
  __shared__ float smem[32];
  acc = cuda::block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// params, grads: (>= end) T; m, v: (>= end) f32; master: (>= end) f32, the same pointer as params when the f32
// params are the master (write_params false), or null when 16-bit params are their own master (LightSeq's mode:
// w is read from the params into f32 registers and round(w) written back, write_params true).
// Grid-stride over kAdamTile tiles. Prologue (when partials is given): norm = sqrt(Σ partials) / S summed in f64 in
// the same order by every block, clip = min(1, max_norm / (norm + 1e-6)); block 0 stores the norm.
// With skip_nonfinite and a norm that is not finite, every block returns there: all of them see the same bits, so
// either every element is updated or none is.
// Per element, in f32 registers (torch.optim.AdamW):
//   g *= clip / S;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²;  w = w * keep (decay segments)
//   w -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps);   master = w, params = round(w)
template <typename T>
__global__ void __launch_bounds__(kAdamThreads)
    adamw_update_segment_tiles(T* params, const T* __restrict__ grads, float* master, float* __restrict__ m,
                               float* __restrict__ v, const AdamWSegmentRecord* __restrict__ segs, int nseg,
                               const int32_t* __restrict__ tile_seg, int64_t end, const float* __restrict__ partials,
                               int n_partials, float* __restrict__ grad_norm, AdamWConsts c,
                               const AdamWConsts* __restrict__ c_device, bool write_params, bool vec) {
  if (c_device) c = *c_device;  // a CUDA graph's replay: this step's scalars, copied in before it
  // The unscale and the clip in one factor (exact when S is a power of 2: the factor only moves the exponent).
  double coef = 1.0 / c.grad_scale;
  if (partials) {
    __shared__ double smem[32];
    double acc = 0.0;
    for (int k = threadIdx.x; k < n_partials; k += blockDim.x) acc += partials[k];
    const double norm = sqrt(block_sum_f64(acc, smem)) / c.grad_scale;
    if (blockIdx.x == 0 && threadIdx.x == 0 && grad_norm) *grad_norm = static_cast<float>(norm);
    if (c.skip_nonfinite && !isfinite(norm)) return;  // the same norm in every block: the whole step is skipped
    if (c.max_norm > 0.0f) {
      const double clip = c.max_norm / (norm + 1e-6);
      if (clip < 1.0) coef *= clip;
    }
  }
  const float factor = static_cast<float>(coef);
  const int64_t tiles = (end + kAdamTile - 1) / kAdamTile;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t i0 = t * kAdamTile + threadIdx.x * kAdamPer;
    if (i0 >= end) continue;
    // The loads go out before the segment lookup (they do not depend on it; the buffers hold >= end elements).
    // A group straddling a gap loads the gap too, but stores only its in-segment elements.
    const bool full = vec && i0 + kAdamPer <= end;
    float g[kAdamPer], w[kAdamPer], mm[kAdamPer], vv[kAdamPer];
    if (full) {
      load_group(grads + i0, g);
      if (master) load_group(master + i0, w);
      else load_group(params + i0, w);
      load_group(m + i0, mm);
      load_group(v + i0, vv);
    }
    const ElementGroup grp = locate_group(segs, nseg, tile_seg[t], i0);
    const bool fast = full && grp.whole;
    if (!full) {
#pragma unroll
      for (int e = 0; e < kAdamPer; ++e) {
        g[e] = w[e] = mm[e] = vv[e] = 0.0f;
        if (grp.in >> e & 1u) {
          g[e] = to_f32(grads[i0 + e]);
          w[e] = master ? master[i0 + e] : to_f32(params[i0 + e]);
          mm[e] = m[i0 + e];
          vv[e] = v[i0 + e];
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kAdamPer; ++e) {
      const float ge = g[e] * factor;
      mm[e] = c.beta1 * mm[e] + c.one_minus_beta1 * ge;
      vv[e] = c.beta2 * vv[e] + c.one_minus_beta2 * ge * ge;
      float we = (grp.dec >> e & 1u) ? w[e] * c.keep : w[e];
      we -= c.step_size * mm[e] / (sqrtf(vv[e]) * c.inv_sqrt_bc2 + c.eps);
      w[e] = we;
    }
    if (fast) {
      if (master) store_group(master + i0, w);
      store_group(m + i0, mm);
      store_group(v + i0, vv);
      if (write_params) store_group(params + i0, w);
    } else {
#pragma unroll
      for (int e = 0; e < kAdamPer; ++e)
        if (grp.in >> e & 1u) {
          if (master) master[i0 + e] = w[e];
          m[i0 + e] = mm[e];
          v[i0 + e] = vv[e];
          if (write_params) params[i0 + e] = from_f32<T>(w[e]);
        }
    }
  }
}

// 8 blocks of 256 threads per SM: full occupancy, enough loads in flight to stream the gradients.
int norm_partials_grid(const Context& ctx) { return 8 * ctx.gpu().sm_count; }

}  // namespace

void adamw_step_cuda(const AdamWParams& p, const AdamWSegmentTable& table, DType dtype, void* params, const void* grads,
                     float* master, float* m, float* v, float* grad_norm, Context& ctx,
                     const AdamWStepScalars* device_scalars) {
  const int nseg = table.count();
  if (nseg == 0) {  // nothing to update; the norm of no gradients is 0
    if (grad_norm) TS_CHECK_CUDA(cudaMemsetAsync(grad_norm, 0, sizeof(float), ctx.stream()));
    return;
  }
  const int64_t end = static_cast<int64_t>(table.end());
  const int64_t tiles = (end + kAdamTile - 1) / kAdamTile;
  // The f32 weights the kernel reads and writes: the master, the f32 params themselves, or none (16-bit params
  // without a master are read and written in their own dtype).
  float* w = master ? master : dtype == DType::F32 ? static_cast<float*>(params) : nullptr;
  const bool vec = cuda::aligned16(params) && cuda::aligned16(grads) && (!w || cuda::aligned16(w)) &&
                   cuda::aligned16(m) && cuda::aligned16(v);
  const AdamWConsts c = adamw_step_scalars(p);
  // Skipping needs the norm in the same launch that updates, so the partials are always computed then.
  const bool want_norm = grad_norm || p.max_grad_norm > 0.0f || p.skip_nonfinite;
  float* partials = nullptr;
  int n_partials = 0;
  if (want_norm) {
    n_partials = static_cast<int>(std::min<int64_t>(tiles, norm_partials_grid(ctx)));
    partials = static_cast<float*>(ctx.scratch(adamw_scratch_bytes(ctx)));
  }
  // 8 blocks of 256 threads fill an SM; more blocks would only repeat the prologue.
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, 8 * static_cast<int64_t>(ctx.gpu().sm_count)));
  cuda::dispatch_float(dtype, "adamw_step", [&](auto t) {
    using T = decltype(t);
    if (want_norm) {
      adamw_grad_sq_partials_tiles<T>
          <<<n_partials, kAdamThreads, 0, ctx.stream()>>>(partials, static_cast<const T*>(grads),
                                                          table.device_records(), nseg, table.device_tile_segments(),
                                                          end, vec);
      TS_CHECK_LAUNCH();
    }
    adamw_update_segment_tiles<T>
        <<<grid, kAdamThreads, 0, ctx.stream()>>>(static_cast<T*>(params), static_cast<const T*>(grads), w, m, v,
                                                  table.device_records(), nseg, table.device_tile_segments(), end,
                                                  partials, n_partials, grad_norm, c, device_scalars,
                                                  /*write_params=*/w != params, vec);
    TS_CHECK_LAUNCH();
  });
}

}  // namespace tessera
