// FlashAttention-2 on tensor cores for the general call (flash.h: "General call"): the forward, dQ and dK/dV
// passes of flash_forward.cu, flash_backward_dq.cu and flash_backward_dkdv.cu over separate strided views, with
// grouped KV heads, Tq != Tk, the causal q_offset and key lengths. Kernels of their own, so that the packed call's
// plain case keeps its instances unchanged.
#include <cmath>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_kernel.cuh"

namespace tessera {
namespace flash {
namespace {

// A (B, T, heads, Dh) view in device memory, the head dim contiguous; every stride a multiple of 8 elements and
// the base 16-byte aligned (flash_general_eligible), so that every row is 16-byte aligned for cp.async.
template <typename T>
struct GView {
  T* p;
  int64_t sb, st, sh;
  __device__ __forceinline__ T* at(int b, int t, int h) const { return p + b * sb + t * st + h * sh; }
};

// Sizes and masks (attention.h): query head h reads KV head h / group; key j is visible to query i of sequence b
// when j < key_end(b) and, causal, j <= i + q_offset.
struct GShape {
  int Tq, Tk, H, group, Dh, q_offset;
  bool causal;
  const int32_t* key_lens;  // (B) or null
  __device__ __forceinline__ int key_end(int b) const { return key_lens ? min(max(key_lens[b], 0), Tk) : Tk; }
  // The keys [0, n) that some query of [q0, q0 + 64) sees.
  __device__ __forceinline__ int key_limit(int q0, int kend) const {
    const int end = causal ? min(kend, min(q0 + kTileRows, Tq) + q_offset) : kend;
    return max(end, 0);
  }
  __device__ __forceinline__ bool masked(int q, int key, int kend) const {
    return key >= kend || (causal && key > q + q_offset);
  }
};

// Dropout's keep bits (attention_dropout.h) of a tile whose rows are queries, for Tq queries and Tk keys: as
// for_each_draw_query_rows (flash_kernel.cuh), with the block index of the general call. Out of line, as there.
template <int kN8>
__device__ __noinline__ uint32_t general_keep_bits_query_rows(const AttentionDropoutDraw& d, uint64_t bh, int Tq,
                                                              int Tk, int row_a, int k0) {
  static_assert(kN8 % 2 == 0 && kN8 <= 8, "keep bits: pairs of 8-key blocks, at most 32 elements");
  const int lane = threadIdx.x & 31;
  uint32_t bits = 0;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 r =
        philox_block(d.seed, d.stream, attention_dropout_block(bh, Tq, Tk, row_a, k0 + 16 * kk + 2 * (lane & 3)));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int n = 2 * kk + (w & 1), e = 2 * (w >> 1);
      bits |= static_cast<uint32_t>(attention_dropout_keeps(r.v[w], 0, d.threshold)) << (4 * n + e);
      bits |= static_cast<uint32_t>(attention_dropout_keeps(r.v[w], 1, d.threshold)) << (4 * n + e + 1);
    }
  }
  return bits;
}
// The same for a tile whose rows are keys (for_each_draw_key_rows: each lane draws the block of its query parity
// and swaps words with lane ^ 4). Every lane of the warp must call it.
template <int kN8>
__device__ __noinline__ uint32_t general_keep_bits_key_rows(const AttentionDropoutDraw& d, uint64_t bh, int Tq, int Tk,
                                                            int key_a, int q0) {
  static_assert(kN8 % 2 == 0 && kN8 <= 8, "keep bits: pairs of 8-query blocks, at most 32 elements");
  const int lane = threadIdx.x & 31, half = key_a & 1;
  uint32_t bits = 0;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 mine = philox_block(d.seed, d.stream,
                                      attention_dropout_block(bh, Tq, Tk, q0 + 16 * kk + 2 * (lane & 3) + half, key_a));
    Philox4 theirs;
#pragma unroll
    for (int w = 0; w < 4; ++w) theirs.v[w] = __shfl_xor_sync(0xffffffffu, mine.v[w], 4);
#pragma unroll
    for (int qb = 0; qb < 2; ++qb)
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int n = 2 * kk + (w >> 1), e = 2 * (w & 1) + qb;
        bits |= static_cast<uint32_t>(attention_dropout_keeps(qb == half ? mine.v[w] : theirs.v[w], half, d.threshold))
                << (4 * n + e);
      }
  }
  return bits;
}

template <int kD>
constexpr size_t general_forward_smem() {
  return static_cast<size_t>(5) * kTileRows * smem_stride<kD>() * 2;  // Q, 2 x K, 2 x V, 16-bit
}

// The forward of flash_forward.cu over views: grid (ceil(Tq/64), H, B); block (x, h, b) takes query tile
// n_q - 1 - x of head h against KV head h / group, over the key tiles below key_limit. Masked: keys past the
// sequence's length and, causal, keys after i + q_offset. A row that sees no key has l = 0: out 0, lse +inf.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_general_forward_mma(GView<T> out, float* __restrict__ lse, GView<const T> q, GView<const T> k,
                              GView<const T> v, GShape g, float scale_log2, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kS = smem_stride<kD>(), kTileElems = kTileRows * kS, kN8 = kTileRows / 8, kD8 = kD / 8;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kTileElems;      // two buffers
  T* sV = sK + 2 * kTileElems;  // two buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / g.group;
  const int q0 = q_tile * kTileRows, Dh = g.Dh;
  const int kend = g.key_end(b);
  const int n_kt = (g.key_limit(q0, kend) + kTileRows - 1) / kTileRows;
  const T* k_base = k.at(b, 0, hk);
  const T* v_base = v.at(b, 0, hk);
  load_tile_async<T, kTileRows, kD>(sQ, q.at(b, q0, h), q.st, g.Tq - q0, Dh);
  if (n_kt > 0) {
    load_tile_async<T, kTileRows, kD>(sK, k_base, k.st, kend, Dh);
    load_tile_async<T, kTileRows, kD>(sV, v_base, v.st, kend, Dh);
  }
  cp_async_commit();

  float o[kD8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_a = q0 + warp * kRowsPerWarp + (lane >> 2);  // this lane's rows: row_a and row_a + 8
  const T* sQw = sQ + warp * kRowsPerWarp * kS;

  for (int j = 0; j < n_kt; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * kTileRows;
      load_tile_async<T, kTileRows, kD>(sK + (buf ^ 1) * kTileElems, k_base + k1 * k.st, k.st, kend - k1, Dh);
      load_tile_async<T, kTileRows, kD>(sV + (buf ^ 1) * kTileElems, v_base + k1 * v.st, v.st, kend - k1, Dh);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float s[kN8][4];
    zero(s);
    warp_gemm_nt<T, kN8, kD>(s, sQw, kS, sK + buf * kTileElems, kS);

    const int k0 = j * kTileRows;
    const bool edge = k0 + kTileRows > kend || (g.causal && k0 + kTileRows - 1 > q0 + g.q_offset);
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1), row = row_a + (e >> 1) * 8;
        s[n][e] = edge && g.masked(row, key, kend) ? -INFINITY : s[n][e] * scale_log2;
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = m[half];
#pragma unroll
      for (int n = 0; n < kN8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float shift = mx == -INFINITY ? 0.0f : mx;  // a row with nothing valid yet keeps P = 0
      const float alpha = flash::exp2_approx(m[half] - shift);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[n][e] = flash::exp2_approx(s[n][e] - shift);
          sum += s[n][e];
        }
      l[half] = l[half] * alpha + sum;
      m[half] = mx;
#pragma unroll
      for (int n = 0; n < kD8; ++n) {
        o[n][2 * half] *= alpha;
        o[n][2 * half + 1] *= alpha;
      }
    }
    if (drop.threshold) {
      const uint64_t bh = static_cast<uint64_t>(b) * g.H + h;
      apply_keep_bits<kN8>(s, general_keep_bits_query_rows<kN8>(drop, bh, g.Tq, g.Tk, row_a, k0), 1.0f);
    }
    uint32_t pa[kN8 / 2][4];
    c_to_a<T, kN8>(pa, s);
    warp_gemm_rn<T, kD8, kTileRows>(o, pa, sV + buf * kTileElems, kS);
    __syncthreads();
  }
  cp_async_wait<0>();  // no copy left in flight (with no key tile, the Q tile's)

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    inv[half] = l[half] > 0.0f ? 1.0f / l[half] * drop.scale : 0.0f;  // no visible key: out 0
  }
  store_rows<T, kD8>(out.at(b, 0, h), out.st, o, row_a - (lane >> 2), g.Tq, Dh, inv);
  if ((lane & 3) == 0) {
    float* lse_row = lse + (static_cast<int64_t>(b) * g.H + h) * g.Tq;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row_a + 8 * half;
      if (r < g.Tq) lse_row[r] = l[half] > 0.0f ? (m[half] + log2f(l[half])) * kLn2 : INFINITY;
    }
  }
}

template <int kD>
constexpr size_t general_dq_smem() {
  return static_cast<size_t>(6) * kTileRows * smem_stride<kD>() * 2;  // Q, dO, 2 x K, 2 x V, 16-bit
}
template <int kD>
constexpr int kGeneralDqMinBlocks = kD == 32 ? 4 : 3;  // flash_backward_dq.cu's bound

// The dQ pass of flash_backward_dq.cu over views: grid (ceil(Tq/64), H, B), the key tiles below key_limit.
// P = exp2(S log2e / sqrt(Dh) - lse log2e) is 0 where masked and on rows with lse = +inf (no visible key), so
// their dQ is 0. Every element of dq's rows [0, Tq) of head h is written once.
template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, kGeneralDqMinBlocks<kD>)
    flash_general_dq_mma(GView<T> dq_out, GView<const T> d_out, GView<const T> q, GView<const T> k, GView<const T> v,
                         const float* __restrict__ lse, const float* __restrict__ D, GShape g, float scale,
                         float scale_log2, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kS = smem_stride<kD>(), kTileElems = kTileRows * kS, kN8 = kTileRows / 8, kD8 = kD / 8;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kTileElems;
  T* sK = sdO + kTileElems;     // two buffers
  T* sV = sK + 2 * kTileElems;  // two buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / g.group;
  const int q0 = q_tile * kTileRows, Dh = g.Dh;
  const int kend = g.key_end(b);
  const int n_kt = (g.key_limit(q0, kend) + kTileRows - 1) / kTileRows;
  const T* k_base = k.at(b, 0, hk);
  const T* v_base = v.at(b, 0, hk);
  load_tile_async<T, kTileRows, kD>(sQ, q.at(b, q0, h), q.st, g.Tq - q0, Dh);
  load_tile_async<T, kTileRows, kD>(sdO, d_out.at(b, q0, h), d_out.st, g.Tq - q0, Dh);
  if (n_kt > 0) {
    load_tile_async<T, kTileRows, kD>(sK, k_base, k.st, kend, Dh);
    load_tile_async<T, kTileRows, kD>(sV, v_base, v.st, kend, Dh);
  }
  cp_async_commit();

  const int row_a = q0 + warp * kRowsPerWarp + (lane >> 2);
  float lse2[2], Dr[2];
  flash::load_row_stats(lse2, Dr, lse, D, (static_cast<int64_t>(b) * g.H + h) * g.Tq, row_a, g.Tq);
  float dq[kD8][4];
  zero(dq);
  const T* sQw = sQ + warp * kRowsPerWarp * kS;
  const T* sdOw = sdO + warp * kRowsPerWarp * kS;

  for (int j = 0; j < n_kt; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * kTileRows;
      load_tile_async<T, kTileRows, kD>(sK + (buf ^ 1) * kTileElems, k_base + k1 * k.st, k.st, kend - k1, Dh);
      load_tile_async<T, kTileRows, kD>(sV + (buf ^ 1) * kTileElems, v_base + k1 * v.st, v.st, kend - k1, Dh);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const T* sKb = sK + buf * kTileElems;
    float s[kN8][4], dp[kN8][4];
    zero(s);
    zero(dp);
    warp_gemm_nt<T, kN8, kD>(s, sQw, kS, sKb, kS);
    warp_gemm_nt<T, kN8, kD>(dp, sdOw, kS, sV + buf * kTileElems, kS);

    const int k0 = j * kTileRows;
    if constexpr (kDropout) {
      const uint64_t bh = static_cast<uint64_t>(b) * g.H + h;
      apply_keep_bits<kN8>(dp, general_keep_bits_query_rows<kN8>(drop, bh, g.Tq, g.Tk, row_a, k0), drop.scale);
    }
    const bool edge = k0 + kTileRows > kend || (g.causal && k0 + kTileRows - 1 > q0 + g.q_offset);
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1), half = e >> 1, row = row_a + 8 * half;
        const bool masked = edge && g.masked(row, key, kend);
        const float pv = masked ? 0.0f : flash::exp2_approx(s[n][e] * scale_log2 - lse2[half]);
        s[n][e] = pv * (dp[n][e] - Dr[half]);  // dS, in place of S
      }
    uint32_t dsa[kN8 / 2][4];
    c_to_a<T, kN8>(dsa, s);
    warp_gemm_rn<T, kD8, kTileRows>(dq, dsa, sKb, kS);
    __syncthreads();
  }
  cp_async_wait<0>();
  const float scales[2] = {scale, scale};
  store_rows<T, kD8>(dq_out.at(b, 0, h), dq_out.st, dq, row_a - (lane >> 2), g.Tq, Dh, scales);
}

// flash_backward_dkdv.cu's query step and blocks per SM.
template <int kD>
constexpr int kGeneralQueryStep = kD >= 128 ? 32 : 64;
template <int kD>
constexpr int kGeneralDkdvMinBlocks = kD == 64 ? 3 : 1;
template <int kD>
constexpr size_t general_dkdv_smem() {
  return (static_cast<size_t>(2) * kTileRows + 4 * kGeneralQueryStep<kD>)*smem_stride<kD>() * 2 +
         4 * kGeneralQueryStep<kD> * sizeof(float);
}

// The dK/dV pass of flash_backward_dkdv.cu over views, for grouped heads: grid (ceil(Tk/64), Hkv, B); block
// (x, hk, b) owns keys [k0, k0 + 64) of KV head hk and runs the query steps of each of the group's query heads
// hk group .. hk group + group - 1 in that order, one pipeline over all of them, summing into the same dK and dV
// registers: the group's sum with no atomics, in a fixed order (deterministic). Under a causal mask a head's
// steps start at the first query that sees key k0 (k0 - q_offset); keys at or past the sequence's length are
// masked, and a block wholly past it stores zeros.
template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, kGeneralDkdvMinBlocks<kD>)
    flash_general_dkdv_mma(GView<T> dk_out, GView<T> dv_out, GView<const T> d_out, GView<const T> q, GView<const T> k,
                           GView<const T> v, const float* __restrict__ lse, const float* __restrict__ D, GShape g,
                           float scale, float scale_log2, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kQ = kGeneralQueryStep<kD>;
  constexpr int kS = smem_stride<kD>(), kTileElems = kTileRows * kS, kStepElems = kQ * kS;
  constexpr int kQ8 = kQ / 8, kD8 = kD / 8;
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kTileElems;
  T* sQ = sV + kTileElems;                                       // two buffers of kQ rows
  T* sdO = sQ + 2 * kStepElems;                                  // two buffers of kQ rows
  float* sLse = reinterpret_cast<float*>(sdO + 2 * kStepElems);  // two buffers of kQ (times log2e)
  float* sD = sLse + 2 * kQ;                                     // two buffers of kQ
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hk = blockIdx.y, b = blockIdx.z, Dh = g.Dh;
  const int k0 = blockIdx.x * kTileRows;
  const int kend = g.key_end(b);
  const int n_qt = (g.Tq + kQ - 1) / kQ;
  const int i_begin = g.causal ? max(0, k0 - g.q_offset) / kQ : 0;
  const int per_head = k0 < kend ? max(n_qt - i_begin, 0) : 0;  // query steps of one head
  const int n_steps = per_head * g.group;

  // Step s of the pipeline: query head hk group + s / per_head, queries from (i_begin + s % per_head) kQ.
  auto load_step = [&](int s, int buf) {
    const int h = hk * g.group + s / per_head, q0 = (i_begin + s % per_head) * kQ;
    load_tile_async<T, kQ, kD>(sQ + buf * kStepElems, q.at(b, q0, h), q.st, g.Tq - q0, Dh);
    load_tile_async<T, kQ, kD>(sdO + buf * kStepElems, d_out.at(b, q0, h), d_out.st, g.Tq - q0, Dh);
    if (threadIdx.x < kQ) {
      const int qi = q0 + threadIdx.x;
      const int64_t stat = (static_cast<int64_t>(b) * g.H + h) * g.Tq + qi;
      sLse[buf * kQ + threadIdx.x] = qi < g.Tq ? lse[stat] * kLog2e : INFINITY;  // P = 0 past Tq
      sD[buf * kQ + threadIdx.x] = qi < g.Tq ? D[stat] : 0.0f;
    }
  };

  float dk[kD8][4], dv[kD8][4];
  zero(dk);
  zero(dv);
  if (n_steps > 0) {
    load_tile_async<T, kTileRows, kD>(sK, k.at(b, k0, hk), k.st, kend - k0, Dh);
    load_tile_async<T, kTileRows, kD>(sV, v.at(b, k0, hk), v.st, kend - k0, Dh);
    load_step(0, 0);
  }
  cp_async_commit();
  const int key_a = k0 + warp * kRowsPerWarp + (lane >> 2);  // this lane's keys: key_a and key_a + 8
  const T* sKw = sK + warp * kRowsPerWarp * kS;
  const T* sVw = sV + warp * kRowsPerWarp * kS;

  for (int s = 0; s < n_steps; ++s) {
    const int buf = s & 1;
    if (s + 1 < n_steps) load_step(s + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const T* sQb = sQ + buf * kStepElems;
    const T* sdOb = sdO + buf * kStepElems;
    const float* lse2 = sLse + buf * kQ;
    const float* Db = sD + buf * kQ;
    float st[kQ8][4], dpt[kQ8][4];
    zero(st);
    zero(dpt);
    warp_gemm_nt<T, kQ8, kD>(st, sKw, kS, sQb, kS);
    warp_gemm_nt<T, kQ8, kD>(dpt, sVw, kS, sdOb, kS);

    const int h = hk * g.group + s / per_head, q0 = (i_begin + s % per_head) * kQ;
    uint32_t keep = 0;
    if constexpr (kDropout) {
      keep = general_keep_bits_key_rows<kQ8>(drop, static_cast<uint64_t>(b) * g.H + h, g.Tq, g.Tk, key_a, q0);
      apply_keep_bits<kQ8>(dpt, keep, drop.scale);
    }
    const bool edge = q0 + kQ > g.Tq || k0 + kTileRows > kend || (g.causal && q0 + g.q_offset < k0 + kTileRows - 1);
#pragma unroll
    for (int n = 0; n < kQ8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = n * 8 + 2 * (lane & 3) + (e & 1), qi = q0 + ql, key = key_a + (e >> 1) * 8;
        const bool masked = edge && (qi >= g.Tq || g.masked(qi, key, kend));
        const float pv = masked ? 0.0f : flash::exp2_approx(st[n][e] * scale_log2 - lse2[ql]);
        st[n][e] = pv;                          // Pᵀ, in place of Sᵀ
        dpt[n][e] = pv * (dpt[n][e] - Db[ql]);  // dSᵀ, in place of dPᵀ
      }
    if constexpr (kDropout) apply_keep_bits<kQ8>(st, keep, drop.scale);  // dV takes (P ∘ Z)ᵀ
    uint32_t pa[kQ8 / 2][4], dsa[kQ8 / 2][4];
    c_to_a<T, kQ8>(pa, st);
    c_to_a<T, kQ8>(dsa, dpt);
    warp_gemm_rn<T, kD8, kQ>(dv, pa, sdOb, kS);
    warp_gemm_rn<T, kD8, kQ>(dk, dsa, sQb, kS);
    __syncthreads();
  }
  cp_async_wait<0>();
  const int row0 = k0 + warp * kRowsPerWarp;
  const float k_scales[2] = {scale, scale}, v_scales[2] = {1.0f, 1.0f};
  store_rows<T, kD8>(dk_out.at(b, 0, hk), dk_out.st, dk, row0, g.Tk, Dh, k_scales);
  store_rows<T, kD8>(dv_out.at(b, 0, hk), dv_out.st, dv, row0, g.Tk, Dh, v_scales);
}

template <typename T, typename V>
GView<T> gview(const AttentionView<V>& v) {
  return {static_cast<T*>(v.data), v.sb, v.st, v.sh};
}

GShape general_shape(const AttentionParams& p) {
  return {.Tq = attention_tq(p),
          .Tk = attention_tk(p),
          .H = p.H,
          .group = p.H / attention_kv_heads(p),
          .Dh = p.Dh,
          .q_offset = p.q_offset,
          .causal = p.causal,
          .key_lens = p.key_lens.defined() ? p.key_lens.as<int32_t>() : nullptr};
}

template <typename Kernel>
void prepare(const char* op, const char* pass, Kernel kernel, size_t smem, Context& ctx) {
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, op, ": the flash ", pass, " kernel needs ", smem,
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

// launch(type tag, width tag) for (dtype, Dh), bf16 or f16.
template <typename F>
void dispatch_general(const char* op, const AttentionParams& p, DType dtype, F&& launch) {
  TS_CHECK(p.H <= 65535 && p.B <= 65535, op, ": H and B must be at most 65535");
  dispatch_head(p.Dh, [&](auto d) {
    if (dtype == DType::BF16) launch(__nv_bfloat16{}, d);
    else if (dtype == DType::F16) launch(__half{}, d);
    else TS_THROW(op, ": the flash kernels take bf16 or f16, not ", dtype_name(dtype));
  });
}

}  // namespace
}  // namespace flash

void flash_general_forward_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx) {
  const flash::GShape g = flash::general_shape(p);
  if (static_cast<int64_t>(p.B) * g.Tq == 0) return;
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh))) * flash::kLog2e;
  flash::dispatch_general("attention_forward", p, dtype, [&](auto t, auto d) {
    using T = decltype(t);
    constexpr int kD = decltype(d)::value;
    const auto kernel = flash::flash_general_forward_mma<T, kD>;
    constexpr size_t smem = flash::general_forward_smem<kD>();
    flash::prepare("attention_forward", "forward", kernel, smem, ctx);
    const dim3 grid(cuda::ceil_div(g.Tq, flash::kTileRows), p.H, p.B);
    kernel<<<grid, flash::kThreads, smem, ctx.stream()>>>(flash::gview<T>(a.out), a.lse, flash::gview<const T>(a.q),
                                                          flash::gview<const T>(a.k), flash::gview<const T>(a.v), g,
                                                          scale_log2, drop);
    TS_CHECK_LAUNCH();
  });
}

void flash_general_backward_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a, Context& ctx) {
  const flash::GShape g = flash::general_shape(p);
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  constexpr const char* op = "attention_backward";
  flash::dispatch_general(op, p, dtype, [&](auto t, auto d) {
    using T = decltype(t);
    constexpr int kD = decltype(d)::value;
    if (static_cast<int64_t>(p.B) * g.Tq > 0) {
      const auto kernel = drop.threshold ? flash::flash_general_dq_mma<T, kD, true>
                                         : flash::flash_general_dq_mma<T, kD, false>;
      constexpr size_t smem = flash::general_dq_smem<kD>();
      flash::prepare(op, "dQ", kernel, smem, ctx);
      const dim3 grid(cuda::ceil_div(g.Tq, flash::kTileRows), p.H, p.B);
      kernel<<<grid, flash::kThreads, smem, ctx.stream()>>>(flash::gview<T>(a.dq), flash::gview<const T>(a.d_out),
                                                            flash::gview<const T>(a.q), flash::gview<const T>(a.k),
                                                            flash::gview<const T>(a.v), a.lse_in, a.D, g, scale,
                                                            scale * flash::kLog2e, drop);
      TS_CHECK_LAUNCH();
    }
    if (static_cast<int64_t>(p.B) * g.Tk > 0) {
      const auto kernel = drop.threshold ? flash::flash_general_dkdv_mma<T, kD, true>
                                         : flash::flash_general_dkdv_mma<T, kD, false>;
      constexpr size_t smem = flash::general_dkdv_smem<kD>();
      flash::prepare(op, "dK/dV", kernel, smem, ctx);
      const dim3 grid(cuda::ceil_div(g.Tk, flash::kTileRows), attention_kv_heads(p), p.B);
      kernel<<<grid, flash::kThreads, smem, ctx.stream()>>>(flash::gview<T>(a.dk), flash::gview<T>(a.dv),
                                                            flash::gview<const T>(a.d_out), flash::gview<const T>(a.q),
                                                            flash::gview<const T>(a.k), flash::gview<const T>(a.v),
                                                            a.lse_in, a.D, g, scale, scale * flash::kLog2e, drop);
      TS_CHECK_LAUNCH();
    }
  });
}

}  // namespace tessera
