// tessera/ops/attention/flash_hopper_kernel.cuh — the sm_90a building blocks of the Hopper FlashAttention kernels
// (flash_hopper_forward.cu and the others): warpgroup MMA (wgmma) with shared-memory matrix descriptors, TMA bulk
// tensor copies (cp.async.bulk.tensor) completing on mbarriers, and the register-count hand-off between warpgroups
// (setmaxnreg); and, in namespace fwd, what the packed and the general forward share. Every asm here exists only on
// sm_90a; the callers compile it only under __CUDA_ARCH_FEAT_SM90_ALL. CUDA sources only.
//
// Shared-memory tiles (the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B, and the one wgmma's "128-byte
// swizzle" descriptors read). A tile of R rows x kD columns of 16-bit values is stored as kD / 64 column boxes,
// box after box; a box holds R rows of 64 values (128 bytes each), row r at byte 128 r, and its 16-byte chunk c
// (values 8c .. 8c + 7) at chunk position c ^ (r % 8). Every box starts 1024-byte aligned, so the hardware's XOR
// (address bits 4-6 with bits 7-9) is exactly that r % 8.
//
// Descriptors (PTX ISA, "Matrix Descriptor Format" of wgmma): bits 0-13 start address >> 4, 16-29 leading byte
// offset (LBO) >> 4, 32-45 stride byte offset (SBO) >> 4, 49-51 base offset (0: atoms 1024-aligned), 62-63
// swizzle mode (1 = 128 B).
//   K-major operand (Q as A of S = Q Kᵀ; K as B of it, rows = n): one k16 step reads 32 bytes of each row, all
//     inside one 128-byte swizzle row, so LBO is unused (1) and SBO = 1024 = the step from one 8-row group to the
//     next. Step kk (values 16 kk ..) starts at box kk / 4, byte 32 (kk % 4): the hardware adds the row offsets
//     and then swizzles the full address, so a start inside the 1024-byte atom selects chunks 2 (kk % 4) and
//     2 (kk % 4) + 1 before the XOR, the same chunks TMA swizzled.
//   MN-major operand (V as B of O = P V: k = key = row, n = head column, contiguous): a k16 step is 16 rows = two
//     8-row groups 1024 bytes apart, n spans 64 columns = one 128-byte swizzle row. The canonical MN-major
//     128-byte layout is ((64 n, m atoms), (8 k, groups)) with strides ((1, LBO), (64, SBO)) in values: LBO steps
//     between 64-column atoms and SBO between 8-row groups. Each wgmma here is n64, one atom, so LBO is never
//     used; it is set to 1024 like SBO, so the descriptor is right whichever of the two fields the hardware takes
//     for the 8-row step. Step kk starts at row 16 kk: byte 2048 kk, 1024-aligned.
//
// Accumulator fragments (PTX ISA, "wgmma .m64nNk16 register fragment for D", f32): warp w of the warpgroup owns
// rows 16 w .. 16 w + 15; lane l, g = l / 4, c = 2 (l % 4), register d[j][e] (j = n / 8) holds
//   e = 0, 1: (16 w + g, 8 j + c + e)    e = 2, 3: (16 w + g + 8, 8 j + c + e - 2)
// which is mma.m16n8's C layout repeated along n. The A fragment of an RS wgmma (A from registers, m64 x k16)
// is mma.m16n8k16's A layout per warp, so P's accumulators become A fragments with flash::c_to_a, as in the
// mma.sync kernels: A step kk takes n-tiles 2 kk and 2 kk + 1.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tessera/core/dtype.h"
#include "tessera/ops/attention/flash_kernel.cuh"

namespace tessera::flash_hopper {

constexpr uint64_t kSwizzle128B = 1;
constexpr int kBoxCols = 64;  // a TMA box's columns: 128 bytes of 16-bit values, the 128-byte swizzle span

// Host: a 4-D tensor map over the heads of a row-major 16-bit (B, T, heads * Dh) matrix: dimensions (Dh, heads,
// T, B) (row stride heads * Dh, batch stride T * heads * Dh), with (64-column, 1-head, box_rows-row, 1) boxes,
// 128-byte swizzle, zeros outside. A box at column 64 bx of head h holds that head's columns 64 bx .. 64 bx + 63,
// the ones at Dh and past it read as zeros (not the next head's): a head narrower than the kernels' compiled width
// runs zero-padded in it. Rows past T read as zeros too. `op` names the caller in its errors. Defined in
// attention_policy.cu (the kernel choice and the TMA descriptors).
CUtensorMap make_heads_map(const char* op, DType dtype, const void* base, int Dh, int heads, int T, int B,
                           int box_rows);
// The same over a (B, T, heads, Dh) view with element strides sb, st, sh (the general call's Q, K or V): false,
// leaving *map unspecified, where cuTensorMapEncodeTiled refuses it (a base not 16-byte aligned, a stride that is
// no multiple of 16 bytes); the caller then runs the mma.sync kernels.
bool make_view_map(CUtensorMap* map, DType dtype, const void* base, int Dh, int heads, int T, int B, int64_t sb,
                   int64_t st, int64_t sh, int box_rows);

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A 128-byte-swizzle descriptor at shared address `addr` with the given byte offsets (multiples of 16).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (kSwizzle128B << 62);
}
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) { return make_desc(addr, 16, 1024); }
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t addr) { return make_desc(addr, 1024, 1024); }
// The descriptor of the same operand `bytes` further on (a multiple of 16): make_desc(addr + bytes, ...) for a
// descriptor made at addr. Every shared address is below 2^18, so the start-address field (bits 0-13) takes the
// add without a carry, and only the low word changes. The kernels make each tile's descriptor once and step
// through it with this: building every k16 step's descriptor from its address cost ~11 integer instructions per
// wgmma (mask, shift, or, and four moves to uniform registers), a third of the backward's instructions at Dh 64.
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4), hi = static_cast<uint32_t>(desc >> 32);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
// The consumer warpgroup index as a value the compiler knows is the same in every lane (a broadcast from lane 0),
// so that addresses and descriptors derived from it live in uniform registers.
__device__ __forceinline__ int warpgroup_uniform(int threads_before) {
  return __shfl_sync(0xffffffffu, (static_cast<int>(threadIdx.x) - threads_before) / 128, 0);
}

// ---- turns between the two consumer warpgroups (cw 0 / 1) ----
// Consumer cw's turn is named barrier 1 + cw, completed by its own 128 threads syncing on it and the other
// consumer's 128 arriving: turn_wait blocks until the other consumer hands the turn over with turn_pass.
// Consumer 1 passes once before its first wait, so consumer 0 goes first; a kernel leaves no barrier part-arrived
// when both take the same number of turns and consumer 1 skips its last hand-over.
__device__ __forceinline__ void turn_wait(int cw) { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory"); }
__device__ __forceinline__ void turn_pass(int cw) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory"); }

// ---- wgmma ordering ----
// fence: before the first wgmma of a batch whose accumulators or A registers other instructions wrote.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Ties registers to the point after a wgmma_wait: the compiler sees the wgmma asm write them at issue, so without
// this it could read them between the issue and the wait.
template <int kN, int kE>
__device__ __forceinline__ void fence_regs(float (&r)[kN][kE]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < kE; ++e) asm volatile("" : "+f"(r[i][e])::"memory");
}

// The three wgmma shapes the attention kernels use, for T = __nv_bfloat16 and __half (the dtype only changes the
// instruction's type suffix, so one macro writes both):
//   wgmma_ss_n128: d (64 x 128, f32) = A B + (scale_d ? d : 0); A: 64 x 16 at desc_a, B: 128 (n) x 16 (k) at
//     desc_b, both K-major.
//   wgmma_ss_n64:  the same with B 64 (n) x 16 (k).
//   wgmma_rs_n64:  d (64 x 64, f32) = A B + (scale_d ? d : 0); A: 64 x 16 in registers (mma A fragments), B: 16 (k)
//     x 64 (n) at desc_b, MN-major (the n index contiguous: imm-trans-b = 1).
template <typename T>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

#define TESSERA_WGMMA_D32 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define TESSERA_WGMMA_D64 \
  TESSERA_WGMMA_D32, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), \
      "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), \
      "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), \
      "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define TESSERA_WGMMA_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TESSERA_WGMMA_REGS64 \
  TESSERA_WGMMA_REGS32 \
  "," \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// CT: the C++ type; PT: its PTX type name.
#define TESSERA_WGMMA_FOR(CT, PT) \
  template <> \
  __device__ __forceinline__ void wgmma_ss_n128<CT>(float(&d)[16][4], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." PT "." PT \
        " " \
        "{" TESSERA_WGMMA_REGS64 \
        "}, " \
        "%64, %65, p, 1, 1, 0, 0;\n}\n" \
        : TESSERA_WGMMA_D64 \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
  } \
  template <> \
  __device__ __forceinline__ void wgmma_ss_n64<CT>(float(&d)[8][4], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT \
        " " \
        "{" TESSERA_WGMMA_REGS32 \
        "}, " \
        "%32, %33, p, 1, 1, 0, 0;\n}\n" \
        : TESSERA_WGMMA_D32 \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
  } \
  template <> \
  __device__ __forceinline__ void wgmma_rs_n64<CT>(float(&d)[8][4], const uint32_t(&a)[4], uint64_t desc_b, \
                                                   int scale_d) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT \
        " " \
        "{" TESSERA_WGMMA_REGS32 \
        "}, " \
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
        : TESSERA_WGMMA_D32 \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)); \
  }

TESSERA_WGMMA_FOR(__nv_bfloat16, "bf16")
TESSERA_WGMMA_FOR(__half, "f16")

#undef TESSERA_WGMMA_FOR
#undef TESSERA_WGMMA_REGS64
#undef TESSERA_WGMMA_REGS32
#undef TESSERA_WGMMA_D64
#undef TESSERA_WGMMA_D32

// ---- mbarriers ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA) and the other threads (with a __syncthreads).
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(addr), "r"(parity)
                 : "memory");
  } while (!done);
}

// ---- TMA ----
// The box at coordinates (c0, c1, c2, c3) of a 4-D tensor map (make_heads_map: column, head, row, batch) ->
// shared memory at dst; completes `bar`'s transaction count by the box's bytes (elements outside the tensor are
// written as zeros and still counted).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Prefetches each map's descriptor, in argument order.
template <typename... Maps>
__device__ __forceinline__ void tma_prefetch_maps(const Maps*... maps) {
  (tma_prefetch_map(maps), ...);
}

// ---- registers ----
template <int kRegs>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- the forward's pieces ----
// What the two Hopper forwards share (flash_hopper_forward.cu, the packed call; flash_hopper_general.cu, the
// general call): the block shape, the shared-memory layout (Q, then kStages K tiles, then kStages V tiles, each
// kD / 64 boxes of 128 rows), the producer's TMA loop and the consumers' per-tile steps. flash_hopper_forward.cu's
// header comment holds the schedule both follow.
namespace fwd {

constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr int kBlockM = 128;  // queries per block, 64 per consumer warpgroup
constexpr int kBlockN = 128;  // keys per K/V tile
constexpr int kStages = 2;
constexpr int kBoxBytes = kBlockN * kBoxCols * 2;  // one 128-row box (Q boxes have kBlockM = kBlockN rows)
static_assert(kBlockM == kBlockN, "one tensor map box shape serves Q, K and V");
constexpr int kN8 = kBlockN / 8;                        // 8-key accumulator tiles of a score row
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 <= 65536
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
constexpr int tile_bytes() {
  return (kD / kBoxCols) * kBoxBytes;
}
template <int kD>
constexpr size_t smem_bytes() {  // Q, kStages x (K, V), and 1024 bytes to align the start to a swizzle atom
  return static_cast<size_t>(tile_bytes<kD>()) * (1 + 2 * kStages) + 1024;
}
// Stage s's K and V tiles, after the Q tile at smem0 (1024-aligned).
template <int kD>
__device__ __forceinline__ uint32_t k_stage(uint32_t smem0, int s) {
  return smem0 + tile_bytes<kD>() * (1 + s);
}
template <int kD>
__device__ __forceinline__ uint32_t v_stage(uint32_t smem0, int s) {
  return smem0 + tile_bytes<kD>() * (1 + kStages + s);
}

// The descriptor of the operand at base + off (make: desc_k_major or desc_mn_major). At Dh 128 it is stepped from
// base's (desc_plus; the compiler makes base's once per tile), at Dh 64 made from the address at each k16 step:
// with the warpgroup index uniform in both, stepping measured faster at Dh 128 and slower at Dh 64
// (bench/results/2026-12-01-wgmma-descriptors-h200.md).
template <int kD, typename Make>
__device__ __forceinline__ uint64_t desc_at(Make make, uint32_t base, uint32_t off) {
  if constexpr (kD == 128) return desc_plus(make(base), off);
  else return make(base + off);
}

// Thread 0, before the __syncthreads that publishes them: the Q barrier (one arrival with the byte count), and
// per stage the full barriers of K and V (the same) and their empty barriers (every consumer thread arrives).
__device__ __forceinline__ void init_barriers(uint64_t& bar_q, uint64_t (&bar_k)[kStages], uint64_t (&bar_v)[kStages],
                                              uint64_t (&bar_empty_k)[kStages], uint64_t (&bar_empty_v)[kStages]) {
  mbar_init(&bar_q, 1);
  for (int s = 0; s < kStages; ++s) {
    mbar_init(&bar_k[s], 1);
    mbar_init(&bar_v[s], 1);
    mbar_init(&bar_empty_k[s], kConsumerThreads);
    mbar_init(&bar_empty_v[s], kConsumerThreads);
  }
  mbar_fence_init();
}

// The producer's one thread: the Q tile (rows q0 .., head q_head of q_map) once, then K_j and V_j (rows 128 j .. of
// heads k_off + kv_head of k_map and v_off + kv_head of v_map) of every tile j < n_kt into stage j % kStages as the
// consumers free it. The packed call's one map holds query head h's Q, K and V as heads h, H + h and 2H + h.
template <int kD>
__device__ __forceinline__ void produce(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                        int q_head, int kv_head, int k_off, int v_off, uint64_t& bar_q,
                                        uint64_t (&bar_k)[kStages], uint64_t (&bar_v)[kStages],
                                        uint64_t (&bar_empty_k)[kStages], uint64_t (&bar_empty_v)[kStages],
                                        uint32_t smem0, int n_kt, int q0, int b) {
  constexpr int kBoxes = kD / kBoxCols, kTile = tile_bytes<kD>();
  const uint32_t sQ = smem0;
  mbar_arrive_expect_tx(&bar_q, kTile);
  for (int bx = 0; bx < kBoxes; ++bx) tma_load_4d(sQ + bx * kBoxBytes, q_map, bx * kBoxCols, q_head, q0, b, &bar_q);
  for (int j = 0; j < n_kt; ++j) {
    const int s = j % kStages;
    // Tile j - kStages used this stage; wait for the consumers' release of its K, then of its V (that phase's
    // parity): the pipelined consumers release K a tile before V.
    if (j >= kStages) mbar_wait(&bar_empty_k[s], ((j / kStages) - 1) & 1);
    mbar_arrive_expect_tx(&bar_k[s], kTile);
    for (int bx = 0; bx < kBoxes; ++bx)
      tma_load_4d(k_stage<kD>(smem0, s) + bx * kBoxBytes, k_map, bx * kBoxCols, k_off + kv_head, j * kBlockN, b,
                  &bar_k[s]);
    if (j >= kStages) mbar_wait(&bar_empty_v[s], ((j / kStages) - 1) & 1);
    mbar_arrive_expect_tx(&bar_v[s], kTile);
    for (int bx = 0; bx < kBoxes; ++bx)
      tma_load_4d(v_stage<kD>(smem0, s) + bx * kBoxBytes, v_map, bx * kBoxCols, v_off + kv_head, j * kBlockN, b,
                  &bar_v[s]);
  }
}

// Consumer cw: S = Q K_jᵀ (its 64 query rows of the Q tile at smem0, tile j's 128 keys) into sacc, one commit group,
// once K_j has landed.
template <typename T, int kD>
__device__ __forceinline__ void issue_scores(float (&sacc)[kN8][4], uint64_t (&bar_k)[kStages], uint32_t smem0, int cw,
                                             int j) {
  const int s = j % kStages;
  mbar_wait(&bar_k[s], (j / kStages) & 1);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t k_off = (kk / 4) * kBoxBytes + (kk % 4) * 32;
    wgmma_ss_n128<T>(sacc, desc_at<kD>(desc_k_major, smem0 + cw * 64 * 128, k_off),
                     desc_at<kD>(desc_k_major, k_stage<kD>(smem0, s), k_off), /*scale_d=*/kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// O += P V_j (P as A fragments in pa; O as kD / 64 accumulators of 64 columns), one commit group, once V_j has
// landed.
template <typename T, int kD>
__device__ __forceinline__ void issue_pv(float (&o)[kD / kBoxCols][8][4], const uint32_t (&pa)[kN8 / 2][4],
                                         uint64_t (&bar_v)[kStages], uint32_t smem0, int j) {
  const int s = j % kStages;
  mbar_wait(&bar_v[s], (j / kStages) & 1);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
    for (int bx = 0; bx < kD / kBoxCols; ++bx)
      wgmma_rs_n64<T>(o[bx], pa[kk], desc_at<kD>(desc_mn_major, v_stage<kD>(smem0, s), bx * kBoxBytes + kk * 16 * 128),
                      /*scale_d=*/1);
  wgmma_commit();
}

// The online softmax over one tile of this lane's raw scores s (complete and masked; rows row_a, row_a + 8 as the
// halves): per row, m' = max(m, rowmax s · scale_log2) (log2 units), P = exp2(s scale_log2 - m') in place of s,
// l = l 2^(m - m') + rowsum P (this lane's part: the quad's sum waits for the end), alpha = 2^(m - m'), the factor
// O must take before P V is added, and m = m'. The scores stay unscaled until here: the row max of raw scores,
// scaled, is the max of the scaled ones (scale > 0), and each P is one FFMA and one MUFU.
__device__ __forceinline__ void online_softmax(float (&s)[kN8][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               float scale_log2) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kN8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[half], mx * scale_log2);    // log2 units
    const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing valid yet keeps P = 0
    alpha[half] = flash::exp2_approx(m[half] - shift);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        s[n][e] = flash::exp2_approx(fmaf(s[n][e], scale_log2, -shift));
        sum += s[n][e];
      }
    l[half] = l[half] * alpha[half] + sum;
    m[half] = m_new;
  }
}

// O = O alpha, per row half (the online softmax's rescale before P V is added).
template <int kBoxes>
__device__ __forceinline__ void rescale_o(float (&o)[kBoxes][8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int bx = 0; bx < kBoxes; ++bx)
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      o[bx][n][0] *= alpha[0];
      o[bx][n][1] *= alpha[0];
      o[bx][n][2] *= alpha[1];
      o[bx][n][3] *= alpha[1];
    }
}

}  // namespace fwd

}  // namespace tessera::flash_hopper
