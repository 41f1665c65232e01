// FlashAttention-2 forward on tensor cores (see flash.h for the algorithm, flash_kernel.cuh for the fragments).
#include <cmath>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/ops/attention/flash.h"
#include "tessera/ops/attention/flash_kernel.cuh"

namespace tessera {
namespace flash {
namespace {

template <int kD>
constexpr size_t forward_smem_bytes() {
  return static_cast<size_t>(5) * kTileRows * smem_stride<kD>() * 2;  // Q, 2 x K, 2 x V, 16-bit
}

// out: (B*T, C), lse: (B, H, T) f32, qkv: (B*T, 3C). Grid (ceil(T/64), H, B), 128 threads; block x takes query
// tile n_q - 1 - x, so that under a causal mask the longest tiles start first. Warp w owns query rows
// q0 + 16w .. q0 + 16w + 15; lane l holds rows g = l / 4 and g + 8 of them (the C-fragment rows).
// Per key tile j (keys k0 = 64 j ..):
//   x = S log2e / sqrt(Dh)  (-inf where masked),  m' = max(m, rowmax x),  P = exp2(x - m'),
//   l = l 2^(m - m') + rowsum P (lane-partial: each lane sums its own 16 of the 64 columns),  O = O 2^(m - m') + P V.
// At the end l is summed over the 4 lanes of the row, out = O / l, lse = (m + log2 l) ln 2.
// With dropout (drop.threshold > 0, uniform over the grid) the dropped elements of P are zeroed after l has summed
// them and before P V, and out takes the 1 / (1 - p) of the kept ones: out = O / l / (1 - p).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_attention_forward_mma(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv, int seq_len,
                                int H, int Dh, bool causal, float scale_log2, AttentionDropoutDraw drop) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_dropout_resolve(drop);
  constexpr int kS = smem_stride<kD>(), kTileElems = kTileRows * kS, kN8 = kTileRows / 8, kD8 = kD / 8;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kTileElems;      // two buffers
  T* sV = sK + 2 * kTileElems;  // two buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q_tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = q_tile * kTileRows;
  const int64_t C = static_cast<int64_t>(H) * Dh, ld = 3 * C;
  const T* q_base = qkv + static_cast<int64_t>(b) * seq_len * ld + static_cast<int64_t>(h) * Dh;
  const T* k_base = q_base + C;
  const T* v_base = q_base + 2 * C;

  const int n_kt_all = (seq_len + kTileRows - 1) / kTileRows;
  const int n_kt = causal ? min(q_tile + 1, n_kt_all) : n_kt_all;
  load_tile_async<T, kTileRows, kD>(sQ, q_base + static_cast<int64_t>(q0) * ld, ld, seq_len - q0, Dh);
  load_tile_async<T, kTileRows, kD>(sK, k_base, ld, seq_len, Dh);
  load_tile_async<T, kTileRows, kD>(sV, v_base, ld, seq_len, Dh);
  cp_async_commit();

  float o[kD8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_a = q0 + warp * kRowsPerWarp + (lane >> 2);  // this lane's rows: row_a and row_a + 8
  const T* sQw = sQ + warp * kRowsPerWarp * kS;

  for (int j = 0; j < n_kt; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_kt) {  // prefetch tile j + 1 into the other buffer (last read in iteration j - 1)
      const int k1 = (j + 1) * kTileRows;
      load_tile_async<T, kTileRows, kD>(sK + (buf ^ 1) * kTileElems, k_base + k1 * ld, ld, seq_len - k1, Dh);
      load_tile_async<T, kTileRows, kD>(sV + (buf ^ 1) * kTileElems, v_base + k1 * ld, ld, seq_len - k1, Dh);
    }
    cp_async_commit();   // possibly empty: keeps the group count uniform for the wait below
    cp_async_wait<1>();  // everything but the prefetch just issued has landed (this thread's copies)
    __syncthreads();     // ... and every thread's

    float s[kN8][4];
    zero(s);
    warp_gemm_nt<T, kN8, kD>(s, sQw, kS, sK + buf * kTileElems, kS);

    const int k0 = j * kTileRows;
    const bool edge = k0 + kTileRows > seq_len || (causal && k0 + kTileRows - 1 > q0);
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1), row = row_a + (e >> 1) * 8;
        const bool masked = edge && (key >= seq_len || (causal && key > row));
        s[n][e] = masked ? -INFINITY : s[n][e] * scale_log2;
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = m[half];
#pragma unroll
      for (int n = 0; n < kN8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row: l ^ 1, l ^ 2
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
      const uint64_t bh = static_cast<uint64_t>(b) * H + h;
      apply_keep_bits<kN8>(s, dropout_keep_bits_query_rows<kN8>(drop, bh, seq_len, row_a, k0), 1.0f);
    }
    uint32_t pa[kN8 / 2][4];
    c_to_a<T, kN8>(pa, s);
    warp_gemm_rn<T, kD8, kTileRows>(o, pa, sV + buf * kTileElems, kS);
    __syncthreads();  // all warps are done with buffer `buf` before iteration j + 1 prefetches into it
  }

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    inv[half] = 1.0f / l[half] * drop.scale;  // drop.scale is 1 without dropout: 1 / l exactly, as before
  }
  T* o_base = out + static_cast<int64_t>(b) * seq_len * C + static_cast<int64_t>(h) * Dh;
  store_rows<T, kD8>(o_base, C, o, row_a - (lane >> 2), seq_len, Dh, inv);
  if ((lane & 3) == 0) {
    float* lse_row = lse + (static_cast<int64_t>(b) * H + h) * seq_len;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row_a + 8 * half;
      if (r < seq_len) lse_row[r] = (m[half] + log2f(l[half])) * kLn2;
    }
  }
}

template <typename T, int kD>
void launch_forward(const AttentionParams& p, const FlashAttentionArgs& a, Context& ctx) {
  constexpr size_t smem = forward_smem_bytes<kD>();
  auto kernel = flash_attention_forward_mma<T, kD>;
  TS_CHECK(smem <= ctx.gpu().smem_per_block_optin, "attention_forward: the flash kernel needs ", smem,
           " bytes of shared memory per block, the device has ", ctx.gpu().smem_per_block_optin);
  TS_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(cuda::ceil_div(p.T, kTileRows), p.H, p.B);
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.Dh))) * kLog2e;
  const AttentionDropoutDraw drop = attention_dropout_draw(p.dropout, p.seed, p.stream, ctx.philox_stream_base());
  kernel<<<grid, kThreads, smem, ctx.stream()>>>(static_cast<T*>(a.out), a.lse, static_cast<const T*>(a.qkv), p.T, p.H,
                                                 p.Dh, p.causal, scale_log2, drop);
  TS_CHECK_LAUNCH();
}

}  // namespace
}  // namespace flash

void flash_attention_forward_cuda(const AttentionParams& p, DType dtype, const FlashAttentionArgs& a, Context& ctx) {
  TS_CHECK(p.H <= 65535 && p.B <= 65535, "attention_forward: H and B must be at most 65535");
  flash::dispatch_head(p.Dh, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if (dtype == DType::BF16) flash::launch_forward<__nv_bfloat16, kD>(p, a, ctx);
    else if (dtype == DType::F16) flash::launch_forward<__half, kD>(p, a, ctx);
    else TS_THROW("attention_forward: the flash kernels take bf16 or f16, not ", dtype_name(dtype));
  });
}

}  // namespace tessera
