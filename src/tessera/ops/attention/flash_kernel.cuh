// tessera/ops/attention/flash_kernel.cuh — the device building blocks of the FlashAttention-2 kernels
// (flash_forward.cu, flash_backward_dq.cu, flash_backward_dkdv.cu): tensor-core mma.sync m16n8k16 with f32
// accumulators, ldmatrix, cp.async tile loads, and two warp-level GEMMs that cover every product of the
// forward and the backward. CUDA sources only.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16", 16-bit A/B, f32 C). Lane l, g = l / 4,
// c = 2 (l % 4):
//   A (16 x 16, row-major) a0: (g, c..c+1)   a1: (g+8, c..c+1)   a2: (g, c+8..c+9)   a3: (g+8, c+8..c+9)
//   B (16 x 8, "col")      b0: (k = c..c+1, n = g)               b1: (k = c+8..c+9, n = g)
//   C (16 x 8, f32)        c0, c1: (g, c), (g, c+1)              c2, c3: (g+8, c), (g+8, c+1)
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit values; lanes 8j..8j+7 give the eight row addresses of
// matrix j, and register j of lane l receives row l / 4, columns 2 (l % 4), +1 of matrix j (with .trans:
// rows 2 (l % 4), +1 of column l / 4, i.e. the transposed matrix).
//
// Shared-memory tiles are row-major with a row stride of kD + 8 elements, i.e. kD / 2 + 4 four-byte words (20,
// 36, 44, 68 for kD = 32, 64, 80, 128): the eight 16-byte row reads of one ldmatrix matrix start at words
// 0, s, ..., 7s mod 32, eight different multiples of 4, so they hit eight different groups of four banks and no
// ldmatrix has a bank conflict (no swizzle needed). Every row starts 16-byte aligned, as ldmatrix and cp.async need.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/core/error.h"
#include "tessera/ops/attention/attention_dropout.h"
#include "tessera/ops/attention/flash.h"

namespace tessera::flash {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;                  // one m16 row block per warp
constexpr int kTileRows = kWarps * kRowsPerWarp;  // 64: the query tile of the forward / dQ, the key tile of dK/dV
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
constexpr int smem_stride() {
  return kD + 8;
}

// 2^x on the MUFU unit alone (ex2.approx.ftz: within 2 ulp, results under 2^-126 flushed to 0), as FlashAttention
// gets it from --use_fast_math. Without fast math exp2f wraps every MUFU.EX2 in range scaling (a compare and two
// predicated multiplies per score), on the softmax's hottest path.
// exp2(-inf) is +0, which the masked scores rely on.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two f32 values rounded to one 32-bit register of two 16-bit values (lo in the low half), as mma reads them.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d (16 x 8, f32) += a (16 x 16) b (16 x 8).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16 bytes global -> shared without passing through registers; src_bytes = 0 writes 16 zero bytes and reads
// nothing (rows past T, columns past Dh).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// dst: (kRows, kD) tile in shared memory (row stride kD + 8) <- rows [0, rows) and columns [0, Dh) of the
// global matrix at src with row stride ld (elements); other rows and columns are zero. Dh % 8 == 0, and src
// and ld are 16-byte aligned (flash_attention_eligible checks both), so each 8-column chunk is one 16-byte copy.
template <typename T, int kRows, int kD>
__device__ __forceinline__ void load_tile_async(T* __restrict__ dst, const T* __restrict__ src, int64_t ld, int rows,
                                                int Dh) {
  constexpr int kChunks = kD / 8, kStride = smem_stride<kD>();
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i - r * kChunks) * 8;
    const bool ok = r < rows && c < Dh;
    cp_async_16(dst + r * kStride + c, ok ? src + r * ld + c : src, ok ? 16 : 0);
  }
}

// acc (16 x 8 kN8, this warp's C fragments) += A Bᵀ, with A the 16 x kK block at sA (row stride sa) and B the
// (8 kN8) x kK block at sB (row stride sb), both row-major in shared memory: S = Q Kᵀ, dP = dO Vᵀ, Sᵀ = K Qᵀ,
// dPᵀ = V dOᵀ. B row-major (n, k) is exactly mma's "col" B operand, so B needs no transpose.
//   A x4 lane address: row l % 16, column kk + 8 (l / 16) -> matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15),
//     (8-15, 8-15) = a0..a3.
//   B x4 lane address: row n0 + (l % 8) + 8 (l / 16), column kk + 8 ((l / 8) % 2) -> matrices
//     (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of n-tile n0 / 8, b0, b1 of the next.
template <typename T, int kN8, int kK>
__device__ __forceinline__ void warp_gemm_nt(float (&acc)[kN8][4], const T* __restrict__ sA, int sa,
                                             const T* __restrict__ sB, int sb) {
  static_assert(kN8 % 2 == 0 && kK % 16 == 0, "warp_gemm_nt: n in pairs of 8, k in steps of 16");
  const int lane = threadIdx.x & 31;
  const T* a_row = sA + (lane & 15) * sa + (lane >> 4) * 8;
  const T* b_row = sB + ((lane & 7) + ((lane >> 4) << 3)) * sb + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < kK; kk += 16) {
    uint32_t a[4];
    ldmatrix_x4(a, a_row + kk);
#pragma unroll
    for (int n = 0; n < kN8; n += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, b_row + n * 8 * sb + kk);
      mma_16816<T>(acc[n], a, b[0], b[1]);
      mma_16816<T>(acc[n + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x 8 kN8) += A B, with A (16 x kK) already in registers as mma A fragments (a[kk / 16]) and B the
// kK x (8 kN8) block at sB, row-major (k, n) with row stride sb: O += P V, dQ += dS K, dV += Pᵀ dO, dK += dSᵀ Q.
// B row-major (k, n) is the transpose of mma's "col" B operand, so it is read with ldmatrix .trans.
//   lane address: row kk + (l % 8) + 8 ((l / 8) % 2), column n0 + 8 (l / 16) -> matrices (k 0-7, n 0-7),
//   (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0, b1 of n-tile n0 / 8, b0, b1 of the next.
template <typename T, int kN8, int kK>
__device__ __forceinline__ void warp_gemm_rn(float (&acc)[kN8][4], const uint32_t (&a)[kK / 16][4],
                                             const T* __restrict__ sB, int sb) {
  static_assert(kN8 % 2 == 0 && kK % 16 == 0, "warp_gemm_rn: n in pairs of 8, k in steps of 16");
  const int lane = threadIdx.x & 31;
  const T* b_row = sB + ((lane & 7) + (((lane >> 3) & 1) << 3)) * sb + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < kN8; n += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_row + kk * 16 * sb + n * 8);
      mma_16816<T>(acc[n], a[kk], b[0], b[1]);
      mma_16816<T>(acc[n + 1], a[kk], b[2], b[3]);
    }
  }
}

// The C fragments of a 16 x (8 kN8) f32 tile (P or dS), rounded to T, as the A fragments of the next product
// (the k dimension of that product is this tile's n): A block kk holds n-tiles 2kk (k 0-7) and 2kk + 1
// (k 8-15); c0, c1 are row g and c2, c3 row g + 8, exactly a0 / a1 (n-tile 2kk) and a2 / a3 (n-tile 2kk + 1).
template <typename T, int kN8>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[kN8 / 2][4], const float (&c)[kN8][4]) {
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    a[kk][0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

template <int kN8>
__device__ __forceinline__ void zero(float (&acc)[kN8][4]) {
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
}

// Stores this warp's 16 x kD f32 C fragments times `scale` (per fragment row half: scale[0] for row g, scale[1]
// for row g + 8) to global rows row0 + g and row0 + g + 8 of the matrix at dst (row stride ld), columns < Dh,
// rows < n_rows. Two adjacent columns per 4-byte store (Dh is even, so a pair is either wholly in or wholly out).
template <typename T, int kN8>
__device__ __forceinline__ void store_rows(T* __restrict__ dst, int64_t ld, const float (&acc)[kN8][4], int row0,
                                           int n_rows, int Dh, const float (&scale)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + g + 8 * half;
    if (r >= n_rows) continue;
    T* row = dst + r * ld;
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
      const int col = n * 8 + c;
      if (col < Dh) {
        const uint32_t v = pack2<T>(acc[n][2 * half] * scale[half], acc[n][2 * half + 1] * scale[half]);
        *reinterpret_cast<uint32_t*>(row + col) = v;
      }
    }
  }
}

// RoPE's transposed rotation (attention.h), applied to this lane's 16-row accumulator tiles of one head's dQ or dK
// before they are stored: for i < Dh/2 (Dh = 16 kHalf8), (x[i], x[i + Dh/2]) <- (x[i] c + x[i + Dh/2] s,
// x[i + Dh/2] c - x[i] s), with {c, s} of position pos_offset + row from the table at cs ([pos][Dh/2], float2).
// Columns i and i + Dh/2 sit in this lane's tiles n and n + kHalf8 at the same place (Dh/2 is a multiple of 8), so
// the rotation needs no data from another lane. tile(n) is this lane's float[4] of tile n (8 columns, rows row0 +
// g and row0 + g + 8 as store_rows takes them); rows >= n_rows are left alone.
struct RopeTable {
  const float2* cs = nullptr;  // null: no RoPE
  int pos_offset = 0;
};
template <int kHalf8, typename Tile>
__device__ __forceinline__ void rope_rotate_back(Tile&& tile, const RopeTable& rope, int row0, int n_rows) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + g + 8 * half;
    if (r >= n_rows) continue;
    const float2* cs = rope.cs + static_cast<int64_t>(rope.pos_offset + r) * (8 * kHalf8) + c;
#pragma unroll
    for (int n = 0; n < kHalf8; ++n) {
      const float4 t = *reinterpret_cast<const float4*>(cs + 8 * n);  // columns 8n + c and 8n + c + 1
      float(&x1)[4] = tile(n);
      float(&x2)[4] = tile(n + kHalf8);
      const float a0 = x1[2 * half], b0 = x2[2 * half], a1 = x1[2 * half + 1], b1 = x2[2 * half + 1];
      x1[2 * half] = a0 * t.x + b0 * t.y;
      x2[2 * half] = b0 * t.x - a0 * t.y;
      x1[2 * half + 1] = a1 * t.z + b1 * t.w;
      x2[2 * half + 1] = b1 * t.z - a1 * t.w;
    }
  }
}

// Sets to -inf each score of this lane's accumulator tile (rows row_a and row_a + 8, key columns k0 + 8n +
// 2 (lane % 4) + e % 2, the m16n8 / wgmma accumulator layout) whose key is past seq_len or, when causal, after its
// row's query. Callers run it only on tiles that need it, under a warp-uniform branch, so the tiles inside the
// sequence and below the diagonal spend no instruction on masking.
template <int kN8>
__device__ __forceinline__ void mask_scores(float (&s)[kN8][4], int k0, int row_a, int seq_len, bool causal) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1), row = row_a + (e >> 1) * 8;
      if (key >= seq_len || (causal && key > row)) s[n][e] = -INFINITY;
    }
}

// Attention dropout's draws (attention_dropout.h) for this lane's 16 x 8 kN8 accumulator tile: f(n, e, kept) for
// each element [n][e]. Rows are queries (forward, dQ pass): element [n][e] is query row_a + 8 (e >> 1), key
// k0 + 8 n + 2 (lane % 4) + (e & 1), with row_a % 16 < 8 and k0 % 16 == 0, so each pair of 8-key column blocks
// is one Philox block: word w holds column block 2 kk + (w & 1), row half w >> 1, the two keys in its halves.
// The accumulator layout of wgmma's m64nN per warp is mma's m16n8 per 8 columns, so both kernel families call it.
template <int kN8, typename F>
__device__ __forceinline__ void for_each_draw_query_rows(const AttentionDropoutDraw& d, uint64_t bh, int seq_len,
                                                         int row_a, int k0, F&& f) {
  static_assert(kN8 % 2 == 0, "draws: pairs of 8-key blocks");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 r =
        philox_block(d.seed, d.stream, attention_dropout_block(bh, seq_len, row_a, k0 + 16 * kk + 2 * (lane & 3)));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int n = 2 * kk + (w & 1), e = 2 * (w >> 1);
      f(n, e, attention_dropout_keeps(r.v[w], 0, d.threshold));
      f(n, e + 1, attention_dropout_keeps(r.v[w], 1, d.threshold));
    }
  }
}

// The same for a tile whose rows are keys (the dK / dV pass): element [n][e] is key key_a + 8 (e >> 1), query
// q0 + 8 n + 2 (lane % 4) + (e & 1), key_a % 16 < 8, q0 % 16 == 0. The lane's two queries of a column block differ
// in bit 0, which the block index holds, so each pair of column blocks needs two Philox blocks (one per query
// parity), of which it takes half of each word: word w is column block 2 kk + (w >> 1), key half w & 1, in half
// bit0(key_a). Lane ^ 4 holds key_a ^ 1, so it needs the same two blocks and the other halves: each lane draws the
// block of query parity bit0(key_a) and the two swap words by a shuffle, one Philox block per 8 scores as in
// for_each_draw_query_rows. Every lane of the warp must call it (the shuffle).
template <int kN8, typename F>
__device__ __forceinline__ void for_each_draw_key_rows(const AttentionDropoutDraw& d, uint64_t bh, int seq_len,
                                                       int key_a, int q0, F&& f) {
  static_assert(kN8 % 2 == 0, "draws: pairs of 8-query blocks");
  const int lane = threadIdx.x & 31, half = key_a & 1;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const Philox4 mine =
        philox_block(d.seed, d.stream,
                     attention_dropout_block(bh, seq_len, q0 + 16 * kk + 2 * (lane & 3) + half, key_a));
    Philox4 theirs;  // lane ^ 4's: the block of query parity 1 - half
#pragma unroll
    for (int w = 0; w < 4; ++w) theirs.v[w] = __shfl_xor_sync(0xffffffffu, mine.v[w], 4);
#pragma unroll
    for (int qb = 0; qb < 2; ++qb)
#pragma unroll
      for (int w = 0; w < 4; ++w)
        f(2 * kk + (w >> 1), 2 * (w & 1) + qb,
          attention_dropout_keeps(qb == half ? mine.v[w] : theirs.v[w], half, d.threshold));
  }
}

// The draws of for_each_draw_* as keep bits, bit 4 n + e for element [n][e] (kN8 <= 16).
template <int kN8>
__device__ __forceinline__ uint64_t keep_bits_query_rows(const AttentionDropoutDraw& d, uint64_t bh, int seq_len,
                                                         int row_a, int k0) {
  static_assert(kN8 <= 16, "keep bits: at most 64 elements");
  uint64_t bits = 0;
  for_each_draw_query_rows<kN8>(d, bh, seq_len, row_a, k0,
                                [&](int n, int e, bool kept) { bits |= static_cast<uint64_t>(kept) << (4 * n + e); });
  return bits;
}
template <int kN8>
__device__ __forceinline__ uint64_t keep_bits_key_rows(const AttentionDropoutDraw& d, uint64_t bh, int seq_len,
                                                       int key_a, int q0) {
  static_assert(kN8 <= 16, "keep bits: at most 64 elements");
  uint64_t bits = 0;
  for_each_draw_key_rows<kN8>(d, bh, seq_len, key_a, q0,
                              [&](int n, int e, bool kept) { bits |= static_cast<uint64_t>(kept) << (4 * n + e); });
  return bits;
}

// Out of line, for the mma.sync kernels (kN8 <= 8): the forward calls them behind a runtime branch, and inlined
// they raised its allocation on the path without dropout (so did the dQ kernel's, 168 -> 216 registers at Dh 128,
// when it had the branch; the backward passes now have instances with and without dropout). The wgmma kernels
// inline them: a call between a wgmma and its wait would serialize the wgmma.
template <int kN8>
__device__ __noinline__ uint32_t dropout_keep_bits_query_rows(const AttentionDropoutDraw& d, uint64_t bh, int seq_len,
                                                              int row_a, int k0) {
  static_assert(kN8 <= 8, "keep bits: at most 32 elements");
  return static_cast<uint32_t>(keep_bits_query_rows<kN8>(d, bh, seq_len, row_a, k0));
}
template <int kN8>
__device__ __noinline__ uint32_t dropout_keep_bits_key_rows(const AttentionDropoutDraw& d, uint64_t bh, int seq_len,
                                                            int key_a, int q0) {
  static_assert(kN8 <= 8, "keep bits: at most 32 elements");
  return static_cast<uint32_t>(keep_bits_key_rows<kN8>(d, bh, seq_len, key_a, q0));
}

// x[n][e] <- x[n][e] * scale where keep bit 4 n + e is set, else 0 (scale 1: only the drops).
template <int kN8>
__device__ __forceinline__ void apply_keep_bits(float (&x)[kN8][4], uint64_t keep, float scale) {
#pragma unroll
  for (int n = 0; n < kN8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[n][e] = (keep >> (4 * n + e)) & 1u ? x[n][e] * scale : 0.0f;
}

// The statistics of this lane's two rows row_a and row_a + 8 of a (B, H, T) plane starting at stat_base: lse in
// log2 units and D = rowsum(dO ∘ O), 0 past T (the dQ passes' per-row constants).
__device__ __forceinline__ void load_row_stats(float (&lse2)[2], float (&Dr)[2], const float* __restrict__ lse,
                                               const float* __restrict__ D, int64_t stat_base, int row_a, int seq_len) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_a + 8 * half;
    lse2[half] = r < seq_len ? lse[stat_base + r] * kLog2e : 0.0f;
    Dr[half] = r < seq_len ? D[stat_base + r] : 0.0f;
  }
}

// Host side: calls f(std::integral_constant<int, kD>{}) for the flash head width that serves Dh.
template <typename F>
void dispatch_head(int Dh, F&& f) {
  switch (flash_attention_head_pad(Dh)) {
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 80: f(std::integral_constant<int, 80>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    default: TS_THROW("attention: no flash kernel for head dim ", Dh);
  }
}

// Host side, the setup both backward passes share: `kernel_drop` or `kernel_plain` (the pass's instances with and
// without dropout: behind a runtime branch the call to the keep bits would cost the pass without dropout
// registers) on the (ceil(T/64), H, B) grid with `smem` bytes of dynamic shared
// memory, taking (d_qkv, d_out, qkv, lse, D, T, H, Dh, causal, scale, scale log2e, dropout, RoPE table).
template <typename T, int kD, typename Kernel>
void launch_backward_pass(const char* pass, size_t smem, Kernel kernel_drop, Kernel kernel_plain,
                          const AttentionParams& p, const FlashAttentionArgs& a, Context& ctx) {
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  const Kernel kernel = drop.threshold ? kernel_drop : kernel_plain;
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, "attention_backward: the flash ", pass, " kernel needs ", smem,
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(cuda::ceil_div(p.T, kTileRows), p.H, p.B);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh)));
  TS_CHECK(!a.rope_cs || p.Dh == kD, "internal: the ", pass, " pass rotates back RoPE only at Dh = ", kD);
  const RopeTable rope{static_cast<const float2*>(a.rope_cs), a.rope_pos_offset};
  kernel<<<grid, kThreads, smem, ctx.stream()>>>(static_cast<T*>(a.d_qkv), static_cast<const T*>(a.d_out),
                                                 static_cast<const T*>(a.qkv), a.lse_in, a.D, p.T, p.H, p.Dh, p.causal,
                                                 scale, scale * kLog2e, drop, rope);
  TS_CHECK_LAUNCH();
}

// Host side: launch(type tag, width tag) for a backward pass's (dtype, Dh), bf16 or f16.
template <typename F>
void dispatch_backward(const AttentionParams& p, DType dtype, F&& launch) {
  TS_CHECK(p.H <= 65535 && p.B <= 65535, "attention_backward: H and B must be at most 65535");
  dispatch_head(p.Dh, [&](auto d) {
    if (dtype == DType::BF16) launch(__nv_bfloat16{}, d);
    else if (dtype == DType::F16) launch(__half{}, d);
    else TS_THROW("attention_backward: the flash kernels take bf16 or f16, not ", dtype_name(dtype));
  });
}

}  // namespace tessera::flash
