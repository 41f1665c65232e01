// tessera/ops/attention/flash_hopper_backward.cuh — what the two Hopper backwards share (flash_hopper_backward.cu,
// the packed call's plain case; flash_hopper_general_backward.cu, the general call): the block shape, the tile
// layouts and their shared-memory sizes, the TMA tile loads, the score products and the producer's ring of streamed
// tiles. flash_hopper_backward.cu's header comment holds the schedule both follow; flash_hopper_kernel.cuh the
// descriptor, swizzle and fragment layouts. Every asm here exists only on sm_90a: the kernels call these only under
// __CUDA_ARCH_FEAT_SM90_ALL. CUDA sources only.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/ops/attention/flash_hopper_kernel.cuh"

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
template <int kD>
constexpr int dkdv_query_tile_bytes() {  // a Q or dO tile of the dK / dV pass
  return dkdv_query_rows<kD>() == 128 ? block_tile_bytes<kD>() : step_tile_bytes<kD>();
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

}  // namespace tessera::flash_hopper::bwd
