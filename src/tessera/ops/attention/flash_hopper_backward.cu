// FlashAttention backward for Hopper (sm_90a): the two deterministic passes of flash.h (a dQ pass per query tile,
// a dK / dV pass per key tile, no atomics), each product a wgmma fed by TMA, warp-specialized like the forward
// (flash_hopper_forward.cu). See flash_hopper.h for the contract and flash_hopper_kernel.cuh for the descriptor,
// swizzle and fragment layouts. Every operand use here is one the forward already makes:
//   K-major from a row tile (rows = m or n, the head columns = k): Q as A of S = Q Kᵀ, K as B of it;
//   MN-major from a row tile (rows = k, the head columns = n): V as B of O = P V;
//   A from registers (an accumulator rounded by flash::c_to_a): P of O = P V.
//
// qkv: (B*T, 3C) and d_out: (B*T, C) through 4-D tensor maps over their heads with (64-column, 1-head, 64-row, 1)
// boxes (make_heads_map: rows past T, and columns from Dh up to the compiled width kD, read as zeros, so that a
// narrower head runs zero-padded as in the forward); lse, D: (B, H, T) f32; d_qkv: (B*T, 3C), its q columns written
// by the dQ pass and its k, v columns by the dK / dV pass, each element once by one thread (columns below Dh).
//
// Block: 384 threads = a producer warpgroup (one thread issues the TMA loads; setmaxnreg 24) and two consumer
// warpgroups (setmaxnreg 240) that each own 64 rows of the block's 128; a 2-stage ring of streamed tiles (128 rows
// in the dQ pass; in the dK / dV pass 128 at compiled width 64 and 64 at 128: dkdv_query_rows).
//   dQ pass, grid (ceil(T/128), H, B), block x taking query tile n - 1 - x (the longest first under a causal mask):
//     the block's Q and dO stay; each consumer first computes D = rowsum(dO ∘ O) of its 64 rows from O (global)
//     and the dO tile, and writes it for the dK / dV pass (or, given no O, reads D computed before);
//     per key tile (128 keys, up to the diagonal under a causal mask), for consumer c
//     (queries q0 + 64c ..; on the diagonal tile consumer 0's 64 keys past its queries are masked, not skipped):
//       S = Q Kᵀ, dP = dO Vᵀ            wgmma m64n128k16 from shared memory, kD/16 steps each
//       P = exp2(S log2e / sqrt(Dh) - lse log2e) (0 where masked),  dS = P ∘ (dP - D)
//       dQ += dS K                       wgmma m64n64k16 per 64 head columns and 16 keys, dS from registers,
//                                        K MN-major
//     the two consumers take turns issuing (S and dP in one turn, dQ += dS K in the next), so that one's
//     exponentials run while the other's products do; dQ / sqrt(Dh) stored at the end.
//   dK / dV pass, grid (ceil(T/128), H, B), block x = key tile x: the block's K and V stay; per query tile (R =
//     128 or 64 queries, from the diagonal on under a causal mask), for consumer c (keys k0 + 64c ..):
//       Sᵀ = K Qᵀ, dPᵀ = V dOᵀ           wgmma m64nRk16 from shared memory
//       Pᵀ = exp2(Sᵀ log2e / sqrt(Dh) - lse log2e),  dSᵀ = Pᵀ ∘ (dPᵀ - D)  (lse and D per query, i.e. per column:
//                                        the producer's warp 1 stages them in shared memory with each tile)
//       dV += Pᵀ dO, dK += dSᵀ Q          wgmma m64n64k16 per 64 head columns, Pᵀ / dSᵀ from registers,
//                                        dO / Q MN-major
//     At compiled width 64 the next tile's Sᵀ is issued with this tile's dV and dK, queued behind them;
//     dK / sqrt(Dh) and dV stored at the end.
//   Attention dropout (flash.h): each pass draws its keep bits while the tensor cores compute dP (dPᵀ); the dQ pass
//   takes dP = Z ∘ (dO Vᵀ), the dK / dV pass dPᵀ = Zᵀ ∘ (V dOᵀ) and (P ∘ Z)ᵀ for dV.
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
#error "flash_hopper_backward.cu: wgmma needs the sm_90a target; build with CMAKE_CUDA_ARCHITECTURES=90a"
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_FLASH_HOPPER_DEVICE 1
#endif

namespace tessera {
namespace flash_hopper {
namespace {

using namespace bwd;  // NOLINT(google-build-using-namespace): the shared backward pieces

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dq_wgmma(const __grid_constant__ CUtensorMap qkv_map,
                                      const __grid_constant__ CUtensorMap do_map, T* __restrict__ d_qkv,
                                      const float* __restrict__ lse, const T* __restrict__ out, float* D, int seq_len,
                                      int H, int Dh, bool causal, float scale, float scale_log2,
                                      AttentionDropoutDraw drop, flash::RopeTable rope) {
#if defined(TESSERA_FLASH_HOPPER_DEVICE)
  attention_dropout_resolve(drop);
  constexpr int kKeys = kDqKeys;
  constexpr int kBoxes = kD / kBoxCols, kBlockTile = block_tile_bytes<kD>(), kKvTile = kBlockTile;
  constexpr int kN8 = kKeys / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_full[kStages], bar_empty[kStages];
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = smem0, sdO = smem0 + kBlockTile;
  auto sK = [&](int s) { return smem0 + 2 * kBlockTile + 2 * s * kKvTile; };
  auto sV = [&](int s) { return sK(s) + kKvTile; };

  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = q_tile * kBlockRows;
  const int C = H * Dh;
  const int n_kt_all = (seq_len + kKeys - 1) / kKeys;
  const int n_kt = causal ? min((q0 + kBlockRows - 1) / kKeys + 1, n_kt_all) : n_kt_all;

  if (threadIdx.x == 0) {
    tma_prefetch_maps(&qkv_map, &do_map);
    init_barriers(bar_q, bar_full, bar_empty, /*full_arrivals=*/1);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&bar_q, 2 * kBlockTile);
      load_block_tile<kD>(sQ, &qkv_map, h, q0, b, &bar_q);
      load_block_tile<kD>(sdO, &do_map, h, q0, b, &bar_q);
      produce_steps(n_kt, 2 * kKvTile, bar_full, bar_empty, [&](int j, int s, uint64_t* bar) {
        load_block_tile<kD>(sK(s), &qkv_map, H + h, j * kKeys, b, bar);
        load_block_tile<kD>(sV(s), &qkv_map, 2 * H + h, j * kKeys, b, bar);
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
  const int64_t stat_base = (static_cast<int64_t>(b) * H + h) * seq_len;
  float lse2[2], Dr[2];
  if (out) {
    // D = rowsum(dO ∘ O) of the warpgroup's 64 rows, from O (loaded now, so the loads overlap the wait for the Q
    // and dO tiles) and the dO tile in shared memory: thread tid takes row q_first + tid / 2, the half tid % 2 of
    // its kD columns, in 16-byte chunks (zeros from Dh on, as in the dO tile). Written for the dK / dV pass, and
    // handed to the lanes that hold the row in their accumulators by a shuffle (row q_first + 16 w + i is thread
    // 2 i of warp w).
    constexpr int kChunks = kD / 16;  // 8-column chunks in half a row
    const int rl = tid / 2, col0 = (tid % 2) * (kD / 2), r = q_first + rl;
    cuda::RawUnit<T, 8> o_raw[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      o_raw[c] = r < seq_len && col0 + 8 * c < Dh
                     ? cuda::load_raw<T, 8>(out + (static_cast<int64_t>(b) * seq_len + r) * C + h * Dh + col0 + 8 * c)
                     : cuda::RawUnit<T, 8>{};
    mbar_wait(&bar_q, 0);
    float d = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      // Chunk (col0 + 8c) / 8 of the row: column box col / 64, 16-byte unit u = (col % 64) / 8 of the box's
      // 128-byte row rl, stored at unit u ^ (rl % 8) (the 128-byte swizzle).
      const int col = col0 + 8 * c, u = (col % 64) / 8;
      uint4 g;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(g.x), "=r"(g.y), "=r"(g.z), "=r"(g.w)
                   : "r"(sdOw + (col / 64) * 2 * kBoxBytes + rl * 128 + ((u ^ (rl % 8)) << 4)));
      const auto gu = __builtin_bit_cast(cuda::RawUnit<T, 8>, g);
#pragma unroll
      for (int k = 0; k < 8; ++k) d = fmaf(cuda::to_f32(gu.v[k]), cuda::to_f32(o_raw[c].v[k]), d);
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    if (tid % 2 == 0 && r < seq_len) D[stat_base + r] = d;
    Dr[0] = __shfl_sync(0xffffffffu, d, 2 * (lane / 4));
    Dr[1] = __shfl_sync(0xffffffffu, d, 2 * (lane / 4 + 8));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int rr = row_a + 8 * half;
      lse2[half] = rr < seq_len ? lse[stat_base + rr] * kLog2e : 0.0f;
    }
  } else {
    flash::load_row_stats(lse2, Dr, lse, D, stat_base, row_a, seq_len);
  }
  float dq[kBoxes][8][4];
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) flash::zero(dq[bx]);
  float sacc[kN8][4], dpacc[kN8][4];
  mbar_wait(&bar_q, 0);

  // The consumers take turns issuing their products, as in the forward: a consumer issues only in its turn
  // (turn_wait / turn_pass, flash_hopper_kernel.cuh) and hands the turn over once they are issued, so that one
  // consumer's exponentials and dS run while the other's products do. Two turns a
  // tile: S and dP, then dQ += dS K. Consumer 0 goes first; consumer 1 makes no hand-over after its last turn, so
  // every arrival is waited for. The turns measured faster here; the same turns in the dK / dV pass measured
  // slower, so that pass has none (bench/results/2026-12-01-backward-turns-h200.md). No tile is skipped: with
  // 128-key tiles and 128 queries a block, n_kt stops at the diagonal tile, which both warpgroups need, and both
  // must take the same number of turns.
  static_assert(kKeys == kBlockRows, "a tile wholly past a warpgroup's last query would need a skip, and its turns");
  if (cw == 1) turn_pass(cw);
  for (int j = 0; j < n_kt; ++j) {
    const int s = j % kStages;
    const int k0 = j * kKeys;
    mbar_wait(&bar_full[s], (j / kStages) & 1);
    // S and dP in two commit groups: P's exponentials run while the tensor cores compute dP (the dK / dV pass does
    // the same; measured faster than one group at Dh 64, level at Dh 128:
    // bench/results/2026-12-01-split-waits-and-fused-d-h200.md).
    turn_wait(cw);
    issue_two_scores<T, kD, kKeys>(sacc, dpacc, sQw, sK(s), sdOw, sV(s));
    turn_pass(cw);
    wgmma_wait<1>();
    flash_hopper::fence_regs(sacc);
    // Only a tile on the diagonal or past T masks (a warpgroup-uniform branch); S = -inf there makes P = 0.
    if (k0 + kKeys > seq_len || (causal && k0 + kKeys - 1 > q_first))
      flash::mask_scores(sacc, k0, row_a, seq_len, causal);
    dq_probs(sacc, scale_log2, lse2);
    uint64_t keep = 0;  // drawn while dP is computed
    if (drop.threshold)
      keep = flash::keep_bits_query_rows<kN8>(drop, static_cast<uint64_t>(b) * H + h, seq_len, row_a, k0);
    wgmma_wait<0>();
    flash_hopper::fence_regs(dpacc);
    if (drop.threshold) flash::apply_keep_bits<kN8>(dpacc, keep, drop.scale);  // dP = Z ∘ (dO Vᵀ)
    dq_dscores(sacc, dpacc, Dr);                                               // dS, in place of P
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

  if (rope.cs) {
    flash::rope_rotate_back<kD / 16>([&](int n) -> float(&)[4] { return dq[n / 8][n % 8]; }, rope, row_w, seq_len);
  }
  const float scales[2] = {scale, scale};
  T* dq_base = d_qkv + static_cast<int64_t>(b) * seq_len * 3 * C + static_cast<int64_t>(h) * Dh;
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)  // the box's columns below Dh
    flash::store_rows<T, 8>(dq_base + bx * kBoxCols, 3 * C, dq[bx], row_w, seq_len, Dh - bx * kBoxCols, scales);
#endif
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dkdv_wgmma(const __grid_constant__ CUtensorMap qkv_map,
                                        const __grid_constant__ CUtensorMap do_map, T* __restrict__ d_qkv,
                                        const float* __restrict__ lse, const float* __restrict__ D, int seq_len, int H,
                                        int Dh, bool causal, float scale, float scale_log2, AttentionDropoutDraw drop,
                                        flash::RopeTable rope) {
#if defined(TESSERA_FLASH_HOPPER_DEVICE)
  attention_dropout_resolve(drop);
  constexpr int kQRows = dkdv_query_rows<kD>();
  static_assert(kQRows == 64 || kQRows == 128, "a query tile is one or two 64-row boxes");
  constexpr int kBoxes = kD / kBoxCols, kBlockTile = block_tile_bytes<kD>();
  constexpr int kStep = dkdv_query_tile_bytes<kD>(), kN8 = kQRows / 8;  // kStep: a Q or dO tile
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar_kv, bar_full[kStages], bar_empty[kStages];
  __shared__ float s_lse[kStages][kQRows], s_D[kStages][kQRows];  // per query of a stage: lse log2e, D
  const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = smem0, sV = smem0 + kBlockTile;
  auto sQ = [&](int s) { return smem0 + 2 * kBlockTile + 2 * s * kStep; };
  auto sdO = [&](int s) { return sQ(s) + kStep; };

  const int h = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kBlockRows;
  const int C = H * Dh;
  const int n_qt = (seq_len + kQRows - 1) / kQRows;
  const int i_begin = causal ? k0 / kQRows : 0;  // queries below k0 see none of these keys

  if (threadIdx.x == 0) {
    tma_prefetch_maps(&qkv_map, &do_map);
    init_barriers(bar_kv, bar_full, bar_empty, /*full_arrivals=*/1 + 32);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---- producer warpgroup ----
    regs_release<kProducerRegs>();
    if (threadIdx.x / 32 == 1) {  // lse and D of each query tile
      const int64_t stat_base = (static_cast<int64_t>(b) * H + h) * seq_len;
      stage_query_stats(
          s_lse, s_D, bar_full, bar_empty, lse, D, seq_len, n_qt - i_begin, [&](int) { return stat_base; },
          [&](int t) { return (i_begin + t) * kQRows; });
    }
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(&bar_kv, 2 * kBlockTile);
      load_block_tile<kD>(sK, &qkv_map, H + h, k0, b, &bar_kv);
      load_block_tile<kD>(sV, &qkv_map, 2 * H + h, k0, b, &bar_kv);
      produce_steps(n_qt - i_begin, 2 * kStep, bar_full, bar_empty, [&](int t, int s, uint64_t* bar) {
        const int q0 = (i_begin + t) * kQRows;
        load_query_tile<kD, kQRows>(sQ(s), &qkv_map, h, q0, b, bar);
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

  // A tile's Pᵀ and dSᵀ (into pa, dsa) from its Sᵀ, complete in st, and its dPᵀ, the last group issued: Pᵀ's
  // exponentials run while the tensor cores compute dPᵀ.
  auto tile_grads = [&](int s, int q0) {
    // Only a tile on the diagonal or with keys past T masks (a warpgroup-uniform branch): Sᵀ = -inf makes P = 0.
    // Queries past T need no mask: their staged lse is +inf, so P = 2^(S - inf) = 0 (their S is finite: TMA
    // fills rows past T with zeros).
    if (k0 + kBlockRows > seq_len || (causal && q0 < k_first + 63)) {
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = q0 + n * 8 + 2 * (lane & 3) + (e & 1), key = key_a + (e >> 1) * 8;
          if (key >= seq_len || (causal && key > q)) st[n][e] = -INFINITY;
        }
    }
    dkdv_probs(st, scale_log2, s_lse[s]);  // Pᵀ
    uint64_t keep = 0;                     // drawn while dPᵀ is computed
    if (drop.threshold)
      keep = flash::keep_bits_key_rows<kN8>(drop, static_cast<uint64_t>(b) * H + h, seq_len, key_a, q0);
    wgmma_wait<0>();
    flash_hopper::fence_regs(dpt);
    if (drop.threshold) flash::apply_keep_bits<kN8>(dpt, keep, drop.scale);  // dPᵀ = Zᵀ ∘ (V dOᵀ)
    dkdv_dscores(dpt, st, s_D[s]);                                           // dSᵀ, in place of dPᵀ
    if (drop.threshold) flash::apply_keep_bits<kN8>(st, keep, drop.scale);   // dV takes (P ∘ Z)ᵀ
    flash::c_to_a<T, kN8>(pa, st);
    flash::c_to_a<T, kN8>(dsa, dpt);
  };
  auto dvdk = [&](int s) { issue_dvdk<T, kD, kQRows>(dv, dk, pa, dsa, sdO(s), sQ(s)); };

  if constexpr (kQRows == 128) {
    // Compiled width 64: the next tile's Sᵀ queued behind this tile's dV and dK (dkdv_steps_queued). No causal
    // skip: every 128-query tile meets both consumers' keys. n_qt - i_begin >= 1: the block's first key is below T.
    dkdv_steps_queued<T, kD, kQRows>(
        n_qt - i_begin, st, dpt, sKw, sVw, sQ, sdO, bar_full, bar_empty,
        [&](int s, int t) { tile_grads(s, (i_begin + t) * kQRows); }, dvdk);
  } else {
    for (int i = i_begin; i < n_qt; ++i) {
      const int t = i - i_begin, s = t % kStages;
      const int q0 = i * kQRows;
      mbar_wait(&bar_full[s], (t / kStages) & 1);
      // Queries wholly before this warpgroup's first key see none of its keys (causal): this skips consumer 1's
      // first tile. The stage is still waited for and released: an arrival before the tile is loaded could count
      // toward the release of the tile before it.
      if (!causal || q0 + kQRows - 1 >= k_first) {
        // Sᵀ and dPᵀ in two commit groups, as in the dQ pass.
        issue_two_scores<T, kD, kQRows>(st, dpt, sKw, sQ(s), sVw, sdO(s));
        wgmma_wait<1>();
        flash_hopper::fence_regs(st);
        tile_grads(s, q0);
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

  if (rope.cs) {
    flash::rope_rotate_back<kD / 16>([&](int n) -> float(&)[4] { return dk[n / 8][n % 8]; }, rope, row_w, seq_len);
  }
  const float k_scales[2] = {scale, scale}, v_scales[2] = {1.0f, 1.0f};
  T* dk_base = d_qkv + static_cast<int64_t>(b) * seq_len * 3 * C + C + static_cast<int64_t>(h) * Dh;
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx) {  // the box's columns below Dh
    const int cols = Dh - bx * kBoxCols;
    flash::store_rows<T, 8>(dk_base + bx * kBoxCols, 3 * C, dk[bx], row_w, seq_len, cols, k_scales);
    flash::store_rows<T, 8>(dk_base + C + bx * kBoxCols, 3 * C, dv[bx], row_w, seq_len, cols, v_scales);
  }
#endif
}

template <typename T, int kD>
void launch_backward(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a, Context& ctx) {
  constexpr const char* op = "attention_backward (Hopper path)";
  constexpr size_t smem = dkdv_smem_bytes<kD>(), dq_smem = dq_smem_bytes<kD>();
  static_assert(std::max(smem, dq_smem) <= 227 * 1024, "more shared memory per block than sm_90 has");
  TS_CHECK(std::max(smem, dq_smem) <= ctx.gpu().smem_per_block_optin, op, ": needs ", std::max(smem, dq_smem),
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  const CUtensorMap qkv_map = make_heads_map(op, dtype, a.qkv, p.Dh, 3 * p.H, p.T, p.B, kBoxRows);
  const CUtensorMap do_map = make_heads_map(op, dtype, a.d_out, p.Dh, p.H, p.T, p.B, kBoxRows);
  const dim3 grid(cuda::ceil_div(p.T, kBlockRows), p.H, p.B);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  TS_CHECK(!a.rope_cs || p.Dh == kD, "internal: the Hopper passes rotate back RoPE only at Dh = ", kD);
  const flash::RopeTable rope{static_cast<const float2*>(a.rope_cs), a.rope_pos_offset};
  auto dq = flash_attention_backward_dq_wgmma<T, kD>;
  T* d_qkv = static_cast<T*>(a.d_qkv);
  TS_CHECK_CUDA(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dq_smem)));
  dq<<<grid, kThreads, dq_smem, ctx.stream()>>>(qkv_map, do_map, d_qkv, a.lse_in, static_cast<const T*>(a.out_in),
                                                a.D_out, p.T, p.H, p.Dh, p.causal, scale, scale * kLog2e, drop, rope);
  TS_CHECK_LAUNCH();
  auto dkdv = flash_attention_backward_dkdv_wgmma<T, kD>;
  TS_CHECK_CUDA(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  dkdv<<<grid, kThreads, smem, ctx.stream()>>>(qkv_map, do_map, d_qkv, a.lse_in, a.D_out, p.T, p.H, p.Dh, p.causal,
                                               scale, scale * kLog2e, drop, rope);
  TS_CHECK_LAUNCH();
}

}  // namespace
}  // namespace flash_hopper

void flash_attention_backward_hopper_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                          Context& ctx) {
  TS_CHECK(a.D_out != nullptr, "attention_backward (Hopper path): no D_out (the dQ pass computes or reads D in it)");
  TS_CHECK(a.out_in == nullptr || cuda::aligned16(a.out_in),
           "attention_backward (Hopper path): out is not 16-byte aligned; pass no out_in and D computed before");
  TS_CHECK(flash_hopper_backward_eligible(p, dtype, ctx), "attention_backward (Hopper path): not eligible for ",
           "Dh=", p.Dh, ", ", dtype_name(dtype), " on this device");
  const auto by_dtype = [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if (dtype == DType::BF16) flash_hopper::launch_backward<__nv_bfloat16, kD>(p, dtype, a, ctx);
    else flash_hopper::launch_backward<__half, kD>(p, dtype, a, ctx);
  };
  if (flash_hopper_head_pad(p.Dh) == 64) by_dtype(std::integral_constant<int, 64>{});
  else by_dtype(std::integral_constant<int, 128>{});
}

}  // namespace tessera
