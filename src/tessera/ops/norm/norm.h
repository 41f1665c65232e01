// tessera/ops/norm — LayerNorm and RMSNorm over the last dimension.
//
// LayerNorm: mean = Σx/C, rstd = 1/sqrt(Σ(x-mean)²/C + eps), out = (x - mean) * rstd * w + b
// RMSNorm:   rstd = 1/sqrt(Σx²/C + eps),                       out = x * rstd * w
// x, out: (N, C) row-major; w, b: (C); mean, rstd: (N), saved for the backward.
// Backward: d_x is ACCUMULATED (the norm input is the residual stream, whose gradient already holds the skip
// path), d_w and d_b are accumulated; b / d_b may be null (no bias).
#pragma once
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

struct NormParams {
  int N = 0, C = 0;
  float eps = 1e-5f;
};

template <typename T>
void layernorm_forward_ref(const NormParams& p, T* out, T* mean, T* rstd, const T* x, const T* w, const T* b);
template <typename T>
void layernorm_backward_ref(const NormParams& p, T* d_x, T* d_w, T* d_b, const T* d_out, const T* x, const T* w,
                            const T* mean, const T* rstd);

template <typename T>
void rmsnorm_forward_ref(const NormParams& p, T* out, T* rstd, const T* x, const T* w);
template <typename T>
void rmsnorm_backward_ref(const NormParams& p, T* d_x, T* d_w, const T* d_out, const T* x, const T* w, const T* rstd);

}  // namespace tessera

// ---- Tensor-level entries (norm.cpp): route to the reference or the CUDA kernels by device and dtype. ----
// x, out, d_x, d_out: (N, C) in the compute dtype; w, b, d_w, d_b: (C) compute dtype (b / d_b may be undefined
// Tensors: no bias); mean, rstd: (N) f32 (f64 for an f64 computation).
namespace tessera {

bool norm_supports(const NormParams& p, DType dtype, Device device, std::string* why = nullptr);

void layernorm_forward(const NormParams& p, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& w, const Tensor& b, Context& ctx);
void layernorm_backward(const NormParams& p, const Tensor& d_x, const Tensor& d_w, const Tensor& d_b,
                        const Tensor& d_out, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        Context& ctx);
void rmsnorm_forward(const NormParams& p, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     Context& ctx);
void rmsnorm_backward(const NormParams& p, const Tensor& d_x, const Tensor& d_w, const Tensor& d_out, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, Context& ctx);

// The residual add fused with the norm that reads its output (the forward of norm_residual_backward's pair):
//   mid = residual + Drop(y + bias)  (residual_forward, mid stored in the dtype),  out = norm(mid as stored)
// with mean / rstd saved as the norm saves them; one kernel on the GPU (mid is not read back), the two references
// composed on the CPU. p.N and p.C must be the norm's. mid and out are memory of their own: not residual's, y's or
// each other's (the kernel reads residual and y through __restrict__ pointers, a row ahead). bias, b: (C) or
// undefined; mean undefined for RMSNorm (then b must be too).
void norm_residual_forward(const NormParams& p, bool layernorm, const ResidualParams& rp, const Tensor& mid,
                           const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                           const Tensor& y, const Tensor& bias, const Tensor& w, const Tensor& b, Context& ctx);

// The norm backward fused with the backward of the residual add that made the norm's input
// (x = residual + Drop(y + bias), residual.h): after d_x += norm_backward(d_out),
//   d_y = Drop'(d_x) (d_x as stored),  d_bias += Σ_rows d_y   — residual_backward(p, d_y, d_bias, d_x)
// on the GPU in the same kernel, so d_x is not read back and one launch and one bias reduction are saved; the CPU
// composes the two references. p.N and p.C must be the norm's. d_y: (N, C), overwritten, not d_x's memory;
// d_bias: (C) or undefined. `mean` is undefined for RMSNorm (then d_b must be too).
struct NormResidualBackward {
  ResidualParams p;
  Tensor d_y, d_bias;
};
void norm_residual_backward(const NormParams& p, bool layernorm, const Tensor& d_x, const Tensor& d_w,
                            const Tensor& d_b, const Tensor& d_out, const Tensor& x, const Tensor& w,
                            const Tensor& mean, const Tensor& rstd, const NormResidualBackward& res, Context& ctx);

// ---- CUDA launchers (norm.cu), on ctx's stream. Pointers are device memory in `dtype` unless typed. ----
// Both directions: a row is taken by a group of G threads (a power of two from 32 to 256, the smallest that holds
// the row in registers; G = 32 for C = 768 in 16-bit, so the reductions are warp shuffles), R = 256 / G rows per
// block, as many blocks as are resident, looping over the rows; 16-byte loads when the rows allow them.
// Forward: one pass (Σx and Σx² together, the LightSeq formulation) over the row held in registers.
// Backward: one group reduction per row for the two sums that d_x needs (d_out, x and d_x of a row loaded together);
// d_w / d_b are summed per thread in its own row of shared memory, then per block in group order, then over blocks in a
// fixed order (deterministic, no atomics) and added to d_w / d_b. Needs C <= kNormMaxC.
constexpr int kNormMaxC = 4096;
void layernorm_forward_cuda(const NormParams& p, DType dtype, void* out, float* mean, float* rstd, const void* x,
                            const void* w, const void* b, Context& ctx);
void layernorm_backward_cuda(const NormParams& p, DType dtype, void* d_x, void* d_w, void* d_b, const void* d_out,
                             const void* x, const void* w, const float* mean, const float* rstd, Context& ctx);
void rmsnorm_forward_cuda(const NormParams& p, DType dtype, void* out, float* rstd, const void* x, const void* w,
                          Context& ctx);
void rmsnorm_backward_cuda(const NormParams& p, DType dtype, void* d_x, void* d_w, const void* d_out, const void* x,
                           const void* w, const float* rstd, Context& ctx);
// The fused residual + norm forward: the norm forward kernel loading residual and y for each row, with mid made
// from them in registers (bias, the add's dropout factors), stored, and normalised. mean null: RMSNorm.
void norm_residual_forward_cuda(const NormParams& p, DType dtype, const ResidualParams& rp, void* mid, void* out,
                                float* mean, float* rstd, const void* residual, const void* y, const void* bias,
                                const void* w, const void* b, Context& ctx);
// The fused norm + residual backward: the norm backward kernel with the residual's dropout factors applied to each
// d_x unit as it is stored, d_y written beside it, and the bias sums kept with d_w's and d_b's (one more partial
// row per block, reduced by the same fixed-order kernel). mean null: RMSNorm.
void norm_residual_backward_cuda(const NormParams& p, DType dtype, void* d_x, void* d_w, void* d_b, const void* d_out,
                                 const void* x, const void* w, const float* mean, const float* rstd,
                                 const ResidualParams& rp, void* d_y, void* d_bias, Context& ctx);

}  // namespace tessera
