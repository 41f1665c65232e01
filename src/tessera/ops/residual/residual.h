// tessera/ops/residual — bias + dropout + residual add, fused.
//
//   out = residual + dropout(x + bias)
// residual, x, out: (N, C); bias: (C) or null. Element i is kept when philox_keep(seed, stream, i, dropout)
// and kept elements are scaled by 1 / (1 - dropout).
// Backward: d_residual = d_out (the caller reuses d_out), d_x = mask * d_out / (1 - p) is overwritten,
// d_bias accumulates Σ_n d_x (may be null).
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct ResidualParams {
  int N = 0, C = 0;
  float dropout = 0.0f;
  uint64_t seed = 0, stream = 0;
};

template <typename T>
void residual_forward_ref(const ResidualParams& p, T* out, const T* residual, const T* x, const T* bias);
template <typename T>
void residual_backward_ref(const ResidualParams& p, T* d_x, T* d_bias, const T* d_out);

}  // namespace tessera

// ---- Tensor-level entries (residual.cpp): the reference (CPU) or the CUDA kernels by device and dtype. ----
// residual, x, out, d_x, d_out: (N, C) in the compute dtype; bias, d_bias: (C) or undefined (no bias).
// In place: out may be the same memory as residual or x, and d_x the same as d_out (each element is read and
// written by one thread). The bias gradient of Linear layers without dropout (bias_grad_ref) lives in ops/gemm.
namespace tessera {

bool residual_supports(const ResidualParams& p, DType dtype, Device device, std::string* why = nullptr);

void residual_forward(const ResidualParams& p, const Tensor& out, const Tensor& residual, const Tensor& x,
                      const Tensor& bias, Context& ctx);
void residual_backward(const ResidualParams& p, const Tensor& d_x, const Tensor& d_bias, const Tensor& d_out,
                       Context& ctx);

// ---- CUDA launchers (residual.cu), on ctx's stream; pointers are device memory in `dtype`. ----
// Forward: one thread per 16-byte pack (scalar when C is not a multiple of the pack or a pointer is not 16-byte
// aligned); one read of each input, one write of out; dropout words come a whole Philox block (4 elements) at
// a time. Backward: a grid of (column chunks × row groups) blocks of 8 packs × 32 rows (32 × 8 single elements);
// each thread writes d_x for its columns down its rows and sums them in registers; the block reduces its row lanes
// in shared memory in a fixed order to one f32 partial row in ctx.scratch (row groups × C floats), and the last
// block of each column chunk to finish (counted in ctx.arrival_counters()) adds that chunk's partials over row
// groups in order to d_bias, in the same launch: deterministic, no float atomics. The grid is one wave of blocks.
void residual_forward_cuda(const ResidualParams& p, DType dtype, void* out, const void* residual, const void* x,
                           const void* bias, Context& ctx);
void residual_backward_cuda(const ResidualParams& p, DType dtype, void* d_x, void* d_bias, const void* d_out,
                            Context& ctx);

}  // namespace tessera
