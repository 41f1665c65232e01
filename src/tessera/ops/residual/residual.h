// tessera/ops/residual — bias + dropout + residual add, fused.
//
//   out = residual + dropout(x + bias)
// residual, x, out: (N, C); bias: (C) or null. Element i is kept when philox_keep(seed, stream, i, dropout)
// and kept elements are scaled by 1 / (1 - dropout).
// Backward: d_residual = d_out (the caller reuses d_out), d_x = mask * d_out / (1 - p) is overwritten,
// d_bias accumulates Σ_n d_x (may be null).
#pragma once
#include <cstdint>

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
