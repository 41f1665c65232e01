// Fused causal attention (tiled, online softmax, the T x T matrix never stored) and RoPE kernels.
// See attention.h for the math. bf16 / f16 calls with Dh % 8 == 0, Dh <= 128 and 16-byte-aligned buffers go to
// the tensor-core FlashAttention-2 kernels (flash.h; on sm_90a the forward runs the wgmma + TMA kernel of
// flash_hopper.h where it is eligible); everything else (f32, odd head dims, unaligned views) runs
// the f32-FMA tiled kernels below, which are also the f32 path.
//
// Tiling shared by the three attention kernels: a block of 256 threads (a 16 x 16 grid, tx = thread % 16,
// ty = thread / 16) owns a 64-row tile. A 64 x 64 score tile is spread as a 4 x 4 micro-tile per thread with
// rows ty + 16i and columns tx + 16j, so a score row lives in the 16 lanes of one half-warp and its max / sum
// are half-warp shuffles. Accumulators over the head dim use rows ty + 16i and columns tx + 16k (k < kDp / 16).
// Q, K, V and dO tiles sit in shared memory in the storage dtype with an odd number of 4-byte words per row, so
// the column reads K[tx + 16j][d] hit 16 different banks. Head dims are padded to kDp in {32, 64, 96, 128}
// (zero-filled); dot products run over the real Dh only.
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

constexpr int kTile = 64;      // query rows and key rows per tile
constexpr int kThreads = 256;  // 16 x 16
constexpr int kPStride = kTile + 16;  // f32 score tile row: rows ty and ty + 1 land 16 banks apart

template <typename T, int kDp>
constexpr int smem_stride() { return kDp + 4 / static_cast<int>(sizeof(T)); }
template <typename T, int kDp>
constexpr size_t tile_bytes() { return static_cast<size_t>(kTile) * smem_stride<T, kDp>() * sizeof(T); }
constexpr size_t kScoreBytes = static_cast<size_t>(kTile) * kPStride * sizeof(float);

template <typename T, int kDp>
constexpr size_t forward_smem() { return 3 * tile_bytes<T, kDp>() + kScoreBytes; }
template <typename T, int kDp>
constexpr size_t backward_dq_smem() { return 4 * tile_bytes<T, kDp>() + kScoreBytes; }
template <typename T, int kDp>
constexpr size_t backward_dkdv_smem() { return 4 * tile_bytes<T, kDp>() + 2 * kScoreBytes + 2 * kTile * sizeof(float); }

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

__device__ __forceinline__ bool score_valid(int qi, int kj, int seq_len, bool causal) {
  return qi < seq_len && kj < seq_len && (!causal || kj <= qi);
}

// Z of attention.h for query qi, key kj of head bh: 1 without dropout, else 1 / (1 - p) or 0 as drawn (one
// Philox block per score: the f32 path is the correct one, not the fast one). The draw is out of line, so that its
// registers do not raise the kernels' allocation, and behind the test, so that no call is made without dropout.
__device__ __noinline__ float dropout_z_drawn(const AttentionDropoutDraw& d, uint64_t bh, int seq_len, int qi,
                                              int kj) {
  return attention_dropout_keep(d, bh, seq_len, qi, kj) ? d.scale : 0.0f;
}
__device__ __forceinline__ float dropout_z(const AttentionDropoutDraw& d, uint64_t bh, int seq_len, int qi, int kj) {
  return d.threshold ? dropout_z_drawn(d, bh, seq_len, qi, kj) : 1.0f;
}

// out: (B*T, C); lse: (B, H, T) f32; qkv: (B*T, 3C) with q, k, v of head h at columns h*Dh, C + h*Dh, 2C + h*Dh.
// Grid (ceil(T/64), H, B). For each key tile (only those at or below the diagonal when causal):
//   S = Q Kᵀ * scale (masked: -inf),  m' = max(m, rowmax S),  P = exp(S - m'),  l = l e^(m - m') + rowsum P,
//   acc = acc e^(m - m') + (P ∘ Z) V.   At the end out = acc / l and lse = m + log l (Z: dropout, attention.h).
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tiled_online(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv,
                                   int seq_len, int H, int Dh, bool causal, float scale, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kStride = smem_stride<T, kDp>(), kCols = kDp / 16;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kTile * kStride;
  T* sV = sK + kTile * kStride;
  float* sP = reinterpret_cast<float*>(sV + kTile * kStride);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int C = H * Dh;
  const long row3 = 3L * C;
  const T* base = qkv + static_cast<long>(b) * seq_len * row3 + static_cast<long>(h) * Dh;
  load_tile<T, kDp>(sQ, base + q0 * row3, row3, min(kTile, seq_len - q0), Dh);

  float m[4], l[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[i][k] = 0.0f;
  }
  const int n_kt = causal ? blockIdx.x + 1 : (seq_len + kTile - 1) / kTile;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int k0 = kt * kTile, k_rows = min(kTile, seq_len - k0);
    __syncthreads();  // the previous tile's reads of sK, sV, sP are done
    load_tile<T, kDp>(sK, base + C + k0 * row3, row3, k_rows, Dh);
    load_tile<T, kDp>(sV, base + 2 * C + k0 * row3, row3, k_rows, Dh);
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
        s[i][j] = score_valid(qi, k0 + tx + 16 * j, seq_len, causal) ? s[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], half_warp_max(mx));
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing valid yet stays at 0
      const float alpha = expf(m[i] - shift);
      float ps = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float pij = expf(s[i][j] - shift);
        const float z = dropout_z(drop, static_cast<uint64_t>(b) * H + h, seq_len, qi, k0 + tx + 16 * j);
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
    if (qi >= seq_len) continue;
    const float inv = 1.0f / l[i];  // the kept P already carry 1 / (1 - p) (dropout_z)
    T* o = out + (static_cast<long>(b) * seq_len + qi) * C + static_cast<long>(h) * Dh;
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = tx + 16 * k;
      if (d < Dh) o[d] = from_f32<T>(acc[i][k] * inv);
    }
    if (tx == 0) lse[(static_cast<long>(b) * H + h) * seq_len + qi] = m[i] + logf(l[i]);
  }
}

// D: (B, H, T) f32, D = rowsum(d_out ∘ out) per head; d_out, out: (B*T, C). One warp per (row, head).
template <typename T>
__global__ void attention_backward_row_dot(float* __restrict__ D, const T* __restrict__ d_out,
                                           const T* __restrict__ out, int seq_len, int H, int Dh, long n_rows) {
  const long w = (static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= n_rows) return;  // the whole warp leaves together
  const long off = w * Dh;  // (n*H + h)*Dh = n*C + h*Dh
  float s = 0.0f;
  for (int d = lane; d < Dh; d += 32) s = fmaf(to_f32(d_out[off + d]), to_f32(out[off + d]), s);
  s = cuda::warp_sum(s);
  if (lane == 0) {
    const long n = w / H;
    const int h = static_cast<int>(w % H);
    const long b = n / seq_len, t = n % seq_len;
    D[(b * H + h) * seq_len + t] = s;
  }
}

// dQ for one query tile. Grid (ceil(T/64), H, B). For each key tile at or below the diagonal:
//   P = exp(S - lse), dP = Z ∘ (dO Vᵀ), dS = P ∘ (dP - D), dQ += dS K;  at the end d_qkv[q part] = dQ * scale.
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_tiled(T* __restrict__ d_qkv, const T* __restrict__ d_out, const T* __restrict__ qkv,
                                const float* __restrict__ lse, const float* __restrict__ D, int seq_len, int H,
                                int Dh, bool causal, float scale, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kStride = smem_stride<T, kDp>(), kCols = kDp / 16;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kTile * kStride;
  T* sK = sdO + kTile * kStride;
  T* sV = sK + kTile * kStride;
  float* sdS = reinterpret_cast<float*>(sV + kTile * kStride);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int C = H * Dh;
  const long row3 = 3L * C;
  const long bh = static_cast<long>(b) * H + h;
  const T* base = qkv + static_cast<long>(b) * seq_len * row3 + static_cast<long>(h) * Dh;
  const int q_rows = min(kTile, seq_len - q0);
  load_tile<T, kDp>(sQ, base + q0 * row3, row3, q_rows, Dh);
  load_tile<T, kDp>(sdO, d_out + (static_cast<long>(b) * seq_len + q0) * C + static_cast<long>(h) * Dh, C, q_rows,
                    Dh);
  float row_lse[4], row_D[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qi = q0 + ty + 16 * i;
    row_lse[i] = qi < seq_len ? lse[bh * seq_len + qi] : 0.0f;
    row_D[i] = qi < seq_len ? D[bh * seq_len + qi] : 0.0f;
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[i][k] = 0.0f;
  }
  const int n_kt = causal ? blockIdx.x + 1 : (seq_len + kTile - 1) / kTile;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int k0 = kt * kTile, k_rows = min(kTile, seq_len - k0);
    __syncthreads();
    load_tile<T, kDp>(sK, base + C + k0 * row3, row3, k_rows, Dh);
    load_tile<T, kDp>(sV, base + 2 * C + k0 * row3, row3, k_rows, Dh);
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
        const float pij = score_valid(qi, kj, seq_len, causal) ? expf(s[i][j] * scale - row_lse[i]) : 0.0f;
        const float z = dropout_z(drop, static_cast<uint64_t>(bh), seq_len, qi, kj);
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
    if (qi >= seq_len) continue;
    T* dq = d_qkv + (static_cast<long>(b) * seq_len + qi) * row3 + static_cast<long>(h) * Dh;
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = tx + 16 * k;
      if (d < Dh) dq[d] = from_f32<T>(acc[i][k] * scale);
    }
  }
}

// dK and dV for one key tile. Grid (ceil(T/64), H, B). For each query tile at or below the diagonal (the
// transposed view: rows of the micro-tile are keys ty + 16i, columns queries tx + 16j):
//   Pᵀ = exp(Sᵀ - lse), dPᵀ = Zᵀ ∘ (V dOᵀ), dSᵀ = Pᵀ ∘ (dPᵀ - D),  dV += (P ∘ Z)ᵀ dO,  dK += dSᵀ Q;
// at the end d_qkv[k part] = dK * scale and d_qkv[v part] = dV.
template <typename T, int kDp>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_tiled(T* __restrict__ d_qkv, const T* __restrict__ d_out, const T* __restrict__ qkv,
                                  const float* __restrict__ lse, const float* __restrict__ D, int seq_len, int H,
                                  int Dh, bool causal, float scale, AttentionDropoutDraw drop) {
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
  const int k0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int C = H * Dh;
  const long row3 = 3L * C;
  const long bh = static_cast<long>(b) * H + h;
  const T* base = qkv + static_cast<long>(b) * seq_len * row3 + static_cast<long>(h) * Dh;
  const T* dO_base = d_out + static_cast<long>(b) * seq_len * C + static_cast<long>(h) * Dh;
  const int k_rows = min(kTile, seq_len - k0);
  load_tile<T, kDp>(sK, base + C + k0 * row3, row3, k_rows, Dh);
  load_tile<T, kDp>(sV, base + 2 * C + k0 * row3, row3, k_rows, Dh);
  float acc_k[4][kCols], acc_v[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc_k[i][k] = acc_v[i][k] = 0.0f;
  const int n_qt = (seq_len + kTile - 1) / kTile;
  for (int qt = causal ? blockIdx.x : 0; qt < n_qt; ++qt) {
    const int q0 = qt * kTile, q_rows = min(kTile, seq_len - q0);
    __syncthreads();
    load_tile<T, kDp>(sQ, base + q0 * row3, row3, q_rows, Dh);
    load_tile<T, kDp>(sdO, dO_base + static_cast<long>(q0) * C, C, q_rows, Dh);
    if (threadIdx.x < kTile) {
      const int qi = q0 + threadIdx.x;
      sLse[threadIdx.x] = qi < seq_len ? lse[bh * seq_len + qi] : 0.0f;
      sD[threadIdx.x] = qi < seq_len ? D[bh * seq_len + qi] : 0.0f;
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
        const float pij = score_valid(q0 + r, kj, seq_len, causal) ? expf(s[i][j] * scale - sLse[r]) : 0.0f;
        const float z = dropout_z(drop, static_cast<uint64_t>(bh), seq_len, q0 + r, kj);
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
    if (kj >= seq_len) continue;
    T* dk = d_qkv + (static_cast<long>(b) * seq_len + kj) * row3 + C + static_cast<long>(h) * Dh;
    T* dv = dk + C;
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int d = tx + 16 * k;
      if (d < Dh) {
        dk[d] = from_f32<T>(acc_k[i][k] * scale);
        dv[d] = from_f32<T>(acc_v[i][k]);
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

// qkv: (B*T, 3C), rotated in place; the q and k heads of a row are its first 2H heads of Dh columns.
// sign = -1: the transposed rotation (the backward). One thread per (row n, 16-byte pack j of the first half's
// columns, group of kHeads of the 2H heads): the pack's cos / sin are loaded once for its heads, and each head's
// two packs (columns 8j.. and Dh/2 + 8j.. for bf16) are loaded before any is stored.
template <typename T, int kHeads>
__global__ void rope_rotate_packs(T* __restrict__ qkv, long n_rows, int seq_len, int pos_offset, int H, int Dh,
                                  const float2* __restrict__ table, float sign) {
  constexpr int kV = cuda::Pack<T>::kVec;
  const int half = Dh / 2, packs = half / kV, groups = (2 * H + kHeads - 1) / kHeads;
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
  T* row = qkv + n * 3L * H * Dh + j * kV;
  cuda::Pack<T> x1[kHeads], x2[kHeads];
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int hh = group * kHeads + k;
    if (hh < 2 * H) x1[k] = cuda::load_pack(row + hh * Dh), x2[k] = cuda::load_pack(row + hh * Dh + half);
  }
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int hh = group * kHeads + k;
    if (hh >= 2 * H) continue;
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
__global__ void rope_rotate_pairs(T* __restrict__ qkv, long n_rows, int seq_len, int pos_offset, int H, int Dh,
                                  const float2* __restrict__ table, float sign) {
  const int half = Dh / 2;
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_rows * half) return;
  const long n = idx / half;
  const int i = static_cast<int>(idx % half);
  const float2 t = table[static_cast<long>(pos_offset + n % seq_len) * half + i];
  const float c = t.x, s = sign * t.y;
  T* row = qkv + n * 3L * H * Dh;
  for (int hh = 0; hh < 2 * H; ++hh) {  // q then k heads
    T* x = row + hh * Dh;
    const float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
    x[i] = from_f32<T>(x1 * c - x2 * s);
    x[i + half] = from_f32<T>(x2 * c + x1 * s);
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

// Launches a tiled attention kernel on the (ceil(T/64), H, B) grid with `smem` bytes of dynamic shared memory.
template <typename Kernel, typename... Args>
void launch_tiled(const char* op, Kernel kernel, size_t smem, const AttentionParams& p, Context& ctx,
                  Args... args) {
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, op, ": needs ", smem, " bytes of shared memory per block, the ",
           "device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK(p.H <= 65535 && p.B <= 65535, op, ": H and B must be at most 65535");
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(ceil_div(p.T, kTile), p.H, p.B);
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
  const std::string key = "rope theta=" + std::to_string(bits) + " Dh=" + std::to_string(Dh) + " positions=" +
                          std::to_string(rows);
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
    if (half % kV == 0 && cuda::aligned16(qkv)) {
      const long threads = n_rows * (half / kV) * ((2 * p.H + kHeads - 1) / kHeads);
      rope_rotate_packs<T, kHeads><<<ceil_div(threads, 256), 256, 0, ctx.stream()>>>(
          static_cast<T*>(qkv), n_rows, p.T, p.pos_offset, p.H, p.Dh, table, sign);
    } else {
      rope_rotate_pairs<T><<<ceil_div(n_rows * half, 256), 256, 0, ctx.stream()>>>(
          static_cast<T*>(qkv), n_rows, p.T, p.pos_offset, p.H, p.Dh, table, sign);
    }
    TS_CHECK_LAUNCH();
  });
}

}  // namespace

void attention_forward_cuda(const AttentionParams& p, DType dtype, void* out, float* lse, const void* qkv,
                            Context& ctx) {
  constexpr const char* op = "attention_forward";
  TS_CHECK(p.rope_theta == 0.0f, "internal: attention_forward_cuda takes q and k rotated (attention_forward ",
           "applies RoPE)");
  const AttentionDropoutDraw drop =
      attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  if (static_cast<long>(p.B) * p.T == 0) return;
  if (flash_attention_eligible(p, dtype, {qkv, out})) {
    const FlashAttentionArgs a{.qkv = qkv, .out = out, .lse = lse};
    if (flash_forward_uses_hopper(p, dtype, ctx)) flash_attention_forward_hopper_cuda(p, dtype, a, ctx);
    else flash_attention_forward_cuda(p, dtype, a, ctx);
    return;
  }
  cuda::dispatch_float(dtype, op, [&](auto t) {
    using T = decltype(t);
    dispatch_head_pad(p.Dh, [&](auto pad) {
      constexpr int kDp = decltype(pad)::value;
      launch_tiled(op, attention_forward_tiled_online<T, kDp>, forward_smem<T, kDp>(), p, ctx, static_cast<T*>(out),
                   lse, static_cast<const T*>(qkv), p.T, p.H, p.Dh, p.causal, attention_scale(p.Dh), drop);
    });
  });
}

void attention_backward_cuda(const AttentionParams& p, DType dtype, void* d_qkv, const void* d_out,
                             const void* qkv, const void* out, const float* lse, Context& ctx) {
  constexpr const char* op = "attention_backward";
  const AttentionDropoutDraw drop =
      attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  const long n_rows = static_cast<long>(p.B) * p.T * p.H;
  if (n_rows == 0) return;
  float* D = static_cast<float*>(ctx.scratch(static_cast<size_t>(n_rows) * sizeof(float)));
  cuda::dispatch_float(dtype, op, [&](auto t) {
    using T = decltype(t);
    const bool flash = flash_attention_eligible(p, dtype, {qkv, d_out, d_qkv});
    const bool hopper = flash && flash_backward_uses_hopper(p, dtype, ctx);
    // The Hopper dQ pass computes D itself from the dO tile it holds, when it can read out in 16-byte vectors:
    // doing so instead of attention_backward_row_dot took 0.11-0.23 ms off the backward at 32k tokens x 2048
    // (H200, bf16; bench/results/2026-12-01-split-waits-and-fused-d-h200.md).
    const bool d_in_dq = hopper && cuda::aligned16(out);
    if (!d_in_dq) {
      attention_backward_row_dot<T><<<ceil_div(n_rows * 32, 256), 256, 0, ctx.stream()>>>(
          D, static_cast<const T*>(d_out), static_cast<const T*>(out), p.T, p.H, p.Dh, n_rows);
      TS_CHECK_LAUNCH();
    }
    // RoPE's backward: the flash passes rotate dQ and dK back in registers as they store them where Dh is the
    // chosen kernels' compiled width (Dh / 2 then a multiple of 8, the pairs in one lane); elsewhere (a head run
    // zero-padded) a pass over d_qkv follows.
    const bool rope = p.rope_theta > 0.0f;
    const int width = hopper ? flash_hopper_head_pad(p.Dh) : flash_attention_head_pad(p.Dh);
    const bool rope_in_flash = rope && flash && width == p.Dh && p.Dh % 16 == 0;
    const void* rope_cs = rope_in_flash ? rope_table(p.rope_theta, p.Dh, long{p.rope_pos_offset} + p.T, ctx) : nullptr;
    if (flash) {
      if (hopper) {
        const FlashAttentionArgs a{.qkv = qkv, .d_out = d_out, .lse_in = lse, .out_in = d_in_dq ? out : nullptr,
                                   .D_out = D, .d_qkv = d_qkv, .rope_cs = rope_cs,
                                   .rope_pos_offset = p.rope_pos_offset};
        flash_attention_backward_hopper_cuda(p, dtype, a, ctx);
      } else {
        const FlashAttentionArgs a{.qkv = qkv, .d_out = d_out, .lse_in = lse, .D = D, .d_qkv = d_qkv,
                                   .rope_cs = rope_cs, .rope_pos_offset = p.rope_pos_offset};
        flash_attention_backward_dq_cuda(p, dtype, a, ctx);
        flash_attention_backward_dkdv_cuda(p, dtype, a, ctx);
      }
      if (rope && !rope_in_flash) rope_launch(attention_rope(p), dtype, d_qkv, -1.0f, ctx);
      return;
    }
    dispatch_head_pad(p.Dh, [&](auto pad) {
      constexpr int kDp = decltype(pad)::value;
      const float scale = attention_scale(p.Dh);
      launch_tiled(op, attention_backward_dq_tiled<T, kDp>, backward_dq_smem<T, kDp>(), p, ctx,
                   static_cast<T*>(d_qkv), static_cast<const T*>(d_out), static_cast<const T*>(qkv), lse,
                   static_cast<const float*>(D), p.T, p.H, p.Dh, p.causal, scale, drop);
      launch_tiled(op, attention_backward_dkdv_tiled<T, kDp>, backward_dkdv_smem<T, kDp>(), p, ctx,
                   static_cast<T*>(d_qkv), static_cast<const T*>(d_out), static_cast<const T*>(qkv), lse,
                   static_cast<const float*>(D), p.T, p.H, p.Dh, p.causal, scale, drop);
    });
    if (rope) rope_launch(attention_rope(p), dtype, d_qkv, -1.0f, ctx);
  });
}

const char* attention_cuda_kernel(const AttentionParams& p, DType dtype, const Context& ctx) {
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
