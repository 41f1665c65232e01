// The Hopper (sm_90a) backward for the general call: flash_hopper_backward.cu's two passes (a dQ pass per query
// tile, a dK / dV pass per key tile, no atomics; its header comment holds the schedule, the turns and the
// pipelines, which these kernels keep) over a tensor map per view (make_view_map: dimensions (Dh, heads, T, B) with
// the view's own strides; Q and dO over H heads and Tq rows, K and V over Hkv heads and Tk rows), with grouped KV
// heads, Tq != Tk, the causal q_offset, key lengths and dropout as the general forward draws it
// (flash_hopper_general.cu, flash_general.cu). Kernels of their own, so that the packed call's instances stay as
// they are. D = rowsum(dO ∘ O) comes computed (the general entry's row_dot).
//   dQ pass, grid (ceil(Tq/128), H, B): query head h reads KV head h / group, over the key tiles below the block's
//     key limit (min(key_end(b), last query + 1 + q_offset) under a causal mask); masked: keys at or past key_end(b)
//     and, causal, keys after query + q_offset. A block whose queries see no key stores dQ 0 and loads nothing.
//   dK / dV pass, grid (ceil(Tk/128), Hkv, B): block (x, g, b) owns keys [128 x, 128 x + 128) of KV head g and runs
//     the query tiles of each query head g group .. g group + group - 1, in head order, as one pipeline ("steps")
//     summing into the same dK and dV registers: the group's sum inside one block, deterministic. Under a causal
//     mask a head's tiles start at the first query that sees the block's first key (k0 - q_offset). A block wholly at
//     or past key_end(b), or seen by no query, stores dK = dV = 0 and loads nothing.
// Rows that see no key have lse +inf (the forward's), so their P, hence their share of dQ, dK and dV, is 0.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_hopper.h"
#include "tessera/ops/attention/flash_hopper_backward.cuh"
#include "tessera/ops/attention/flash_hopper_kernel.cuh"
#include "tessera/ops/attention/flash_kernel.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flash_hopper_general_backward.cu: wgmma needs the sm_90a target; build with CMAKE_CUDA_ARCHITECTURES=90a"
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_FLASH_HOPPER_DEVICE 1
#endif

namespace tessera {
namespace flash_hopper {
namespace {

using namespace bwd;  // NOLINT(google-build-using-namespace): the shared backward pieces

// A (B, T, heads, Dh) output view (dQ, dK or dV), the head dim contiguous; stored by flash::store_rows in 4-byte
// pairs (base 4-byte aligned, strides even: flash_general_backward_hopper_cuda checks).
template <typename T>
struct OutView {
  T* p;
  int64_t sb, st, sh;
  __device__ __forceinline__ T* head(int b, int h) const { return p + b * sb + h * sh; }
};

// Sizes and masks (attention.h), as flash_general.cu's GShape: key j is visible to query i of sequence b when
// j < key_end(b) and, causal, j <= i + q_offset.
struct BShape {
  int Tq, Tk, H, group, Dh, q_offset;
  bool causal;
  const int32_t* key_lens;  // (B) or null
  __device__ __forceinline__ int key_end(int b) const { return key_lens ? min(max(key_lens[b], 0), Tk) : Tk; }
};

// Zeros for the 16 rows from row_w of one consumer warp, columns below Dh (a tile that no key or query reaches).
template <typename T, int kBoxes>
__device__ __forceinline__ void store_zero_rows(T* base, int64_t ld, int row_w, int n_rows, int Dh) {
  float zeros[8][4];
  flash::zero(zeros);
  const float one[2] = {1.0f, 1.0f};
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)
    flash::store_rows<T, 8>(base + bx * kBoxCols, ld, zeros, row_w, n_rows, Dh - bx * kBoxCols, one);
}

// dK = dV = 0 for one consumer thread's share of the block's keys k0 .. k0 + 127 of KV head hk (a block that no
// query reaches).
template <typename T, int kBoxes>
__device__ __forceinline__ void store_zero_keys(const OutView<T>& dk_out, const OutView<T>& dv_out, int b, int hk,
                                                int k0, int Tk, int Dh) {
  const int tid = threadIdx.x - 128, row_w = k0 + (tid / 128) * 64 + ((tid % 128) / 32) * 16;
  store_zero_rows<T, kBoxes>(dk_out.head(b, hk), dk_out.st, row_w, Tk, Dh);
  store_zero_rows<T, kBoxes>(dv_out.head(b, hk), dv_out.st, row_w, Tk, Dh);
}

// Dropout's keep bits (attention_dropout.h), bit 4 n + e for element [n][e], with the general call's block index
// (Tq queries, Tk keys): for a tile whose rows are queries as flash::for_each_draw_query_rows draws them, and for
// one whose rows are keys as flash::for_each_draw_key_rows (every lane of the warp must call it: a shuffle). Inline:
// a call between a wgmma and its wait would serialize the wgmma.
template <int kN8>
__device__ __forceinline__ uint64_t general_keep_bits_query_rows(const AttentionDropoutDraw& d, uint64_t bh, int Tq,
                                                                 int Tk, int row_a, int k0) {
  static_assert(kN8 % 2 == 0 && kN8 <= 16, "keep bits: pairs of 8-key blocks, at most 64 elements");
  const int lane = threadIdx.x & 31;
  uint64_t bits = 0;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 r =
        philox_block(d.seed, d.stream, attention_dropout_block(bh, Tq, Tk, row_a, k0 + 16 * kk + 2 * (lane & 3)));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int n = 2 * kk + (w & 1), e = 2 * (w >> 1);
      bits |= static_cast<uint64_t>(attention_dropout_keeps(r.v[w], 0, d.threshold)) << (4 * n + e);
      bits |= static_cast<uint64_t>(attention_dropout_keeps(r.v[w], 1, d.threshold)) << (4 * n + e + 1);
    }
  }
  return bits;
}
template <int kN8>
__device__ __forceinline__ uint64_t general_keep_bits_key_rows(const AttentionDropoutDraw& d, uint64_t bh, int Tq,
                                                               int Tk, int key_a, int q0) {
  static_assert(kN8 % 2 == 0 && kN8 <= 16, "keep bits: pairs of 8-query blocks, at most 64 elements");
  const int lane = threadIdx.x & 31, half = key_a & 1;
  uint64_t bits = 0;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 mine = philox_block(d.seed, d.stream,
                                      attention_dropout_block(bh, Tq, Tk, q0 + 16 * kk + 2 * (lane & 3) + half, key_a));
    Philox4 theirs;  // lane ^ 4's: the block of query parity 1 - half
#pragma unroll
    for (int w = 0; w < 4; ++w) theirs.v[w] = __shfl_xor_sync(0xffffffffu, mine.v[w], 4);
#pragma unroll
    for (int qb = 0; qb < 2; ++qb)
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int n = 2 * kk + (w >> 1), e = 2 * (w & 1) + qb;
        bits |= static_cast<uint64_t>(attention_dropout_keeps(qb == half ? mine.v[w] : theirs.v[w], half, d.threshold))
                << (4 * n + e);
      }
  }
  return bits;
}

template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, 1)
    flash_general_backward_dq_wgmma(const __grid_constant__ CUtensorMap q_map,
                                    const __grid_constant__ CUtensorMap k_map,
                                    const __grid_constant__ CUtensorMap v_map,
                                    const __grid_constant__ CUtensorMap do_map, OutView<T> dq_out,
                                    const float* __restrict__ lse, const float* __restrict__ D, BShape g, float scale,
                                    float scale_log2, AttentionDropoutDraw drop) {
#if defined(TESSERA_FLASH_HOPPER_DEVICE)
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kKeys = kDqKeys;
  constexpr int kBoxes = kD / kBoxCols, kBlockTile = block_tile_bytes<kD>(), kKvTile = kBlockTile;
  constexpr int kN8 = kKeys / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_full[kStages], bar_empty[kStages];
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = smem0, sdO = smem0 + kBlockTile;
  auto sK = [&](int s) { return smem0 + 2 * kBlockTile + 2 * s * kKvTile; };
  auto sV = [&](int s) { return sK(s) + kKvTile; };

  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / g.group;
  const int q0 = q_tile * kBlockRows;
  const int kend = g.key_end(b);
  const int klim = max(g.causal ? min(kend, min(q0 + kBlockRows, g.Tq) + g.q_offset) : kend, 0);
  const int n_kt = (klim + kKeys - 1) / kKeys;  // block-uniform

  if (n_kt == 0) {  // no query of the tile sees a key: dQ 0, nothing loaded
    if (threadIdx.x >= 128) {
      const int tid = threadIdx.x - 128;
      store_zero_rows<T, kBoxes>(dq_out.head(b, h), dq_out.st, q0 + (tid / 128) * 64 + ((tid % 128) / 32) * 16, g.Tq,
                                 g.Dh);
    }
    return;
  }

  if (threadIdx.x == 0) {
    tma_prefetch_maps(&q_map, &k_map, &v_map, &do_map);
    init_barriers(bar_q, bar_full, bar_empty, /*full_arrivals=*/1);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&bar_q, 2 * kBlockTile);
      load_block_tile<kD>(sQ, &q_map, h, q0, b, &bar_q);
      load_block_tile<kD>(sdO, &do_map, h, q0, b, &bar_q);
      produce_steps(n_kt, 2 * kKvTile, bar_full, bar_empty, [&](int j, int s, uint64_t* bar) {
        load_block_tile<kD>(sK(s), &k_map, hk, j * kKeys, b, bar);
        load_block_tile<kD>(sV(s), &v_map, hk, j * kKeys, b, bar);
      });
    }
    return;
  }

  // ---- consumer warpgroups ----
  regs_claim<kConsumerRegs>();
  const int cw = warpgroup_uniform(128), tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int q_first = q0 + cw * 64;                                     // the warpgroup's first query row
  const int row_w = q_first + warp * 16;                                // this warp's first query row
  const int row_a = row_w + lane / 4;                                   // this lane's rows: row_a and row_a + 8
  const uint32_t sQw = sQ + cw * 64 * 128, sdOw = sdO + cw * 64 * 128;  // this warpgroup's 64 rows (1024-aligned)
  float lse2[2], Dr[2];
  flash::load_row_stats(lse2, Dr, lse, D, (static_cast<int64_t>(b) * g.H + h) * g.Tq, row_a, g.Tq);
  float dq[kBoxes][8][4];
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) flash::zero(dq[bx]);
  float sacc[kN8][4], dpacc[kN8][4];
  mbar_wait(&bar_q, 0);

  // The packed dQ pass's turns (flash_hopper_backward.cu): two a tile, consumer 0 first, consumer 1 making no
  // hand-over after its last; n_kt is block-uniform, so both take the same number. A tile wholly past one
  // consumer's queries is masked whole (P = 0), not skipped.
  if (cw == 1) turn_pass(cw);
  for (int j = 0; j < n_kt; ++j) {
    const int s = j % kStages;
    const int k0 = j * kKeys;
    mbar_wait(&bar_full[s], (j / kStages) & 1);
    turn_wait(cw);
    issue_two_scores<T, kD, kKeys>(sacc, dpacc, sQw, sK(s), sdOw, sV(s));
    turn_pass(cw);
    wgmma_wait<1>();
    flash_hopper::fence_regs(sacc);
    // Only a tile that reaches key_end or, causal, a key after this warpgroup's first query + q_offset masks (a
    // warpgroup-uniform branch); S = -inf there makes P = 0.
    if (k0 + kKeys > kend || (g.causal && k0 + kKeys - 1 > q_first + g.q_offset))
      flash::mask_scores(sacc, k0, row_a + g.q_offset, kend, g.causal);
    dq_probs(sacc, scale_log2, lse2);
    uint64_t keep = 0;  // drawn while dP is computed
    if constexpr (kDropout)
      keep = general_keep_bits_query_rows<kN8>(drop, static_cast<uint64_t>(b) * g.H + h, g.Tq, g.Tk, row_a, k0);
    wgmma_wait<0>();
    flash_hopper::fence_regs(dpacc);
    if constexpr (kDropout) flash::apply_keep_bits<kN8>(dpacc, keep, drop.scale);  // dP = Z ∘ (dO Vᵀ)
    dq_dscores(sacc, dpacc, Dr);                                                   // dS, in place of P
    uint32_t dsa[kN8 / 2][4];
    flash::c_to_a<T, kN8>(dsa, sacc);
    turn_wait(cw);
    issue_dq<T, kD>(dq, dsa, sK(s));
    if (cw == 0 || j + 1 < n_kt) turn_pass(cw);
    wgmma_wait<0>();
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) flash_hopper::fence_regs(dq[bx]);
    mbar_arrive(&bar_empty[s]);
  }

  const float scales[2] = {scale, scale};
  T* dq_base = dq_out.head(b, h);
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)  // the box's columns below Dh
    flash::store_rows<T, 8>(dq_base + bx * kBoxCols, dq_out.st, dq[bx], row_w, g.Tq, g.Dh - bx * kBoxCols, scales);
#endif
}

template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, 1)
    flash_general_backward_dkdv_wgmma(const __grid_constant__ CUtensorMap q_map,
                                      const __grid_constant__ CUtensorMap k_map,
                                      const __grid_constant__ CUtensorMap v_map,
                                      const __grid_constant__ CUtensorMap do_map, OutView<T> dk_out, OutView<T> dv_out,
                                      const float* __restrict__ lse, const float* __restrict__ D, BShape g, float scale,
                                      float scale_log2, AttentionDropoutDraw drop) {
#if defined(TESSERA_FLASH_HOPPER_DEVICE)
  if constexpr (kDropout) attention_dropout_resolve(drop);
  // The packed pass's query tiles, except with dropout at compiled width 64: 64 rows, as at 128, since the general
  // draws beside 128-row Sᵀ and dPᵀ do not fit the registers (ptxas spills).
  constexpr int kQRows = kDropout ? 64 : dkdv_query_rows<kD>();
  constexpr int kBoxes = kD / kBoxCols, kBlockTile = block_tile_bytes<kD>();
  constexpr int kStep = dkdv_query_tile_bytes<kD, kQRows>();  // a Q or dO tile
  static_assert(2 * kBlockTile + 2 * kStages * kStep + 1024 <= dkdv_smem_bytes<kD>(), "the launch's shared memory");
  constexpr int kN8 = kQRows / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_kv, bar_full[kStages], bar_empty[kStages];
  __shared__ float s_lse[kStages][kQRows], s_D[kStages][kQRows];  // per query of a stage: lse log2e, D
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = smem0, sV = smem0 + kBlockTile;
  auto sQ = [&](int s) { return smem0 + 2 * kBlockTile + 2 * s * kStep; };
  auto sdO = [&](int s) { return sQ(s) + kStep; };

  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kBlockRows;
  const int kend = g.key_end(b);
  const int n_qt = (g.Tq + kQRows - 1) / kQRows;
  const int i_begin = g.causal ? max(0, k0 - g.q_offset) / kQRows : 0;  // earlier queries see none of these keys
  const int per_head = k0 < kend ? max(n_qt - i_begin, 0) : 0;          // query tiles of one head
  const int n_steps = per_head * g.group;                               // block-uniform
  // Step t of the pipeline: query head hk group + t / per_head, its query tile i_begin + t % per_head.
  auto step_head = [&](int t) { return hk * g.group + t / per_head; };
  auto step_q0 = [&](int t) { return (i_begin + t % per_head) * kQRows; };

  if (n_steps == 0) {  // keys at or past key_end, or seen by no query: dK = dV = 0, nothing loaded
    if (threadIdx.x >= 128) store_zero_keys<T, kBoxes>(dk_out, dv_out, b, hk, k0, g.Tk, g.Dh);
    return;
  }

  if (threadIdx.x == 0) {
    tma_prefetch_maps(&q_map, &k_map, &v_map, &do_map);
    init_barriers(bar_kv, bar_full, bar_empty, /*full_arrivals=*/1 + 32);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x / 32 == 1)  // lse and D of each step's query tile, of the step's head
      stage_query_stats(
          s_lse, s_D, bar_full, bar_empty, lse, D, g.Tq, n_steps,
          [&](int t) { return (static_cast<int64_t>(b) * g.H + step_head(t)) * g.Tq; }, step_q0);
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&bar_kv, 2 * kBlockTile);
      load_block_tile<kD>(sK, &k_map, hk, k0, b, &bar_kv);
      load_block_tile<kD>(sV, &v_map, hk, k0, b, &bar_kv);
      produce_steps(n_steps, 2 * kStep, bar_full, bar_empty, [&](int t, int s, uint64_t* bar) {
        const int h = step_head(t), q0 = step_q0(t);
        load_query_tile<kD, kQRows>(sQ(s), &q_map, h, q0, b, bar);
        load_query_tile<kD, kQRows>(sdO(s), &do_map, h, q0, b, bar);
      });
    }
    return;
  }

  // ---- consumer warpgroups ----
  regs_claim<kConsumerRegs>();
  const int cw = warpgroup_uniform(128), tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int k_first = k0 + cw * 64;       // the warpgroup's first key
  const int row_w = k_first + warp * 16;  // this warp's first key
  const int key_a = row_w + lane / 4;     // this lane's keys: key_a and key_a + 8
  float dk[kBoxes][8][4], dv[kBoxes][8][4];
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) {
    flash::zero(dk[bx]);
    flash::zero(dv[bx]);
  }
  float st[kN8][4], dpt[kN8][4];
  uint32_t pa[kN8 / 2][4], dsa[kN8 / 2][4];  // Pᵀ and dSᵀ as A fragments of dV += Pᵀ dO, dK += dSᵀ Q
  const uint32_t sKw = sK + cw * 64 * 128, sVw = sV + cw * 64 * 128;
  mbar_wait(&bar_kv, 0);

  // Step t's Pᵀ and dSᵀ (into pa, dsa) from its Sᵀ, complete in st, and its dPᵀ, the last group issued: Pᵀ's
  // exponentials run while the tensor cores compute dPᵀ.
  auto tile_grads = [&](int s, int t) {
    const int q0 = step_q0(t);
    // Only a tile that reaches key_end or, causal, holds a key after a query + q_offset masks (a warpgroup-uniform
    // branch): Sᵀ = -inf makes P = 0. Queries past Tq need no mask: their staged lse is +inf, so P = 0 (their S is
    // finite: TMA fills rows past Tq with zeros).
    if (k0 + kBlockRows > kend || (g.causal && q0 + g.q_offset < k_first + 63)) {
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = q0 + n * 8 + 2 * (lane & 3) + (e & 1), key = key_a + (e >> 1) * 8;
          if (key >= kend || (g.causal && key > q + g.q_offset)) st[n][e] = -INFINITY;
        }
    }
    dkdv_probs(st, scale_log2, s_lse[s]);  // Pᵀ
    uint64_t keep = 0;                     // drawn while dPᵀ is computed
    if constexpr (kDropout)
      keep =
          general_keep_bits_key_rows<kN8>(drop, static_cast<uint64_t>(b) * g.H + step_head(t), g.Tq, g.Tk, key_a, q0);
    wgmma_wait<0>();
    flash_hopper::fence_regs(dpt);
    if constexpr (kDropout) flash::apply_keep_bits<kN8>(dpt, keep, drop.scale);  // dPᵀ = Zᵀ ∘ (V dOᵀ)
    dkdv_dscores(dpt, st, s_D[s]);                                               // dSᵀ, in place of dPᵀ
    if constexpr (kDropout) flash::apply_keep_bits<kN8>(st, keep, drop.scale);   // dV takes (P ∘ Z)ᵀ
    flash::c_to_a<T, kN8>(pa, st);
    flash::c_to_a<T, kN8>(dsa, dpt);
  };
  auto dvdk = [&](int s) { issue_dvdk<T, kD, kQRows>(dv, dk, pa, dsa, sdO(s), sQ(s)); };

  if constexpr (kQRows == 128) {
    // Compiled width 64: the packed pass's pipeline (dkdv_steps_queued) over the steps of every head of the group.
    // No skip: a tile some consumer's keys do not meet is masked whole. n_steps >= 1 here.
    dkdv_steps_queued<T, kD, kQRows>(n_steps, st, dpt, sKw, sVw, sQ, sdO, bar_full, bar_empty, tile_grads, dvdk);
  } else {
    for (int t = 0; t < n_steps; ++t) {
      const int s = t % kStages;
      const int q0 = step_q0(t);
      mbar_wait(&bar_full[s], (t / kStages) & 1);
      // A tile whose last query + q_offset is before this warpgroup's first key sees none of its keys (causal):
      // skipped, the stage still waited for and released, as in the packed pass.
      if (!g.causal || q0 + kQRows - 1 + g.q_offset >= k_first) {
        issue_two_scores<T, kD, kQRows>(st, dpt, sKw, sQ(s), sVw, sdO(s));
        wgmma_wait<1>();
        flash_hopper::fence_regs(st);
        tile_grads(s, t);
        dvdk(s);
        wgmma_wait<0>();
      }
      mbar_arrive(&bar_empty[s]);
    }
  }
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) {
    flash_hopper::fence_regs(dv[bx]);
    flash_hopper::fence_regs(dk[bx]);
  }

  const float k_scales[2] = {scale, scale}, v_scales[2] = {1.0f, 1.0f};
  T* dk_base = dk_out.head(b, hk);
  T* dv_base = dv_out.head(b, hk);
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) {  // the box's columns below Dh
    const int cols = g.Dh - bx * kBoxCols;
    flash::store_rows<T, 8>(dk_base + bx * kBoxCols, dk_out.st, dk[bx], row_w, g.Tk, cols, k_scales);
    flash::store_rows<T, 8>(dv_base + bx * kBoxCols, dv_out.st, dv[bx], row_w, g.Tk, cols, v_scales);
  }
#endif
}

template <typename T>
OutView<T> out_view(const AttentionView<void>& v) {
  return {static_cast<T*>(v.data), v.sb, v.st, v.sh};
}

// maps: Q, K, V, dO (make_view_map, kBoxRows-row boxes).
template <typename T, int kD>
void launch_general_backward(const AttentionParams& p, const FlashGeneralArgs& a, const CUtensorMap (&maps)[4],
                             Context& ctx) {
  constexpr const char* op = "attention_backward (Hopper path)";
  constexpr size_t dkdv_smem = dkdv_smem_bytes<kD>(), dq_smem = dq_smem_bytes<kD>();
  static_assert(std::max(dkdv_smem, dq_smem) <= 227 * 1024, "more shared memory per block than sm_90 has");
  TS_CHECK(std::max(dkdv_smem, dq_smem) <= ctx.gpu().smem_per_block_optin, op, ": needs ", std::max(dkdv_smem, dq_smem),
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  const BShape g{.Tq = attention_tq(p),
                 .Tk = attention_tk(p),
                 .H = p.H,
                 .group = p.H / attention_kv_heads(p),
                 .Dh = p.Dh,
                 .q_offset = p.q_offset,
                 .causal = p.causal,
                 .key_lens = p.key_lens.defined() ? p.key_lens.as<int32_t>() : nullptr};
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  auto dq = drop.threshold ? flash_general_backward_dq_wgmma<T, kD, true>
                           : flash_general_backward_dq_wgmma<T, kD, false>;
  TS_CHECK_CUDA(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dq_smem)));
  dq<<<dim3(cuda::ceil_div(g.Tq, kBlockRows), p.H, p.B), kThreads, dq_smem, ctx.stream()>>>(maps[0], maps[1], maps[2],
                                                                                            maps[3], out_view<T>(a.dq),
                                                                                            a.lse_in, a.D, g, scale,
                                                                                            scale * kLog2e, drop);
  TS_CHECK_LAUNCH();
  auto dkdv = drop.threshold ? flash_general_backward_dkdv_wgmma<T, kD, true>
                             : flash_general_backward_dkdv_wgmma<T, kD, false>;
  TS_CHECK_CUDA(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dkdv_smem)));
  dkdv<<<dim3(cuda::ceil_div(g.Tk, kBlockRows), attention_kv_heads(p), p.B), kThreads, dkdv_smem, ctx.stream()>>>(
      maps[0], maps[1], maps[2], maps[3], out_view<T>(a.dk), out_view<T>(a.dv), a.lse_in, a.D, g, scale, scale * kLog2e,
      drop);
  TS_CHECK_LAUNCH();
}

// True where flash::store_rows may store into v: a 4-byte aligned base and even strides (4-byte pairs).
bool pair_storable(const AttentionView<void>& v) {
  return reinterpret_cast<uintptr_t>(v.data) % 4 == 0 && v.sb % 2 == 0 && v.st % 2 == 0 && v.sh % 2 == 0;
}

}  // namespace
}  // namespace flash_hopper

bool flash_general_backward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashGeneralArgs& a,
                                        Context& ctx) {
  TS_CHECK(flash_hopper_general_backward_eligible(p, dtype, ctx), "attention_backward (Hopper path): not eligible ",
           "for Dh=", p.Dh, ", ", dtype_name(dtype), " on this device");
  TS_CHECK(a.D != nullptr && a.lse_in != nullptr, "attention_backward (Hopper path): no lse or D");
  const int Tq = attention_tq(p), Tk = attention_tk(p), Hkv = attention_kv_heads(p);
  if (p.B == 0) return true;
  // A tensor map needs every dimension at least 1: an empty query or key sequence runs mma.sync.
  if (Tq == 0 || Tk == 0) return false;
  if (!flash_hopper::pair_storable(a.dq) || !flash_hopper::pair_storable(a.dk) || !flash_hopper::pair_storable(a.dv))
    return false;
  CUtensorMap maps[4];
  const int box = flash_hopper::bwd::kBoxRows;
  if (!flash_hopper::make_view_map(&maps[0], dtype, a.q.data, p.Dh, p.H, Tq, p.B, a.q.sb, a.q.st, a.q.sh, box) ||
      !flash_hopper::make_view_map(&maps[1], dtype, a.k.data, p.Dh, Hkv, Tk, p.B, a.k.sb, a.k.st, a.k.sh, box) ||
      !flash_hopper::make_view_map(&maps[2], dtype, a.v.data, p.Dh, Hkv, Tk, p.B, a.v.sb, a.v.st, a.v.sh, box) ||
      !flash_hopper::make_view_map(&maps[3], dtype, a.d_out.data, p.Dh, p.H, Tq, p.B, a.d_out.sb, a.d_out.st,
                                   a.d_out.sh, box))
    return false;
  auto launch = [&](auto t) {
    using T = decltype(t);
    if (flash_hopper_head_pad(p.Dh) == 64) flash_hopper::launch_general_backward<T, 64>(p, a, maps, ctx);
    else flash_hopper::launch_general_backward<T, 128>(p, a, maps, ctx);
  };
  if (dtype == DType::BF16) launch(__nv_bfloat16{});
  else launch(__half{});
  return true;
}

}  // namespace tessera
