// Fused causal attention (tiled, online softmax, the T x T matrix never stored) and RoPE kernels.
// See attention.h for the math. bf16 / f16 calls with Dh % 8 == 0, Dh <= 128 and 16-byte-aligned buffers go to
// the tensor-core FlashAttention-2 kernels (flash.h; on sm_90a the wgmma + TMA kernels of flash_hopper.h where
// they are eligible); everything else (f32, odd head dims, unaligned views) runs
// the f32-FMA tiled kernels below, which are also the f32 path.
//
// Tiling shared by the three attention kernels: a block of 256 threads (a 16 x 16 grid, tx = thread % 16,
// ty = thread / 16) owns a 64-row tile. A 64 x 64 score tile is spread as a 4 x 4 micro-tile per thread with
// rows ty + 16i and columns tx + 16j, so a score row lives in the 16 lanes of one half-warp and its max / sum
// are half-warp shuffles. Accumulators over the head dim use rows ty + 16i and columns tx + 16k (k < kDp / 16).
// Q, K, V and dO tiles sit in shared memory in the storage dtype with an odd number of 4-byte words per row, so
// the column reads K[tx + 16j][d] hit 16 different banks. Head dims are padded to kDp in {32, 64, 96, 128}
// (zero-filled); dot products run over the real Dh only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_dropout.h"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_hopper.h"

namespace tessera {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

constexpr int kTile = 64;             // query rows and key rows per tile
constexpr int kThreads = 256;         // 16 x 16
constexpr int kPStride = kTile + 16;  // f32 score tile row: rows ty and ty + 1 land 16 banks apart

template <typename T, int kDp>
constexpr int smem_stride() {
  return kDp + 4 / static_cast<int>(sizeof(T));
}
template <typename T, int kDp>
constexpr size_t tile_bytes() {
  return static_cast<size_t>(kTile) * smem_stride<T, kDp>() * sizeof(T);
}
constexpr size_t kScoreBytes = static_cast<size_t>(kTile) * kPStride * sizeof(float);

template <typename T, int kDp>
constexpr size_t forward_smem() {
  return 3 * tile_bytes<T, kDp>() + kScoreBytes;
}
template <typename T, int kDp>
constexpr size_t backward_dq_smem() {
  return 4 * tile_bytes<T, kDp>() + kScoreBytes;
}
template <typename T, int kDp>
constexpr size_t backward_dkdv_smem() {
  return 4 * tile_bytes<T, kDp>() + 2 * kScoreBytes + 2 * kTile * sizeof(float);
}

// dst: (64, smem_stride) in shared memory <- rows [0, rows) of a (64, Dh) tile at src with row stride `stride`;
// rows >= rows and columns >= Dh are zero-filled.
template <typename T, int kDp>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, const T* __restrict__ src, long stride, int rows,
                                          int Dh) {
  constexpr int kStride = smem_stride<T, kDp>();
  for (int idx = threadIdx.x; idx < kTile * kDp; idx += kThreads) {
    const int r = idx / kDp, d = idx - r * kDp;
    dst[r * kStride + d] = (r < rows && d < Dh) ? src[r * stride + d] : from_f32<T>(0.0f);
  }
}

// Max / sum over the 16 lanes of a half-warp (xor offsets below 16 stay inside the half). The butterfly gives
// every lane the same bits.
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A (B, T, heads, Dh) view in device memory (attention.h's AttentionView), the head dim contiguous.
template <typename T>
struct Heads {
  T* p;
  long sb, st, sh;
  __device__ __forceinline__ T* at(int b, int t, int h) const { return p + b * sb + t * st + h * sh; }
};

// The sizes and masks of a call (attention.h): query head h reads KV head h / group; key j is visible to query i
// of sequence b when j < key_end(b) and, causal, j <= i + q_offset.
struct TiledShape {
  int Tq, Tk, H, group, Dh, q_offset;
  bool causal;
  const int32_t* key_lens;  // (B) or null
  __device__ __forceinline__ int key_end(int b) const { return key_lens ? min(max(key_lens[b], 0), Tk) : Tk; }
  // Key tiles [0, n) that queries [q0, q0 + 64) can see.
  __device__ __forceinline__ int key_tiles(int q0, int kend) const {
    int end = kend;
    if (causal) end = min(end, min(q0 + kTile, Tq) + q_offset);
    return end <= 0 ? 0 : (end + kTile - 1) / kTile;
  }
  // The first query tile that can see a key of [k0, k0 + 64).
  __device__ __forceinline__ int first_query_tile(int k0) const { return causal ? max(0, k0 - q_offset) / kTile : 0; }
};

__device__ __forceinline__ bool score_valid(int qi, int kj, int kend, const TiledShape& g) {
  return qi < g.Tq && kj < kend && (!g.causal || kj <= qi + g.q_offset);
}

// Z of attention.h for query qi, key kj of head bh: 1 without dropout, else 1 / (1 - p) or 0 as drawn (one
// Philox block per score: the f32 path is the correct one, not the fast one). The draw is out of line, so that its
// registers do not raise the kernels' allocation, and behind the test, so that no call is made without dropout.
__device__ __noinline__ float dropout_z_drawn(const AttentionDropoutDraw& d, uint64_t bh, const TiledShape& g, int qi,
                                              int kj) {
  return attention_dropout_keep(d, bh, g.Tq, g.Tk, qi, kj) ? d.scale : 0.0f;
}
__device__ __forceinline__ float dropout_z(const AttentionDropoutDraw& d, uint64_t bh, const TiledShape& g, int qi,
                                           int kj) {
  return d.threshold ? dropout_z_drawn(d, bh, g, qi, kj) : 1.0f;
}

// out, q: (B, Tq, H, Dh) views; k, v: (B, Tk, Hkv, Dh); lse: (B, H, Tq) f32.
// Grid (ceil(Tq/64), H, B). For each key tile that some query of the tile sees (TiledShape::key_tiles):
//   S = Q Kᵀ * scale (masked: -inf),  m' = max(m, rowmax S),  P = exp(S - m'),  l = l e^(m - m') + rowsum P,
//   acc = acc e^(m - m') + (P ∘ Z) V.   At the end out = acc / l and lse = m + log l (Z: dropout, attention.h);
//   a row that saw no key (l = 0) gets out = 0 and lse = +inf.
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tiled_online(Heads<T> out, float* __restrict__ lse, Heads<const T> Q, Heads<const T> K,
                                   Heads<const T> V, TiledShape g, float scale, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kStride = smem_stride<T, kDp>(), kCols = kDp / 16;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kTile * kStride;
  T* sV = sK + kTile * kStride;
  float* sP = reinterpret_cast<float*>(sV + kTile * kStride);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z, hk = h / g.group, Dh = g.Dh;
  const int kend = g.key_end(b);
  const uint64_t bh = static_cast<uint64_t>(b) * g.H + h;
  load_tile<T, kDp>(sQ, Q.at(b, q0, h), Q.st, min(kTile, g.Tq - q0), Dh);

  float m[4], l[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[i][k] = 0.0f;
  }
  const int n_kt = g.key_tiles(q0, kend);
  for (int kt = 0; kt < n_kt; ++kt) {
    const int k0 = kt * kTile, k_rows = min(kTile, g.Tk - k0);
    __syncthreads();  // the previous tile's reads of sK, sV, sP are done
    load_tile<T, kDp>(sK, K.at(b, k0, hk), K.st, k_rows, Dh);
    load_tile<T, kDp>(sV, V.at(b, k0, hk), V.st, k_rows, Dh);
    __syncthreads();
    float s[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < Dh; ++d) {
      float qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = to_f32(sQ[(ty + 16 * i) * kStride + d]);
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = to_f32(sK[(tx + 16 * j) * kStride + d]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = fmaf(qv[i], kv[j], s[i][j]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qi = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = score_valid(qi, k0 + tx + 16 * j, kend, g) ? s[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], half_warp_max(mx));
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing valid yet stays at 0
      const float alpha = expf(m[i] - shift);
      float ps = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float pij = expf(s[i][j] - shift);
        const float z = dropout_z(drop, bh, g, qi, k0 + tx + 16 * j);
        sP[(ty + 16 * i) * kPStride + tx + 16 * j] = pij * z;
        ps += pij;
      }
      l[i] = l[i] * alpha + half_warp_sum(ps);
      m[i] = m_new;
#pragma unroll
      for (int k = 0; k < kCols; ++k) acc[i][k] *= alpha;
    }
    __syncthreads();
#pragma unroll 2
    for (int c = 0; c < k_rows; ++c) {
      float pv[4], vv[kCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = sP[(ty + 16 * i) * kPStride + c];
#pragma unroll
      for (int k = 0; k < kCols; ++k) vv[k] = to_f32(sV[c * kStride + tx + 16 * k]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int k = 0; k < kCols; ++k) acc[i][k] = fmaf(pv[i], vv[k], acc[i][k]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qi = q0 + ty + 16 * i;
    if (qi >= g.Tq) continue;
    const bool seen = l[i] > 0.0f;
    const float inv = seen ? 1.0f / l[i] : 0.0f;  // the kept P already carry 1 / (1 - p) (dropout_z)
    T* o = out.at(b, qi, h);
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = tx + 16 * k;
      if (d < Dh) o[d] = from_f32<T>(acc[i][k] * inv);
    }
    if (tx == 0) lse[bh * g.Tq + qi] = seen ? m[i] + logf(l[i]) : INFINITY;
  }
}

// D: (B, H, Tq) f32, D = rowsum(d_out ∘ out) per head; d_out, out: (B, Tq, H, Dh) views. One warp per
// (b, t, h), w = (b Tq + t) H + h.
template <typename T>
__global__ void attention_backward_row_dot(float* __restrict__ D, Heads<const T> d_out, Heads<const T> out, int Tq,
                                           int H, int Dh, long n_rows) {
  const long w = (static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= n_rows) return;  // the whole warp leaves together
  const long n = w / H;
  const int h = static_cast<int>(w % H), b = static_cast<int>(n / Tq), t = static_cast<int>(n % Tq);
  const T* dO = d_out.at(b, t, h);
  const T* o = out.at(b, t, h);
  float s = 0.0f;
  for (int d = lane; d < Dh; d += 32) s = fmaf(to_f32(dO[d]), to_f32(o[d]), s);
  s = cuda::warp_sum(s);
  if (lane == 0) D[(static_cast<long>(b) * H + h) * Tq + t] = s;
}

// dQ for one query tile. Grid (ceil(Tq/64), H, B). For each key tile its queries see:
//   P = exp(S - lse), dP = Z ∘ (dO Vᵀ), dS = P ∘ (dP - D), dQ += dS K;  at the end dq = dQ * scale.
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_tiled(Heads<T> dq, Heads<const T> d_out, Heads<const T> Q, Heads<const T> K, Heads<const T> V,
                                const float* __restrict__ lse, const float* __restrict__ D, TiledShape g, float scale,
                                AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kStride = smem_stride<T, kDp>(), kCols = kDp / 16;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kTile * kStride;
  T* sK = sdO + kTile * kStride;
  T* sV = sK + kTile * kStride;
  float* sdS = reinterpret_cast<float*>(sV + kTile * kStride);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z, hk = h / g.group, Dh = g.Dh;
  const int kend = g.key_end(b);
  const long bh = static_cast<long>(b) * g.H + h;
  const int q_rows = min(kTile, g.Tq - q0);
  load_tile<T, kDp>(sQ, Q.at(b, q0, h), Q.st, q_rows, Dh);
  load_tile<T, kDp>(sdO, d_out.at(b, q0, h), d_out.st, q_rows, Dh);
  float row_lse[4], row_D[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qi = q0 + ty + 16 * i;
    row_lse[i] = qi < g.Tq ? lse[bh * g.Tq + qi] : 0.0f;
    row_D[i] = qi < g.Tq ? D[bh * g.Tq + qi] : 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0.0f;
  }
  const int n_kt = g.key_tiles(q0, kend);
  for (int kt = 0; kt < n_kt; ++kt) {
    const int k0 = kt * kTile, k_rows = min(kTile, g.Tk - k0);
    __syncthreads();
    load_tile<T, kDp>(sK, K.at(b, k0, hk), K.st, k_rows, Dh);
    load_tile<T, kDp>(sV, V.at(b, k0, hk), V.st, k_rows, Dh);
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};
#pragma unroll 2
    for (int d = 0; d < Dh; ++d) {
      float qv[4], ov[4], kv[4], vv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qv[i] = to_f32(sQ[(ty + 16 * i) * kStride + d]);
        ov[i] = to_f32(sdO[(ty + 16 * i) * kStride + d]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kv[j] = to_f32(sK[(tx + 16 * j) * kStride + d]);
        vv[j] = to_f32(sV[(tx + 16 * j) * kStride + d]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s[i][j] = fmaf(qv[i], kv[j], s[i][j]);
          dp[i][j] = fmaf(ov[i], vv[j], dp[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qi = q0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int kj = k0 + tx + 16 * j;
        const float pij = score_valid(qi, kj, kend, g) ? expf(s[i][j] * scale - row_lse[i]) : 0.0f;
        const float z = dropout_z(drop, static_cast<uint64_t>(bh), g, qi, kj);
        sdS[(ty + 16 * i) * kPStride + tx + 16 * j] = pij * (z * dp[i][j] - row_D[i]);
      }
    }
    __syncthreads();
#pragma unroll 2
    for (int c = 0; c < k_rows; ++c) {
      float dsv[4], kv[kCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) dsv[i] = sdS[(ty + 16 * i) * kPStride + c];
#pragma unroll
      for (int k = 0; k < kCols; ++k) kv[k] = to_f32(sK[c * kStride + tx + 16 * k]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int k = 0; k < kCols; ++k) acc[i][k] = fmaf(dsv[i], kv[k], acc[i][k]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qi = q0 + ty + 16 * i;
    if (qi >= g.Tq) continue;
    T* dqi = dq.at(b, qi, h);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = tx + 16 * c;
      if (d < Dh) dqi[d] = from_f32<T>(acc[i][c] * scale);
    }
  }
}

// dK and dV for one key tile of KV head hk. Grid (ceil(Tk/64), Hkv, B). For each query head h of hk's group in
// order, and each query tile that sees a key of the tile (the transposed view: rows of the micro-tile are keys
// ty + 16i, columns queries tx + 16j):
//   Pᵀ = exp(Sᵀ - lse), dPᵀ = Zᵀ ∘ (V dOᵀ), dSᵀ = Pᵀ ∘ (dPᵀ - D),  dV += (P ∘ Z)ᵀ dO,  dK += dSᵀ Q;
// at the end dk = dK * scale and dv = dV (every row written: a masked key's are 0).
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_tiled(Heads<T> dk, Heads<T> dv, Heads<const T> d_out, Heads<const T> Q, Heads<const T> K,
                                  Heads<const T> V, const float* __restrict__ lse, const float* __restrict__ D,
                                  TiledShape g, float scale, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kStride = smem_stride<T, kDp>(), kCols = kDp / 16;
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kTile * kStride;
  T* sQ = sV + kTile * kStride;
  T* sdO = sQ + kTile * kStride;
  float* sPT = reinterpret_cast<float*>(sdO + kTile * kStride);
  float* sdST = sPT + kTile * kPStride;
  float* sLse = sdST + kTile * kPStride;
  float* sD = sLse + kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int k0 = blockIdx.x * kTile, hk = blockIdx.y, b = blockIdx.z, Dh = g.Dh;
  const int kend = g.key_end(b);
  const int k_rows = min(kTile, g.Tk - k0);
  load_tile<T, kDp>(sK, K.at(b, k0, hk), K.st, k_rows, Dh);
  load_tile<T, kDp>(sV, V.at(b, k0, hk), V.st, k_rows, Dh);
  float acc_k[4][kCols], acc_v[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc_k[i][k] = acc_v[i][k] = 0.0f;
  const int n_qt = k0 < kend ? (g.Tq + kTile - 1) / kTile : 0;  // a tile of masked keys sees no query
  // One loop over (query head of the group, query tile), heads in order: dK / dV sum them deterministically.
  for (int h = hk * g.group; h < (hk + 1) * g.group; ++h)
    for (int qt = g.first_query_tile(k0); qt < n_qt; ++qt) {
      const long bh = static_cast<long>(b) * g.H + h;
      const int q0 = qt * kTile, q_rows = min(kTile, g.Tq - q0);
      __syncthreads();
      load_tile<T, kDp>(sQ, Q.at(b, q0, h), Q.st, q_rows, Dh);
      load_tile<T, kDp>(sdO, d_out.at(b, q0, h), d_out.st, q_rows, Dh);
      if (threadIdx.x < kTile) {
        const int qi = q0 + threadIdx.x;
        sLse[threadIdx.x] = qi < g.Tq ? lse[bh * g.Tq + qi] : 0.0f;
        sD[threadIdx.x] = qi < g.Tq ? D[bh * g.Tq + qi] : 0.0f;
      }
      __syncthreads();
      float s[4][4] = {}, dp[4][4] = {};
#pragma unroll 2
      for (int d = 0; d < Dh; ++d) {
        float kv[4], vv[4], qv[4], ov[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          kv[i] = to_f32(sK[(ty + 16 * i) * kStride + d]);
          vv[i] = to_f32(sV[(ty + 16 * i) * kStride + d]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          qv[j] = to_f32(sQ[(tx + 16 * j) * kStride + d]);
          ov[j] = to_f32(sdO[(tx + 16 * j) * kStride + d]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            s[i][j] = fmaf(kv[i], qv[j], s[i][j]);
            dp[i][j] = fmaf(vv[i], ov[j], dp[i][j]);
          }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kj = k0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = tx + 16 * j;
          const float pij = score_valid(q0 + r, kj, kend, g) ? expf(s[i][j] * scale - sLse[r]) : 0.0f;
          const float z = dropout_z(drop, static_cast<uint64_t>(bh), g, q0 + r, kj);
          sPT[(ty + 16 * i) * kPStride + r] = pij * z;
          sdST[(ty + 16 * i) * kPStride + r] = pij * (z * dp[i][j] - sD[r]);
        }
      }
      __syncthreads();
#pragma unroll 2
      for (int r = 0; r < q_rows; ++r) {
        float pt[4], dst[4], ov[kCols], qv[kCols];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pt[i] = sPT[(ty + 16 * i) * kPStride + r];
          dst[i] = sdST[(ty + 16 * i) * kPStride + r];
        }
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
          ov[k] = to_f32(sdO[r * kStride + tx + 16 * k]);
          qv[k] = to_f32(sQ[r * kStride + tx + 16 * k]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int k = 0; k < kCols; ++k) {
            acc_v[i][k] = fmaf(pt[i], ov[k], acc_v[i][k]);
            acc_k[i][k] = fmaf(dst[i], qv[k], acc_k[i][k]);
          }
      }
    }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int kj = k0 + ty + 16 * i;
    if (kj >= g.Tk) continue;
    T* dk_row = dk.at(b, kj, hk);
    T* dv_row = dv.at(b, kj, hk);
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = tx + 16 * k;
      if (d < Dh) {
        dk_row[d] = from_f32<T>(acc_k[i][k] * scale);
        dv_row[d] = from_f32<T>(acc_v[i][k]);
      }
    }
  }
}

// RoPE's table: {cos a, sin a} at [pos][i] for a = pos * theta^(-2i/Dh), i < Dh/2, in f64 as the reference
// computes them, rounded to f32.
__global__ void rope_table_fill(float2* __restrict__ table, long n, int half, int Dh, double theta) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const long pos = idx / half;
  const int i = static_cast<int>(idx % half);
  double sn, cs;
  sincos(static_cast<double>(pos) * pow(theta, -2.0 * i / Dh), &sn, &cs);
  table[idx] = make_float2(static_cast<float>(cs), static_cast<float>(sn));
}

// qkv: (B*T, W) with W = row_heads Dh, rotated in place; the q and k heads of a row are its first rot_heads heads
// of Dh columns (H + Hkv of H + 2 Hkv).
// sign = -1: the transposed rotation (the backward). One thread per (row n, 16-byte pack j of the first half's
// columns, group of kHeads of the 2H heads): the pack's cos / sin are loaded once for its heads, and each head's
// two packs (columns 8j.. and Dh/2 + 8j.. for bf16) are loaded before any is stored.
template <typename T, int kHeads>
__global__ void rope_rotate_packs(T* __restrict__ qkv, long n_rows, int seq_len, int pos_offset, int rot_heads,
                                  int row_heads, int Dh, const float2* __restrict__ table, float sign) {
  constexpr int kV = cuda::Pack<T>::kVec;
  const int half = Dh / 2, packs = half / kV, groups = (rot_heads + kHeads - 1) / kHeads;
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int j = static_cast<int>(idx % packs);
  const long rest = idx / packs;
  const int group = static_cast<int>(rest % groups);
  const long n = rest / groups;
  if (n >= n_rows) return;
  const float2* cs = table + static_cast<long>(pos_offset + n % seq_len) * half + j * kV;
  float c[kV], s[kV];
#pragma unroll
  for (int e = 0; e < kV; e += 2) {
    const float4 t = *reinterpret_cast<const float4*>(cs + e);
    c[e] = t.x, s[e] = sign * t.y, c[e + 1] = t.z, s[e + 1] = sign * t.w;
  }
  T* row = qkv + n * row_heads * Dh + j * kV;
  cuda::Pack<T> x1[kHeads], x2[kHeads];
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int hh = group * kHeads + k;
    if (hh < rot_heads) x1[k] = cuda::load_pack(row + hh * Dh), x2[k] = cuda::load_pack(row + hh * Dh + half);
  }
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int hh = group * kHeads + k;
    if (hh >= rot_heads) continue;
    cuda::Pack<T> y1, y2;
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      const float a = to_f32(x1[k].v[e]), b = to_f32(x2[k].v[e]);
      y1.v[e] = from_f32<T>(a * c[e] - b * s[e]);
      y2.v[e] = from_f32<T>(b * c[e] + a * s[e]);
    }
    cuda::store_pack(row + hh * Dh, y1);
    cuda::store_pack(row + hh * Dh + half, y2);
  }
}

// The same for any Dh and alignment: one thread per (row n, pair i < Dh/2), over every q and k head of the row.
template <typename T>
__global__ void rope_rotate_pairs(T* __restrict__ qkv, long n_rows, int seq_len, int pos_offset, int rot_heads,
                                  int row_heads, int Dh, const float2* __restrict__ table, float sign) {
  const int half = Dh / 2;
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_rows * half) return;
  const long n = idx / half;
  const int i = static_cast<int>(idx % half);
  const float2 t = table[static_cast<long>(pos_offset + n % seq_len) * half + i];
  const float c = t.x, s = sign * t.y;
  T* row = qkv + n * row_heads * Dh;
  for (int hh = 0; hh < rot_heads; ++hh) {  // q then k heads
    T* x = row + hh * Dh;
    const float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
    x[i] = from_f32<T>(x1 * c - x2 * s);
    x[i + half] = from_f32<T>(x2 * c + x1 * s);
  }
}

// The general call's RoPE over a (B, T, heads, Dh) view: one thread per (b, t, pair i < Dh/2), over its heads.
template <typename T>
__global__ void rope_rotate_view(Heads<T> x, int B, int T_, int heads, int pos_offset, int Dh,
                                 const float2* __restrict__ table, float sign) {
  const int half = Dh / 2;
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long>(B) * T_ * half) return;
  const int i = static_cast<int>(idx % half);
  const long n = idx / half;
  const int b = static_cast<int>(n / T_), t = static_cast<int>(n % T_);
  const float2 cs = table[static_cast<long>(pos_offset + t) * half + i];
  const float c = cs.x, s = sign * cs.y;
  for (int h = 0; h < heads; ++h) {
    T* e = x.at(b, t, h);
    const float x1 = to_f32(e[i]), x2 = to_f32(e[i + half]);
    e[i] = from_f32<T>(x1 * c - x2 * s);
    e[i + half] = from_f32<T>(x2 * c + x1 * s);
  }
}

// Calls f(std::integral_constant<int, kDp>{}) for the narrowest compiled head width kDp >= Dh.
template <typename F>
void dispatch_head_pad(int Dh, F&& f) {
  if (Dh <= 32) f(std::integral_constant<int, 32>{});
  else if (Dh <= 64) f(std::integral_constant<int, 64>{});
  else if (Dh <= 96) f(std::integral_constant<int, 96>{});
  else if (Dh <= kAttentionMaxDh) f(std::integral_constant<int, 128>{});
  else TS_THROW("attention: the CUDA kernels take head dims up to ", kAttentionMaxDh, ", got ", Dh);
}

// Launches a tiled attention kernel on the (ceil(rows/64), heads, B) grid with `smem` bytes of dynamic shared
// memory.
template <typename Kernel, typename... Args>
void launch_tiled(const char* op, Kernel kernel, size_t smem, int rows, int heads, int B, Context& ctx, Args... args) {
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, op, ": needs ", smem, " bytes of shared memory per block, the ",
           "device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK(heads <= 65535 && B <= 65535, op, ": H and B must be at most 65535");
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(ceil_div(rows, kTile), heads, B);
  kernel<<<grid, kThreads, smem, ctx.stream()>>>(args...);
  TS_CHECK_LAUNCH();
}

float attention_scale(int Dh) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh))); }

// The Context's RoPE table for (theta, Dh) over at least n_pos positions (a power of two of 1024 or more, so that
// the lengths of one run share a table).
const float2* rope_table(float theta, int Dh, long n_pos, Context& ctx) {
  TS_CHECK(n_pos <= kRopeMaxPositions, "rope: positions up to ", kRopeMaxPositions, ", asked for ", n_pos);
  long rows = 1024;
  while (rows < n_pos) rows *= 2;
  const int half = Dh / 2;
  const long n = rows * half;
  uint32_t bits = 0;
  std::memcpy(&bits, &theta, sizeof bits);
  const std::string key = "rope theta=" + std::to_string(bits) + " Dh=" + std::to_string(Dh) +
                          " positions=" + std::to_string(rows);
  return static_cast<const float2*>(ctx.device_table(key, static_cast<size_t>(n) * sizeof(float2), [&](void* at) {
    if (n == 0) return;
    rope_table_fill<<<ceil_div(n, 256), 256, 0, ctx.stream()>>>(static_cast<float2*>(at), n, half, Dh,
                                                                static_cast<double>(theta));
    TS_CHECK_LAUNCH();
  }));
}

void rope_launch(const RopeParams& p, DType dtype, void* qkv, float sign, Context& ctx) {
  const long n_rows = static_cast<long>(p.B) * p.T;
  const int half = p.Dh / 2;
  if (n_rows * half == 0) return;
  const float2* table = rope_table(p.theta, p.Dh, static_cast<long>(p.pos_offset) + p.T, ctx);
  cuda::dispatch_float(dtype, sign > 0 ? "rope_forward" : "rope_backward", [&](auto t) {
    using T = decltype(t);
    constexpr int kV = cuda::Pack<T>::kVec, kHeads = 4;
    const int Hkv = p.n_kv_heads > 0 ? p.n_kv_heads : p.H, rot_heads = p.H + Hkv, row_heads = p.H + 2 * Hkv;
    if (half % kV == 0 && cuda::aligned16(qkv)) {
      const long threads = n_rows * (half / kV) * ((rot_heads + kHeads - 1) / kHeads);
      rope_rotate_packs<T, kHeads><<<ceil_div(threads, 256), 256, 0, ctx.stream()>>>(static_cast<T*>(qkv), n_rows, p.T,
                                                                                     p.pos_offset, rot_heads, row_heads,
                                                                                     p.Dh, table, sign);
    } else {
      rope_rotate_pairs<T><<<ceil_div(n_rows * half, 256), 256, 0, ctx.stream()>>>(static_cast<T*>(qkv), n_rows, p.T,
                                                                                   p.pos_offset, rot_heads, row_heads,
                                                                                   p.Dh, table, sign);
    }
    TS_CHECK_LAUNCH();
  });
}

template <typename T, typename V>
Heads<T> heads_of(const AttentionView<V>& v) {
  return {static_cast<T*>(v.data), static_cast<long>(v.sb), static_cast<long>(v.st), static_cast<long>(v.sh)};
}

TiledShape tiled_shape(const AttentionParams& p) {
  return {.Tq = attention_tq(p),
          .Tk = attention_tk(p),
          .H = p.H,
          .group = p.H / attention_kv_heads(p),
          .Dh = p.Dh,
          .q_offset = p.q_offset,
          .causal = p.causal,
          .key_lens = p.key_lens.defined() ? p.key_lens.as<int32_t>() : nullptr};
}

// The packed call's q, k and v inside qkv (B*T, W), and a (B*T, C) buffer as (B, T, H, Dh).
struct PackedViews {
  AttentionView<const void> q, k, v;
};
PackedViews packed_views(const AttentionParams& p, DType dtype, const void* qkv) {
  const int64_t W = attention_qkv_width(p), C = static_cast<int64_t>(p.H) * p.Dh;
  const int64_t kv = static_cast<int64_t>(attention_kv_heads(p)) * p.Dh;
  const char* base = static_cast<const char*>(qkv);
  const size_t es = dtype_size(dtype);
  return {.q = {qkv, p.T * W, W, p.Dh},
          .k = {base + C * es, p.T * W, W, p.Dh},
          .v = {base + (C + kv) * es, p.T * W, W, p.Dh}};
}
template <typename V>
AttentionView<V> rows_view(const AttentionParams& p, V* x) {
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh;
  return {x, p.T * C, C, p.Dh};
}
AttentionView<void> mutable_view(const AttentionView<const void>& v) {
  return {const_cast<void*>(v.data), v.sb, v.st, v.sh};
}

// The tiled f32-FMA kernels, which take every case (attention.h's views, GQA, masks, dropout).
void tiled_forward(const AttentionParams& p, DType dtype, AttentionView<void> out, float* lse,
                   AttentionView<const void> q, AttentionView<const void> k, AttentionView<const void> v,
                   Context& ctx) {
  constexpr const char* op = "attention_forward";
  const TiledShape g = tiled_shape(p);
  if (static_cast<long>(p.B) * g.Tq == 0) return;
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  cuda::dispatch_float(dtype, op, [&](auto t) {
    using T = decltype(t);
    dispatch_head_pad(p.Dh, [&](auto pad) {
      constexpr int kDp = decltype(pad)::value;
      launch_tiled(op, attention_forward_tiled_online<T, kDp>, forward_smem<T, kDp>(), g.Tq, p.H, p.B, ctx,
                   heads_of<T>(out), lse, heads_of<const T>(q), heads_of<const T>(k), heads_of<const T>(v), g,
                   attention_scale(p.Dh), drop);
    });
  });
}

// D = rowsum(d_out ∘ out) into `D` (B, H, Tq) f32.
void row_dot(const AttentionParams& p, DType dtype, float* D, AttentionView<const void> d_out,
             AttentionView<const void> out, Context& ctx) {
  const long n_rows = static_cast<long>(p.B) * attention_tq(p) * p.H;
  if (n_rows == 0) return;
  cuda::dispatch_float(dtype, "attention_backward", [&](auto t) {
    using T = decltype(t);
    attention_backward_row_dot<T>
        <<<ceil_div(n_rows * 32, 256), 256, 0, ctx.stream()>>>(D, heads_of<const T>(d_out), heads_of<const T>(out),
                                                               attention_tq(p), p.H, p.Dh, n_rows);
    TS_CHECK_LAUNCH();
  });
}

// dq, dk, dv from D (computed before, in `D`).
void tiled_backward(const AttentionParams& p, DType dtype, AttentionView<void> dq, AttentionView<void> dk,
                    AttentionView<void> dv, AttentionView<const void> d_out, AttentionView<const void> q,
                    AttentionView<const void> k, AttentionView<const void> v, const float* lse, const float* D,
                    Context& ctx) {
  constexpr const char* op = "attention_backward";
  const TiledShape g = tiled_shape(p);
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  cuda::dispatch_float(dtype, op, [&](auto t) {
    using T = decltype(t);
    dispatch_head_pad(p.Dh, [&](auto pad) {
      constexpr int kDp = decltype(pad)::value;
      const float scale = attention_scale(p.Dh);
      if (g.Tq > 0) {
        launch_tiled(op, attention_backward_dq_tiled<T, kDp>, backward_dq_smem<T, kDp>(), g.Tq, p.H, p.B, ctx,
                     heads_of<T>(dq), heads_of<const T>(d_out), heads_of<const T>(q), heads_of<const T>(k),
                     heads_of<const T>(v), lse, D, g, scale, drop);
      }
      if (g.Tk > 0) {
        launch_tiled(op, attention_backward_dkdv_tiled<T, kDp>, backward_dkdv_smem<T, kDp>(), g.Tk,
                     attention_kv_heads(p), p.B, ctx, heads_of<T>(dk), heads_of<T>(dv), heads_of<const T>(d_out),
                     heads_of<const T>(q), heads_of<const T>(k), heads_of<const T>(v), lse, D, g, scale, drop);
      }
    });
  });
}

// The general call's forward and backward (D computed before): the flash kernels where they take the views
// (flash_general_eligible; on the Hopper kernels where flash_general_forward_uses_hopper /
// flash_general_backward_uses_hopper and TMA takes the views, else mma.sync), else the tiled kernels.
void general_forward(const AttentionParams& p, DType dtype, AttentionView<void> out, float* lse,
                     AttentionView<const void> q, AttentionView<const void> k, AttentionView<const void> v,
                     Context& ctx) {
  if (flash_general_eligible(p, dtype, {q, k, v, {out.data, out.sb, out.st, out.sh}})) {
    const FlashGeneralArgs a{.q = q, .k = k, .v = v, .out = out, .lse = lse};
    if (flash_general_forward_uses_hopper(p, dtype, ctx) && flash_general_forward_hopper_cuda(p, dtype, a, ctx)) return;
    flash_general_forward_cuda(p, dtype, a, ctx);
  } else {
    tiled_forward(p, dtype, out, lse, q, k, v, ctx);
  }
}
void general_backward(const AttentionParams& p, DType dtype, AttentionView<void> dq, AttentionView<void> dk,
                      AttentionView<void> dv, AttentionView<const void> d_out, AttentionView<const void> q,
                      AttentionView<const void> k, AttentionView<const void> v, const float* lse, const float* D,
                      Context& ctx) {
  auto c = [](const AttentionView<void>& x) { return AttentionView<const void>{x.data, x.sb, x.st, x.sh}; };
  if (flash_general_eligible(p, dtype, {q, k, v, d_out, c(dq), c(dk), c(dv)})) {
    const FlashGeneralArgs a{
        .q = q, .k = k, .v = v, .d_out = d_out, .lse_in = lse, .D = D, .dq = dq, .dk = dk, .dv = dv};
    if (flash_general_backward_uses_hopper(p, dtype, ctx) && flash_general_backward_hopper_cuda(p, dtype, a, ctx))
      return;
    flash_general_backward_cuda(p, dtype, a, ctx);
  } else {
    tiled_backward(p, dtype, dq, dk, dv, d_out, q, k, v, lse, D, ctx);
  }
}

}  // namespace

void attention_forward_cuda(const AttentionParams& p, DType dtype, void* out, float* lse, const void* qkv,
                            Context& ctx) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_forward_cuda takes q and k rotated (attention_forward ",
           "applies RoPE)");
  if (static_cast<long>(p.B) * p.T == 0) return;
  if (flash_attention_eligible(p, dtype, {qkv, out})) {
    const FlashAttentionArgs a{.qkv = qkv, .out = out, .lse = lse};
    if (flash_forward_uses_hopper(p, dtype, ctx)) flash_attention_forward_hopper_cuda(p, dtype, a, ctx);
    else flash_attention_forward_cuda(p, dtype, a, ctx);
    return;
  }
  const PackedViews in = packed_views(p, dtype, qkv);
  general_forward(p, dtype, rows_view(p, out), lse, in.q, in.k, in.v, ctx);
}

void attention_backward_cuda(const AttentionParams& p, DType dtype, void* d_qkv, const void* d_out, const void* qkv,
                             const void* out, const float* lse, Context& ctx) {
  const long n_rows = static_cast<long>(p.B) * p.T * p.H;
  if (n_rows == 0) return;
  float* D = static_cast<float*>(ctx.scratch(static_cast<size_t>(n_rows) * sizeof(float)));
  const bool rope = p.rope_theta > 0.0f;
  const bool flash = flash_attention_eligible(p, dtype, {qkv, d_out, d_qkv});
  if (!flash) {
    const PackedViews in = packed_views(p, dtype, qkv), d = packed_views(p, dtype, d_qkv);
    row_dot(p, dtype, D, rows_view(p, d_out), rows_view(p, out), ctx);
    general_backward(p, dtype, mutable_view(d.q), mutable_view(d.k), mutable_view(d.v), rows_view(p, d_out), in.q, in.k,
                     in.v, lse, D, ctx);
    if (rope) rope_launch(attention_rope(p), dtype, d_qkv, -1.0f, ctx);
    return;
  }
  const bool hopper = flash_backward_uses_hopper(p, dtype, ctx);
  // The Hopper dQ pass computes D itself from the dO tile it holds, when it can read out in 16-byte vectors:
  // that saves the attention_backward_row_dot launch and its separate read of dO.
  const bool d_in_dq = hopper && cuda::aligned16(out);
  if (!d_in_dq) row_dot(p, dtype, D, rows_view(p, d_out), rows_view(p, out), ctx);
  // RoPE's backward: the flash passes rotate dQ and dK back in registers as they store them where Dh is the
  // chosen kernels' compiled width (Dh / 2 then a multiple of 8, the pairs in one lane); elsewhere (a head run
  // zero-padded) a pass over d_qkv follows.
  const int width = hopper ? flash_hopper_head_pad(p.Dh) : flash_attention_head_pad(p.Dh);
  const bool rope_in_flash = rope && width == p.Dh && p.Dh % 16 == 0;
  const void* rope_cs = rope_in_flash ? rope_table(p.rope_theta, p.Dh, long{p.rope_pos_offset} + p.T, ctx) : nullptr;
  if (hopper) {
    const FlashAttentionArgs a{.qkv = qkv,
                               .d_out = d_out,
                               .lse_in = lse,
                               .out_in = d_in_dq ? out : nullptr,
                               .D_out = D,
                               .d_qkv = d_qkv,
                               .rope_cs = rope_cs,
                               .rope_pos_offset = p.rope_pos_offset};
    flash_attention_backward_hopper_cuda(p, dtype, a, ctx);
  } else {
    const FlashAttentionArgs a{.qkv = qkv,
                               .d_out = d_out,
                               .lse_in = lse,
                               .D = D,
                               .d_qkv = d_qkv,
                               .rope_cs = rope_cs,
                               .rope_pos_offset = p.rope_pos_offset};
    flash_attention_backward_dq_cuda(p, dtype, a, ctx);
    flash_attention_backward_dkdv_cuda(p, dtype, a, ctx);
  }
  if (rope && !rope_in_flash) rope_launch(attention_rope(p), dtype, d_qkv, -1.0f, ctx);
}

void attention_forward_general_cuda(const AttentionParams& p, DType dtype, AttentionView<void> out, float* lse,
                                    AttentionView<const void> q, AttentionView<const void> k,
                                    AttentionView<const void> v, Context& ctx) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_forward_general_cuda takes q and k rotated");
  general_forward(p, dtype, out, lse, q, k, v, ctx);
}

void attention_backward_general_cuda(const AttentionParams& p, DType dtype, AttentionView<void> dq,
                                     AttentionView<void> dk, AttentionView<void> dv, AttentionView<const void> d_out,
                                     AttentionView<const void> q, AttentionView<const void> k,
                                     AttentionView<const void> v, AttentionView<const void> out, const float* lse,
                                     Context& ctx) {
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_backward_general_cuda returns the gradients of rotated q, k");
  const long n_rows = static_cast<long>(p.B) * attention_tq(p) * p.H;
  float* D = static_cast<float*>(ctx.scratch(static_cast<size_t>(std::max(n_rows, 1L)) * sizeof(float)));
  row_dot(p, dtype, D, d_out, out, ctx);
  general_backward(p, dtype, dq, dk, dv, d_out, q, k, v, lse, D, ctx);
}

void rope_view_cuda(const RopeParams& p, int heads, DType dtype, AttentionView<void> x, float sign, Context& ctx) {
  const long n = static_cast<long>(p.B) * p.T * (p.Dh / 2);
  if (n == 0) return;
  const float2* table = rope_table(p.theta, p.Dh, static_cast<long>(p.pos_offset) + p.T, ctx);
  cuda::dispatch_float(dtype, "rope", [&](auto t) {
    using T = decltype(t);
    rope_rotate_view<T>
        <<<ceil_div(n, 256), 256, 0, ctx.stream()>>>(heads_of<T>(x), p.B, p.T, heads, p.pos_offset, p.Dh, table, sign);
    TS_CHECK_LAUNCH();
  });
}

const char* attention_cuda_kernel_general(const AttentionParams& p, DType dtype, const Context& ctx) {
  // The entries' own predicates, on views that pass their alignment rules.
  if (!flash_general_eligible(p, dtype, {})) return "tiled-fma";
  const bool fwd = flash_general_forward_uses_hopper(p, dtype, ctx),
             bwd = flash_general_backward_uses_hopper(p, dtype, ctx);
  if (fwd && bwd) return "flash-hopper";
  if (fwd) return "flash-hopper forward, flash-mma backward";
  if (bwd) return "flash-mma forward, flash-hopper backward";
  return "flash-mma";
}

const char* attention_cuda_kernel(const AttentionParams& p, DType dtype, const Context& ctx) {
  if (!attention_is_plain(p)) return attention_cuda_kernel_general(p, dtype, ctx);
  if (!(dtype == DType::BF16 || dtype == DType::F16) || flash_attention_head_pad(p.Dh) == 0) return "tiled-fma";
  // Forward and backward each take the Hopper kernels or mma.sync (TESSERA_FLASH_PATH, see flash_hopper.h).
  const bool fwd = flash_forward_uses_hopper(p, dtype, ctx), bwd = flash_backward_uses_hopper(p, dtype, ctx);
  if (fwd && bwd) return "flash-hopper";
  if (fwd) return "flash-hopper forward, flash-mma backward";
  if (bwd) return "flash-mma forward, flash-hopper backward";
  return "flash-mma";
}

void rope_forward_cuda(const RopeParams& p, DType dtype, void* qkv, Context& ctx) {
  rope_launch(p, dtype, qkv, 1.0f, ctx);
}
void rope_backward_cuda(const RopeParams& p, DType dtype, void* d_qkv, Context& ctx) {
  rope_launch(p, dtype, d_qkv, -1.0f, ctx);
}

}  // namespace tessera
