// FlashAttention-2 backward, the dK / dV pass on tensor cores (see flash.h; fragments in flash_kernel.cuh).
#include <cmath>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_kernel.cuh"

namespace tessera {
namespace flash {
namespace {

// Query rows per step of the loop. Each thread holds dK and dV (2 x kD / 2 f32) plus Sᵀ and dPᵀ
// (2 x kQ / 2 f32): 64 queries for kD <= 80 (at most 80 + 64 accumulators), 32 for kD = 128 (128 + 32), so
// that no instance needs more than about 200 registers and none spills.
template <int kD>
constexpr int kQueryStep = kD >= 128 ? 32 : 64;

template <int kD>
constexpr size_t dkdv_smem_bytes() {
  // K, V (64 rows each), 2 x Q, 2 x dO (kQ rows each), all 16-bit; then 2 x (lse, D) f32 of kQ rows.
  return (static_cast<size_t>(2) * kTileRows + 4 * kQueryStep<kD>)*smem_stride<kD>() * 2 +
         4 * kQueryStep<kD> * sizeof(float);
}

// d_qkv[:, k part] and [:, v part]: (B*T, 3C) rows of this key tile, overwritten. Grid (ceil(T/64), H, B),
// 128 threads; warp w owns key rows k0 + 16w .., lane l keys g = l / 4 and g + 8 of them. The transposed
// products keep keys as rows, so every result row is one key and the reduction over queries stays in registers:
// per query step (queries q0 .. q0 + kQ - 1; under a causal mask starting at the diagonal, q0 = k0):
//   Sᵀ = K Qᵀ,  Pᵀ = exp2(Sᵀ log2e / sqrt(Dh) - lse log2e) (0 where masked),  dPᵀ = V dOᵀ,
//   dSᵀ = Pᵀ ∘ (dPᵀ - D),  dV += Pᵀ dO,  dK += dSᵀ Q  (Pᵀ, dSᵀ rounded to the dtype in registers).
// With dropout, dPᵀ = Zᵀ ∘ (V dOᵀ) before dSᵀ, and dV takes (P ∘ Z)ᵀ: the dropped elements zeroed, the kept ones
// scaled by 1 / (1 - p) (attention.h).
// At the end dK / sqrt(Dh) (with RoPE, rotated back first: rope_rotate_back) and dV are stored; each element is
// written by one thread once: deterministic.
// Blocks per SM the compiler must fit. At Dh 64 the kernel wants 187 registers, which leaves room for 2 blocks (8
// warps); bounded to 3 it takes 168 with a 32-byte spill, and measured faster than 2 blocks over gpt2-124m's
// attention backward, and faster than 32 queries a step with 3 or 4 blocks
// (bench/results/2026-11-30-cs336-peer-and-scale-2xh200.md).
template <int kD>
constexpr int kDkdvMinBlocks = kD == 64 ? 3 : 1;

template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, kDkdvMinBlocks<kD>)
    flash_attention_backward_dkdv_mma(T* __restrict__ d_qkv, const T* __restrict__ d_out, const T* __restrict__ qkv,
                                      const float* __restrict__ lse, const float* __restrict__ D, int seq_len, int H,
                                      int Dh, bool causal, float scale, float scale_log2, AttentionDropoutDraw drop,
                                      RopeTable rope) {
  extern __shared__ __align__(16) unsigned char smem[];
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kQ = kQueryStep<kD>;
  constexpr int kS = smem_stride<kD>(), kTileElems = kTileRows * kS, kStepElems = kQ * kS;
  constexpr int kQ8 = kQ / 8, kD8 = kD / 8;
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kTileElems;
  T* sQ = sV + kTileElems;                                       // two buffers of kQ rows
  T* sdO = sQ + 2 * kStepElems;                                  // two buffers of kQ rows
  float* sLse = reinterpret_cast<float*>(sdO + 2 * kStepElems);  // two buffers of kQ (times log2e)
  float* sD = sLse + 2 * kQ;                                     // two buffers of kQ
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kTileRows;
  const int64_t C = static_cast<int64_t>(H) * Dh, ld = 3 * C;
  const int64_t row_b = static_cast<int64_t>(b) * seq_len;
  const T* q_base = qkv + row_b * ld + static_cast<int64_t>(h) * Dh;
  const T* k_base = q_base + C;
  const T* v_base = q_base + 2 * C;
  const T* do_base = d_out + row_b * C + static_cast<int64_t>(h) * Dh;
  const int64_t stat_base = (static_cast<int64_t>(b) * H + h) * seq_len;

  // Queries of step i into buffer `buf`: Q and dO by cp.async; lse (in log2 units) and D by plain loads,
  // visible to the block after the __syncthreads that precedes their use.
  auto load_step = [&](int i, int buf) {
    const int q0 = i * kQ;
    load_tile_async<T, kQ, kD>(sQ + buf * kStepElems, q_base + static_cast<int64_t>(q0) * ld, ld, seq_len - q0, Dh);
    load_tile_async<T, kQ, kD>(sdO + buf * kStepElems, do_base + static_cast<int64_t>(q0) * C, C, seq_len - q0, Dh);
    if (threadIdx.x < kQ) {
      const int q = q0 + threadIdx.x;
      sLse[buf * kQ + threadIdx.x] = q < seq_len ? lse[stat_base + q] * kLog2e : INFINITY;  // P = 0 past T
      sD[buf * kQ + threadIdx.x] = q < seq_len ? D[stat_base + q] : 0.0f;
    }
  };

  const int n_qt = (seq_len + kQ - 1) / kQ;
  const int i_begin = causal ? k0 / kQ : 0;  // queries below k0 see none of these keys
  load_tile_async<T, kTileRows, kD>(sK, k_base + static_cast<int64_t>(k0) * ld, ld, seq_len - k0, Dh);
  load_tile_async<T, kTileRows, kD>(sV, v_base + static_cast<int64_t>(k0) * ld, ld, seq_len - k0, Dh);
  load_step(i_begin, 0);
  cp_async_commit();

  float dk[kD8][4], dv[kD8][4];
  zero(dk);
  zero(dv);
  const int key_a = k0 + warp * kRowsPerWarp + (lane >> 2);  // this lane's keys: key_a and key_a + 8
  const T* sKw = sK + warp * kRowsPerWarp * kS;
  const T* sVw = sV + warp * kRowsPerWarp * kS;

  for (int i = i_begin; i < n_qt; ++i) {
    const int buf = (i - i_begin) & 1;
    if (i + 1 < n_qt) load_step(i + 1, buf ^ 1);  // the other buffer was last read in the previous step
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

    const int q0 = i * kQ;
    uint32_t keep = 0;
    if constexpr (kDropout) {
      keep = dropout_keep_bits_key_rows<kQ8>(drop, static_cast<uint64_t>(b) * H + h, seq_len, key_a, q0);
      apply_keep_bits<kQ8>(dpt, keep, drop.scale);
    }
    const bool edge = q0 + kQ > seq_len || k0 + kTileRows > seq_len || (causal && q0 < k0 + kTileRows - 1);
#pragma unroll
    for (int n = 0; n < kQ8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = n * 8 + 2 * (lane & 3) + (e & 1), q = q0 + ql, key = key_a + (e >> 1) * 8;
        const bool masked = edge && (q >= seq_len || key >= seq_len || (causal && key > q));
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
  const int row0 = k0 + warp * kRowsPerWarp;
  T* dk_base = d_qkv + row_b * ld + C + static_cast<int64_t>(h) * Dh;
  if (rope.cs) rope_rotate_back<kD / 16>([&](int n) -> float(&)[4] { return dk[n]; }, rope, row0, seq_len);
  const float k_scales[2] = {scale, scale}, v_scales[2] = {1.0f, 1.0f};
  store_rows<T, kD8>(dk_base, ld, dk, row0, seq_len, Dh, k_scales);
  store_rows<T, kD8>(dk_base + C, ld, dv, row0, seq_len, Dh, v_scales);
}

}  // namespace
}  // namespace flash

void flash_attention_backward_dkdv_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                        Context& ctx) {
  flash::dispatch_backward(p, dtype, [&](auto t, auto d) {
    using T = decltype(t);
    constexpr int kD = decltype(d)::value;
    const auto with_dropout = flash::flash_attention_backward_dkdv_mma<T, kD, true>;
    const auto without = flash::flash_attention_backward_dkdv_mma<T, kD, false>;
    flash::launch_backward_pass<T, kD>("dK/dV", flash::dkdv_smem_bytes<kD>(), with_dropout, without, p, a, ctx);
  });
}

}  // namespace tessera
