// tessera/infer/decode_linear.h — the products of an inference engine's decode step, shared by the decoder-only
// engine (engine.h) and the encoder-decoder's (seq2seq_engine.h):
//
//   c[m, n] = act(Σ_k a[m, k] W[n, k] + bias[n]),   m < M,  n < N,  k < K
//
// a: (M, K) packed; W: (N, K) row-major (a Linear layer's (out, in) weight); bias: (N) or undefined; c: (M, ldc),
// ldc >= N (GemvParams::ld_c()); act: none, or an activation gemv takes as its epilogue (not Swiglu).
//
// The choice of kernel: a decode step has one row per sequence, so on the GPU up to kDecodeGemvRows rows take gemv
// (gemv.h: one kernel with its bias and activation, where cuBLASLt runs a split-K pair of kernels at M = 1); above
// that, or where gemv does not take the call (f32, K not a whole number of 16-byte packs, unaligned a or W), the
// GEMM. The CPU always takes the GEMM: the reference the GPU engines are tested against. The GEMM of an f32 model is
// exact fp32 (no TF32), so that the GPU's f32 follows the CPU to accumulation order.
#pragma once
#include <cstdint>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/gemm/gemv.h"

namespace tessera {

// Rows up to which the GPU's products take gemv: at 16 rows gemv re-reads each row of a once per pair of output
// columns and measured slower than cuBLASLt (bench/results/2026-12-07-decode-gemv-flash-h200.md).
constexpr int64_t kDecodeGemvRows = 4;

// True when p (act included) runs as one gemv on ctx: a CUDA context, 1 <= p.M <= kDecodeGemvRows and
// gemv_supports(p) for a's dtype and a's and w's alignment.
bool decode_linear_uses_gemv(const GemvParams& p, const Tensor& a, const Tensor& w, const Context& ctx);

// c = a Wᵀ + bias (p.act must be unset): gemv where decode_linear_uses_gemv, else gemm (trans_b, ldc = p.ldc).
void decode_linear(const GemvParams& p, const Tensor& c, const Tensor& a, const Tensor& w, const Tensor& bias,
                   Context& ctx);

// c = act(a Wᵀ + bias) with act = *p.act (set, not Swiglu): one gemv with its activation epilogue (fp32, rounded
// once) where decode_linear_uses_gemv; else the GEMM into pre, (M, N) packed, then activation_forward(pre + bias)
// into c (pre rounded to the dtype in between). c packed (p.ldc 0 or N); pre is not written on the gemv path.
void decode_linear_act(const GemvParams& p, const Tensor& c, const Tensor& pre, const Tensor& a, const Tensor& w,
                       const Tensor& bias, Context& ctx);

}  // namespace tessera
