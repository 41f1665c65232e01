// tessera/ops/gemm/gemv.h — a few rows times a Linear layer's weight, with the bias and activation applied:
//
//   c[m, n] = act(Σ_k a[m, k] W[n, k] + bias[n]),   m < M <= kGemvMaxRows,  n < N,  k < K
//
// a: (M, K) packed; W: (N, K) row-major (the layer's (out, in) weight, gemm's trans_b); bias: (N) or none;
// c: (M, ldc), ldc >= N. act: none, or Gelu (tanh form), GeluErf or Relu with activation.h's formulas (Swiglu
// has a gate and is not an epilogue).
//
// Why an op of its own: a decode step multiplies one row per sequence, M <= 16, by every weight matrix. The
// product then is a read of W, each weight used M times; a GEMM library's tiles are 64+ rows tall, and at M = 1
// cuBLASLt splits K and sums the parts in a second kernel. This op is one kernel per product with its epilogue,
// so a decode step's launches fall by one or two per product.
//
// CPU (the reference): gemm_ref, then activation_forward_ref. CUDA (bf16 / f16; the f32 engine keeps the exact
// fp32 GEMM, which follows the CPU to accumulation order): a block of four warps owns NC adjacent output columns
// and splits K into four ranges, one per warp; lane j of a warp reads 16-byte packs j, j + 32, ... of its range of
// each column's weight row (the weights stream through once, not kept in L1) and of every row of a (from L1 /
// L2: a is small and read by every block), accumulating M x NC dot products in fp32 registers; the warps' sums
// meet in shared memory and the epilogue adds the bias, applies act in fp32 and rounds once.
// Needs K a whole number of packs and a, W 16-byte aligned (gemv_supports says why not).
#pragma once
#include <optional>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/activation/activation.h"

namespace tessera {

constexpr int kGemvMaxRows = 16;

struct GemvParams {
  int M = 0, N = 0, K = 0;
  int64_t ldc = 0;                  // c's row stride; 0: N
  std::optional<Activation> act{};  // none: c = a Wᵀ + bias
  int64_t ld_c() const { return ldc ? ldc : N; }
};

template <typename T>
void gemv_ref(const GemvParams& p, T* c, const T* a, const T* w, const T* bias);

}  // namespace tessera

// ---- Tensor-level entry (gemv.cpp): the reference (CPU) or the CUDA kernel by device and dtype. ----
// a, w, bias (optional: an undefined Tensor), c in the compute dtype, contiguous; c must not overlap the inputs.
namespace tessera {

// Whether the kernel takes p on `device` with these tensors' alignment: on the CPU every shape; on CUDA bf16 / f16,
// M in [1, kGemvMaxRows], K a multiple of 8, a and w 16-byte aligned, act not Swiglu.
bool gemv_supports(const GemvParams& p, DType dtype, Device device, const void* a = nullptr, const void* w = nullptr,
                   std::string* why = nullptr);
void gemv(const GemvParams& p, const Tensor& c, const Tensor& a, const Tensor& w, const Tensor& bias, Context& ctx);

// ---- CUDA launcher (gemv.cu), on ctx's stream; pointers are device memory in `dtype`. ----
void gemv_cuda(const GemvParams& p, DType dtype, void* c, const void* a, const void* w, const void* bias, Context& ctx);

}  // namespace tessera
