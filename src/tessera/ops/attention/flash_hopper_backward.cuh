// tessera/ops/attention/flash_hopper_backward.cuh — what the two Hopper backwards share (flash_hopper_backward.cu,
// the packed call's plain case; flash_hopper_general_backward.cu, the general call): the block shape, the tile
// layouts and their shared-memory sizes, the TMA tile loads, the score products, the producer's ring of streamed
// tiles and warp 1's staged lse and D, the consumers' per-tile steps (P, dS, dQ += dS K, dV and dK) and the dK / dV
// pass's queued pipeline. flash_hopper_backward.cu's header comment holds the schedule both follow;
// flash_hopper_kernel.cuh the descriptor, swizzle and fragment layouts. Every asm here exists only on sm_90a: the
// kernels call these only under __CUDA_ARCH_FEAT_SM90_ALL. CUDA sources only.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tessera/ops/attention/flash_hopper_kernel.cuh"
#include "tessera/ops/attention/flash_kernel.cuh"

namespace tessera::flash_hopper::bwd {

constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kBlockRows = 128;  // the block's stationary rows (queries of the dQ pass, keys of dK / dV), 64 a consumer
constexpr int kBoxRows = 64;     // rows of a TMA box: a 64-row tile is one, a 128-row (block) tile two
constexpr int kStages = 2;
constexpr int kBoxBytes = kBoxRows * kBoxCols * 2;  // one TMA box: 64 rows x 128 bytes
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
constexpr float kLog2e = 1.4426950408889634f;

// A tile of `rows` rows x kD columns: kD / 64 column boxes of rows x 128 bytes, box after box.
template <int kD>
constexpr int step_tile_bytes() {
  return (kD / kBoxCols) * kBoxBytes;
}
template <int kD>
constexpr int block_tile_bytes() {
  return 2 * step_tile_bytes<kD>();
}
// The dK / dV pass's query tiles: 128 rows at Dh 64, so that its score products are m64n128k16 (measured faster
// than 64-row tiles: bench/results/2026-12-01-dq-pass-128-keys-h200.md); 64 at Dh 128, where a second 64 columns of Sᵀ
// and dPᵀ beside dK and dV would not fit the registers (ptxas spills and serializes the wgmmas: C7512).
template <int kD>
constexpr int dkdv_query_rows() {
  return kD == 64 ? 128 : 64;
}
template <int kD, int kQRows = dkdv_query_rows<kD>()>
constexpr int dkdv_query_tile_bytes() {  // a Q or dO tile of the dK / dV pass, of kQRows rows
  static_assert(kQRows == 64 || kQRows == 128, "a query tile is one or two 64-row boxes");
  return kQRows == 128 ? block_tile_bytes<kD>() : step_tile_bytes<kD>();
}
template <int kD>
constexpr size_t dkdv_smem_bytes() {  // K and V, kStages x (Q, dO) tiles, 1024 to align to a swizzle atom
  return static_cast<size_t>(2 * block_tile_bytes<kD>() + 2 * kStages * dkdv_query_tile_bytes<kD>()) + 1024;
}

// The byte offset of k16 step kk inside a K-major tile whose column boxes are box_bytes apart.
__device__ __forceinline__ uint32_t k_step(int kk, int box_bytes) { return (kk / 4) * box_bytes + (kk % 4) * 32; }

// Loads the 128 rows starting at row0 of head `head` of `map` (make_heads_map) into a block tile at dst (two 64-row
// boxes per column box), completing on bar: the stationary tiles, and the 128-row streamed tiles.
template <int kD>
__device__ __forceinline__ void load_block_tile(uint32_t dst, const CUtensorMap* map, int head, int row0, int b,
                                                uint64_t* bar) {
  for (int bx = 0; bx < kD / kBoxCols; ++bx)
    for (int half = 0; half < 2; ++half)
      tma_load_4d(dst + bx * 2 * kBoxBytes + half * kBoxBytes, map, bx * kBoxCols, head, row0 + half * kBoxRows, b,
                  bar);
}
template <int kD>
__device__ __forceinline__ void load_step_tile(uint32_t dst, const CUtensorMap* map, int head, int row0, int b,
                                               uint64_t* bar) {
  for (int bx = 0; bx < kD / kBoxCols; ++bx) tma_load_4d(dst + bx * kBoxBytes, map, bx * kBoxCols, head, row0, b, bar);
}

// x = A0 B0ᵀ and y = A1 B1ᵀ (64 x kN each, f32), two commit groups (x's first, so that a wait for all but the
// latest group makes x alone complete): A0 / A1 the warpgroup's 64 rows of block tiles
// (column boxes 2 kBoxBytes apart), B0 / B1 tiles of kN rows (64: step tiles, column boxes kBoxBytes apart; 128:
// block tiles), all K-major over the kD head columns. The dQ pass's S = Q Kᵀ, dP = dO Vᵀ (kN = 128) and the
// dK / dV pass's Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (kN = dkdv_query_rows: 128 at Dh 64, 64 at Dh 128).
template <typename T, int kD, int kN>
__device__ __forceinline__ void issue_two_scores(float (&x)[kN / 8][4], float (&y)[kN / 8][4], uint32_t a0, uint32_t b0,
                                                 uint32_t a1, uint32_t b1) {
  static_assert(kN == 64 || kN == 128, "one or two 64-row boxes");
  constexpr int kBBox = kN / 64 * kBoxBytes;  // B's column-box stride
  auto mma = [](float(&d)[kN / 8][4], uint64_t da, uint64_t db, int scale_d) {
    if constexpr (kN == 64) wgmma_ss_n64<T>(d, da, db, scale_d);
    else wgmma_ss_n128<T>(d, da, db, scale_d);
  };
  const uint64_t desc_a0 = desc_k_major(a0), desc_b0 = desc_k_major(b0), desc_a1 = desc_k_major(a1),
                 desc_b1 = desc_k_major(b1);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    mma(x, desc_plus(desc_a0, k_step(kk, 2 * kBoxBytes)), desc_plus(desc_b0, k_step(kk, kBBox)), kk > 0 ? 1 : 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    mma(y, desc_plus(desc_a1, k_step(kk, 2 * kBoxBytes)), desc_plus(desc_b1, k_step(kk, kBBox)), kk > 0 ? 1 : 0);
  wgmma_commit();
}

// x = A Bᵀ alone, one commit group, laid out as either product of issue_two_scores.
template <typename T, int kD, int kN>
__device__ __forceinline__ void issue_one_score(float (&x)[kN / 8][4], uint32_t a, uint32_t b) {
  constexpr int kBBox = kN / 64 * kBoxBytes;
  const uint64_t desc_a = desc_k_major(a), desc_b = desc_k_major(b);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    if constexpr (kN == 64)
      wgmma_ss_n64<T>(x, desc_plus(desc_a, k_step(kk, 2 * kBoxBytes)), desc_plus(desc_b, k_step(kk, kBBox)),
                      kk > 0 ? 1 : 0);
    else
      wgmma_ss_n128<T>(x, desc_plus(desc_a, k_step(kk, 2 * kBoxBytes)), desc_plus(desc_b, k_step(kk, kBBox)),
                       kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// A query tile of kQRows rows (the dK / dV pass's streamed Q and dO) from row0 of head `head` of `map`: one block
// tile or one step tile.
template <int kD, int kQRows>
__device__ __forceinline__ void load_query_tile(uint32_t dst, const CUtensorMap* map, int head, int row0, int b,
                                                uint64_t* bar) {
  if constexpr (kQRows == 128) load_block_tile<kD>(dst, map, head, row0, b, bar);
  else load_step_tile<kD>(dst, map, head, row0, b, bar);
}

// Thread 0, before the __syncthreads that publishes them: the stationary tiles' barrier (one arrival with the byte
// count), and per stage the full barrier (full_arrivals: the TMA thread's, and in the dK / dV pass warp 1's 32) and
// the empty one (every consumer thread arrives).
__device__ __forceinline__ void init_barriers(uint64_t& bar_stationary, uint64_t (&bar_full)[kStages],
                                              uint64_t (&bar_empty)[kStages], uint32_t full_arrivals) {
  mbar_init(&bar_stationary, 1);
  for (int s = 0; s < kStages; ++s) {
    mbar_init(&bar_full[s], full_arrivals);
    mbar_init(&bar_empty[s], kConsumerThreads);
  }
  mbar_fence_init();
}

// The producer's loop over streamed tiles: tile t (0 ..) of n into stage t % kStages, after the consumers released
// the tile that used the stage before it; `load(t, stage, bar)` issues the copies.
template <typename F>
__device__ __forceinline__ void produce_steps(int n, int bytes, uint64_t* bar_full, uint64_t* bar_empty, F&& load) {
  for (int t = 0; t < n; ++t) {
    const int s = t % kStages;
    if (t >= kStages) mbar_wait(&bar_empty[s], ((t / kStages) - 1) & 1);
    mbar_arrive_expect_tx(&bar_full[s], bytes);
    load(t, s, &bar_full[s]);
  }
}

// The dQ pass streams K / V tiles of 128 keys (two 64-row TMA boxes per column box, laid out as a block tile), so
// that S = Q Kᵀ and dP = dO Vᵀ are m64n128k16 products: measured faster than 64-key tiles (m64n64k16) at Dh 128,
// and no slower at Dh 64 (bench/results/2026-12-01-dq-pass-128-keys-h200.md).
constexpr int kDqKeys = 128;
static_assert(kDqKeys == kBlockRows, "the dQ pass's K / V tiles are laid out and loaded as block tiles");
template <int kD>
constexpr size_t dq_smem_bytes() {  // Q and dO, kStages x (K, V) tiles of kDqKeys rows, 1024 to align
  return static_cast<size_t>(2 * block_tile_bytes<kD>() + 2 * kStages * block_tile_bytes<kD>()) + 1024;
}

// ---- the dQ pass's consumer steps (a lane's rows row_a and row_a + 8 as the halves e >> 1) ----
// P = exp2(S scale_log2 - lse log2e) in place of the scores S (lse2: the rows' lse log2e).
template <int kN8>
__device__ __forceinline__ void dq_probs(float (&s)[kN8][4], float scale_log2, const float (&lse2)[2]) {
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = flash::exp2_approx(s[n][e] * scale_log2 - lse2[e >> 1]);
}
// dS = P ∘ (dP - D) in place of P (Dr: the rows' D).
template <int kN8>
__device__ __forceinline__ void dq_dscores(float (&p)[kN8][4], const float (&dp)[kN8][4], const float (&Dr)[2]) {
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[n][e] *= dp[n][e] - Dr[e >> 1];
}
// dQ += dS K: dS as A fragments (16 keys a step), K the stage's kDqKeys-row block tile at sK, MN-major; one commit
// group.
template <typename T, int kD>
__device__ __forceinline__ void issue_dq(float (&dq)[kD / kBoxCols][8][4], const uint32_t (&dsa)[kDqKeys / 16][4],
                                         uint32_t sK) {
  constexpr int kKvBoxBytes = block_tile_bytes<kD>() / (kD / kBoxCols);  // a column box: kDqKeys rows x 128 bytes
  const uint64_t desc_k = desc_mn_major(sK);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDqKeys / 16; ++kk)
#pragma unroll
    for (int bx = 0; bx < kD / kBoxCols; ++bx)
      wgmma_rs_n64<T>(dq[bx], dsa[kk], desc_plus(desc_k, bx * kKvBoxBytes + kk * 16 * 128), 1);
  wgmma_commit();
}

// ---- the dK / dV pass ----
// The producer's warp 1: for each of the n steps, once its stage is free, the step's query tile's lse (log2 units;
// +inf past Tq, so P = 0) and D into shared memory, kQRows / 32 queries a lane; its arrival on the stage's full
// barrier releases them to the consumers, which would otherwise stall on loading them from global memory, per
// accumulator column. stat_base(t): the (b, head) row of lse and D; q0(t): the tile's first query.
template <int kQRows, typename StatBase, typename Q0>
__device__ __forceinline__ void stage_query_stats(float (&s_lse)[kStages][kQRows], float (&s_D)[kStages][kQRows],
                                                  uint64_t (&bar_full)[kStages], uint64_t (&bar_empty)[kStages],
                                                  const float* __restrict__ lse, const float* __restrict__ D, int Tq,
                                                  int n, StatBase&& stat_base, Q0&& q0) {
  const int lane = threadIdx.x % 32;
  for (int t = 0; t < n; ++t) {
    const int s = t % kStages;
    if (t >= kStages) mbar_wait(&bar_empty[s], ((t / kStages) - 1) & 1);
    const int64_t base = stat_base(t);
    const int q_first = q0(t);
    for (int c = 0; c < kQRows / 32; ++c) {
      const int ql = (kQRows / 32) * lane + c, q = q_first + ql;
      s_lse[s][ql] = q < Tq ? lse[base + q] * kLog2e : INFINITY;
      s_D[s][ql] = q < Tq ? D[base + q] : 0.0f;
    }
    mbar_arrive(&bar_full[s]);
  }
}

// A lane's query columns of a transposed tile are q0 + 8n + 2 (l % 4) + c (accumulators e = c and c + 2), with
// their lse and D at ql = 8n + 2 (l % 4) + c of the stage's staged rows.
// Pᵀ = exp2(Sᵀ scale_log2 - lse log2e) in place of Sᵀ.
template <int kN8>
__device__ __forceinline__ void dkdv_probs(float (&st)[kN8][4], float scale_log2, const float* s_lse) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      st[n][e] = flash::exp2_approx(st[n][e] * scale_log2 - s_lse[n * 8 + 2 * (lane & 3) + (e & 1)]);
}
// dSᵀ = Pᵀ ∘ (dPᵀ - D) in place of dPᵀ.
template <int kN8>
__device__ __forceinline__ void dkdv_dscores(float (&dpt)[kN8][4], const float (&pt)[kN8][4], const float* s_D) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[n][e] = pt[n][e] * (dpt[n][e] - s_D[n * 8 + 2 * (lane & 3) + (e & 1)]);
}

// dV += Pᵀ dO and dK += dSᵀ Q (Pᵀ, dSᵀ as A fragments, 16 queries a step; dO, Q the stage's tiles at sdO, sQ,
// MN-major), one commit group.
template <typename T, int kD, int kQRows>
__device__ __forceinline__ void issue_dvdk(float (&dv)[kD / kBoxCols][8][4], float (&dk)[kD / kBoxCols][8][4],
                                           const uint32_t (&pa)[kQRows / 16][4], const uint32_t (&dsa)[kQRows / 16][4],
                                           uint32_t sdO, uint32_t sQ) {
  constexpr int kQBoxBytes = dkdv_query_tile_bytes<kD, kQRows>() / (kD / kBoxCols);  // kQRows rows x 128 bytes
  const uint64_t desc_do = desc_mn_major(sdO), desc_q = desc_mn_major(sQ);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kQRows / 16; ++kk)
#pragma unroll
    for (int bx = 0; bx < kD / kBoxCols; ++bx) {
      wgmma_rs_n64<T>(dv[bx], pa[kk], desc_plus(desc_do, bx * kQBoxBytes + kk * 16 * 128), 1);
      wgmma_rs_n64<T>(dk[bx], dsa[kk], desc_plus(desc_q, bx * kQBoxBytes + kk * 16 * 128), 1);
    }
  wgmma_commit();
}

// The dK / dV pass's consumer loop at 128-row query tiles (compiled width 64), over n >= 1 steps (stage t % kStages
// for step t): step t + 1's Sᵀ is queued on the tensor cores behind step t's dV and dK, so that they do not wait
// for this consumer to come round the loop and issue it (measured faster at T 4k and 16k, level at 1k:
// bench/results/2026-12-03-dkdv-next-scores-queued-h200.md). A trip issues step t's dPᵀ (step t's Sᵀ complete),
// then step t's dV, dK and step t + 1's Sᵀ, and waits for all of them, so that no wgmma is in flight across the
// loop's back edge: ptxas serialized every wgmma of the loop (C7514) when step t + 1's Sᵀ was left in flight into
// the next trip. Pᵀ, dSᵀ and the next Sᵀ fit beside dK and dV; with the next dPᵀ too they would not (C7512).
//   st, dpt: Sᵀ and dPᵀ (64 keys of this warpgroup x kQRows queries); sKw, sVw: the warpgroup's 64 rows of the
//   stationary K and V; sQ(s), sdO(s): stage s's tiles; grads(s, t): step t's Pᵀ and dSᵀ from st (complete) and
//   dpt (the last group issued, waited for inside); dvdk(s): issues dV += Pᵀ dO, dK += dSᵀ Q of stage s.
template <typename T, int kD, int kQRows, typename SQ, typename SDO, typename Grads, typename DvDk>
__device__ __forceinline__ void dkdv_steps_queued(int n, float (&st)[kQRows / 8][4], float (&dpt)[kQRows / 8][4],
                                                  uint32_t sKw, uint32_t sVw, SQ&& sQ, SDO&& sdO,
                                                  uint64_t (&bar_full)[kStages], uint64_t (&bar_empty)[kStages],
                                                  Grads&& grads, DvDk&& dvdk) {
  auto trip = [&](int t, auto last) {
    const int s = t % kStages;
    issue_one_score<T, kD, kQRows>(dpt, sVw, sdO(s));
    grads(s, t);
    if constexpr (!decltype(last)::value) {
      const int s1 = (t + 1) % kStages;
      mbar_wait(&bar_full[s1], ((t + 1) / kStages) & 1);  // with no wgmma in flight
      dvdk(s);
      issue_one_score<T, kD, kQRows>(st, sKw, sQ(s1));
      wgmma_wait<1>();
      mbar_arrive(&bar_empty[s]);
      wgmma_wait<0>();
      flash_hopper::fence_regs(st);
    } else {
      dvdk(s);
      wgmma_wait<0>();
      mbar_arrive(&bar_empty[s]);
    }
  };
  mbar_wait(&bar_full[0], 0);
  issue_one_score<T, kD, kQRows>(st, sKw, sQ(0));
  wgmma_wait<0>();
  flash_hopper::fence_regs(st);
  // The last trip peeled, so that no wgmma sits under a branch ptxas cannot prove uniform.
  for (int t = 0; t + 1 < n; ++t) trip(t, std::false_type{});
  trip(n - 1, std::true_type{});
}

}  // namespace tessera::flash_hopper::bwd
