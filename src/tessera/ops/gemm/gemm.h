// tessera/ops/gemm — C = alpha * op(A) op(B) + beta * C  (+ bias broadcast over rows).
//
// All row-major. op(A): (M, K), stored (M, K) or, with trans_a, (K, M). op(B): (K, N), stored (K, N) or,
// with trans_b, (N, K). C: (M, N). bias: (N) or null, added after the product.
// A Linear layer y = x Wᵀ + b with W stored (out, in) is gemm({M=rows, N=out, K=in, trans_b=true}).
// The CPU path calls OpenBLAS when the build found it, otherwise a plain loop (gemm_loop_ref, always built
// so the two can be compared).
#pragma once

namespace tessera {

struct GemmParams {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
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
