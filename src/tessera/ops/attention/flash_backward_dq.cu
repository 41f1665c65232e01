// FlashAttention-2 backward, the dQ pass on tensor cores (see flash.h; fragments in flash_kernel.cuh).
#include <cmath>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_kernel.cuh"

namespace tessera {
namespace flash {
namespace {

template <int kD>
constexpr size_t dq_smem_bytes() {
  return static_cast<size_t>(6) * kTileRows * smem_stride<kD>() * 2;  // Q, dO, 2 x K, 2 x V, 16-bit
}

// d_qkv[:, q part]: (B*T, 3C) rows of this query tile, overwritten. d_out: (B*T, C); qkv: (B*T, 3C);
// lse, D: (B, H, T) f32. Grid (ceil(T/64), H, B), 128 threads, block x takes query tile n_q - 1 - x (the longest
// first under a causal mask); warp w owns query rows q0 + 16w .., lane l rows g = l / 4 and g + 8 of them.
// Per key tile (keys k0 = 64 j ..; under a causal mask only up to the diagonal tile):
//   S = Q Kᵀ,  P = exp2(S log2e / sqrt(Dh) - lse log2e) (0 where masked),  dP = dO Vᵀ,  dS = P ∘ (dP - D),
//   dQ += dS K  (dS rounded to the dtype in registers as the A operand).
// With dropout, dP = Z ∘ (dO Vᵀ) (attention.h): the dropped elements of dO Vᵀ are zeroed, the kept ones scaled
// by 1 / (1 - p), before dS. At the end dQ / sqrt(Dh) is stored (with RoPE, rotated back first: rope_rotate_back).
// Each dQ element is written by one thread once: deterministic.
// Blocks an SM: 3 (4 at Dh 32), which holds every instance to at most 168 registers a thread (128 at Dh 32), the
// occupancy of the one kernel that both instances replace (164-168 registers; 126 at Dh 32). Unbounded, the
// instance with dropout takes 224 at Dh 128 (2 blocks); bounded to 1 block, those without it take 200-228.
template <int kD>
constexpr int kDqMinBlocks = kD == 32 ? 4 : 3;

template <typename T, int kD, bool kDropout>
__global__ void __launch_bounds__(kThreads, kDqMinBlocks<kD>)
    flash_attention_backward_dq_mma(T* __restrict__ d_qkv, const T* __restrict__ d_out, const T* __restrict__ qkv,
                                    const float* __restrict__ lse, const float* __restrict__ D, int seq_len, int H,
                                    int Dh, bool causal, float scale, float scale_log2, AttentionDropoutDraw drop,
                                    RopeTable rope) {
  extern __shared__ __align__(16) unsigned char smem[];
  if constexpr (kDropout) attention_dropout_resolve(drop);
  constexpr int kS = smem_stride<kD>(), kTileElems = kTileRows * kS, kN8 = kTileRows / 8, kD8 = kD / 8;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kTileElems;
  T* sK = sdO + kTileElems;     // two buffers
  T* sV = sK + 2 * kTileElems;  // two buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = q_tile * kTileRows;
  const int64_t C = static_cast<int64_t>(H) * Dh, ld = 3 * C;
  const int64_t row_b = static_cast<int64_t>(b) * seq_len;  // first row of this batch in (B*T, ...)
  const T* q_base = qkv + row_b * ld + static_cast<int64_t>(h) * Dh;
  const T* k_base = q_base + C;
  const T* v_base = q_base + 2 * C;
  const T* do_base = d_out + row_b * C + static_cast<int64_t>(h) * Dh;

  const int n_kt_all = (seq_len + kTileRows - 1) / kTileRows;
  const int n_kt = causal ? min(q_tile + 1, n_kt_all) : n_kt_all;
  load_tile_async<T, kTileRows, kD>(sQ, q_base + static_cast<int64_t>(q0) * ld, ld, seq_len - q0, Dh);
  load_tile_async<T, kTileRows, kD>(sdO, do_base + static_cast<int64_t>(q0) * C, C, seq_len - q0, Dh);
  load_tile_async<T, kTileRows, kD>(sK, k_base, ld, seq_len, Dh);
  load_tile_async<T, kTileRows, kD>(sV, v_base, ld, seq_len, Dh);
  cp_async_commit();

  const int row_a = q0 + warp * kRowsPerWarp + (lane >> 2);  // this lane's rows: row_a and row_a + 8
  const int64_t stat_base = (static_cast<int64_t>(b) * H + h) * seq_len;
  float lse2[2], Dr[2];
  flash::load_row_stats(lse2, Dr, lse, D, stat_base, row_a, seq_len);
  float dq[kD8][4];
  zero(dq);
  const T* sQw = sQ + warp * kRowsPerWarp * kS;
  const T* sdOw = sdO + warp * kRowsPerWarp * kS;

  for (int j = 0; j < n_kt; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * kTileRows;
      load_tile_async<T, kTileRows, kD>(sK + (buf ^ 1) * kTileElems, k_base + k1 * ld, ld, seq_len - k1, Dh);
      load_tile_async<T, kTileRows, kD>(sV + (buf ^ 1) * kTileElems, v_base + k1 * ld, ld, seq_len - k1, Dh);
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
      const uint64_t bh = static_cast<uint64_t>(b) * H + h;
      apply_keep_bits<kN8>(dp, dropout_keep_bits_query_rows<kN8>(drop, bh, seq_len, row_a, k0), drop.scale);
    }
    const bool edge = k0 + kTileRows > seq_len || (causal && k0 + kTileRows - 1 > q0);
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1), half = e >> 1, row = row_a + 8 * half;
        const bool masked = edge && (key >= seq_len || (causal && key > row));
        const float pv = masked ? 0.0f : flash::exp2_approx(s[n][e] * scale_log2 - lse2[half]);
        s[n][e] = pv * (dp[n][e] - Dr[half]);  // dS, in place of S
      }
    uint32_t dsa[kN8 / 2][4];
    c_to_a<T, kN8>(dsa, s);
    warp_gemm_rn<T, kD8, kTileRows>(dq, dsa, sKb, kS);
    __syncthreads();
  }
  const int row0 = row_a - (lane >> 2);
  if (rope.cs) rope_rotate_back<kD / 16>([&](int n) -> float(&)[4] { return dq[n]; }, rope, row0, seq_len);
  const float scales[2] = {scale, scale};
  store_rows<T, kD8>(d_qkv + row_b * ld + static_cast<int64_t>(h) * Dh, ld, dq, row0, seq_len, Dh, scales);
}

}  // namespace
}  // namespace flash

void flash_attention_backward_dq_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a,
                                      Context& ctx) {
  flash::dispatch_backward(p, dtype, [&](auto t, auto d) {
    using T = decltype(t);
    constexpr int kD = decltype(d)::value;
    const auto with_dropout = flash::flash_attention_backward_dq_mma<T, kD, true>;
    const auto without = flash::flash_attention_backward_dq_mma<T, kD, false>;
    flash::launch_backward_pass<T, kD>("dQ", flash::dq_smem_bytes<kD>(), with_dropout, without, p, a, ctx);
  });
}

}  // namespace tessera
