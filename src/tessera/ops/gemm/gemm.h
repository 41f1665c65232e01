// tessera/ops/gemm — C = alpha * op(A) op(B) + beta * C  (+ bias broadcast over rows).
//
// All row-major. op(A): (M, K), stored (M, K) or, with trans_a, (K, M). op(B): (K, N), stored (K, N) or,
// with trans_b, (N, K). C: (M, N). bias: (N) or null, added after the product.
// A Linear layer y = x Wᵀ + b with W stored (out, in) is gemm({M=rows, N=out, K=in, trans_b=true}).
// The CPU path calls OpenBLAS when the build found it, otherwise a plain loop (gemm_loop_ref, always built
// so the two can be compared). The CUDA path calls cuBLASLt (gemm_cuda.cu).
//
// Strided batch (Tensor-level entry only; the _ref functions do one product): with batch > 1, product i reads
// A + i*stride_a, B + i*stride_b and writes C + i*stride_c (strides in elements); the bias is shared by all.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct GemmParams {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  // CUDA, f32 only: true runs TF32 tensor cores (inputs rounded to 10 mantissa bits, fp32 accumulation,
  // relative error ~1e-3); false runs exact fp32 (CUBLAS_COMPUTE_32F), which follows the CPU reference to
  // accumulation order. Ignored on the CPU and for bf16 / f16 (always fp32 accumulation).
  bool allow_tf32 = true;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  // Row strides (leading dimensions, in elements) of the matrices as stored; 0: packed, the stored row length.
  // A padded stride keeps every row aligned: the lm_head's logits, rows of V = 50257, are stored with a stride of
  // 50304 so that cuBLASLt can pick its 16-byte-aligned tensor-core kernels (with a stride of 50257 it can pick
  // only unaligned kernels, several times slower: bench/results/README.md, "Figures without a run file"). Each must
  // be at least the stored row length.
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t a_cols() const { return trans_a ? M : K; }  // A as stored: a_rows() rows of a_cols() elements
  int64_t a_rows() const { return trans_a ? K : M; }
  int64_t b_cols() const { return trans_b ? K : N; }
  int64_t b_rows() const { return trans_b ? N : K; }
  int64_t ld_a() const { return lda ? lda : a_cols(); }
  int64_t ld_b() const { return ldb ? ldb : b_cols(); }
  int64_t ld_c() const { return ldc ? ldc : N; }
};

template <typename T>
void gemm_ref(const GemmParams& p, T* c, const T* a, const T* b, const T* bias);
template <typename T>
void gemm_loop_ref(const GemmParams& p, T* c, const T* a, const T* b, const T* bias);
bool gemm_uses_blas();

// Column sums: d_bias[n] += Σ_m d_c[m, n], the bias gradient of a Linear layer. d_c: (M, N).
template <typename T>
void bias_grad_ref(int M, int N, T* d_bias, const T* d_c);

}  // namespace tessera

// ---- Tensor-level entries (gemm.cpp): route to the reference or to cuBLASLt by device and dtype. ----
// a, b, c, bias (optional: an undefined Tensor) and d_bias, d_c are contiguous, in the compute dtype. With
// batch == 1 and packed rows they hold exactly M*K, K*N, M*N and N elements (with a row stride ld, at least
// (rows - 1) * ld + cols); with batch > 1, a, b and c hold at least
// (batch-1)*stride + one matrix. c must not overlap a, b or bias.
namespace tessera {

struct BiasGradParams {
  int M = 0, N = 0;
};

bool gemm_supports(const GemmParams& p, DType dtype, Device device, std::string* why = nullptr);
void gemm(const GemmParams& p, const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, Context& ctx);
// d_bias[n] += Σ_m d_c[m, n]  (ACCUMULATED, as bias_grad_ref).
void bias_grad(const BiasGradParams& p, const Tensor& d_bias, const Tensor& d_c, Context& ctx);

// ---- A GEMM with the GELU fused into its epilogue (GPT-2's MLP forward). ----
// pre = op(A) op(B) + bias (bias: (N), required),  out = gelu(pre)  (GELU: the tanh form of activation.h).
// p as for gemm, restricted to alpha 1, beta 0, batch 1 and packed rows; pre and out (M, N) packed row-major in
// the compute dtype. On the CPU (the reference): gemm, then activation_forward without a bias. On CUDA: one
// cublasLtMatmul with CUBLASLT_EPILOGUE_GELU_AUX_BIAS (pre is its aux output); the CPU's two ops when cuBLASLt has
// no algorithm with that epilogue (N % 8 != 0, unaligned pointers). The backward uses no DGELU epilogue: the product
// followed by activation_backward, in place, is simpler and measured as fast
// (bench/results/2026-11-30-step-fusions-h200.md).
void gemm_gelu_forward(const GemmParams& p, const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b,
                       const Tensor& bias, Context& ctx);

// ---- CUDA launchers (gemm_cuda.cu), on ctx's stream. Pointers are device memory in `dtype`. ----
// gemm_cuda: one cublasLtMatmul. Row-major C (M, N) is column-major Cᵀ (N, M), so cuBLASLt computes
// Cᵀ = op(B)ᵀ op(A)ᵀ with B's memory as its "A" and A's memory as its "B"; the bias becomes cuBLASLt's
// per-row bias (CUBLASLT_EPILOGUE_BIAS, added in fp32 before the output is rounded). bf16 / f16: fp32
// accumulation (CUBLAS_COMPUTE_32F). f32: CUBLAS_COMPUTE_32F_FAST_TF32 or CUBLAS_COMPUTE_32F (allow_tf32).
// Uses ctx's cuBLASLt handle and its 32 MiB workspace; nothing is cached between calls.
// bias_grad_cuda: column sums in fp32, rows split into fixed chunks (partials in ctx.scratch), chunks summed
// in a fixed order: deterministic, no atomics.
void gemm_cuda(const GemmParams& p, DType dtype, void* c, const void* a, const void* b, const void* bias, Context& ctx);
void bias_grad_cuda(const BiasGradParams& p, DType dtype, void* d_bias, const void* d_c, Context& ctx);
// The fused GELU matmul (see gemm_gelu_forward): false, having launched nothing, when cuBLASLt has no algorithm
// with that epilogue.
bool gemm_gelu_forward_cuda(const GemmParams& p, DType dtype, void* out, void* pre, const void* a, const void* b,
                            const void* bias, Context& ctx);

}  // namespace tessera
