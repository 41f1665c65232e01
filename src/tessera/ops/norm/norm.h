// tessera/ops/norm — LayerNorm and RMSNorm over the last dimension.
//
// LayerNorm: mean = Σx/C, rstd = 1/sqrt(Σ(x-mean)²/C + eps), out = (x - mean) * rstd * w + b
// RMSNorm:   rstd = 1/sqrt(Σx²/C + eps),                       out = x * rstd * w
// x, out: (N, C) row-major; w, b: (C); mean, rstd: (N), saved for the backward.
// Backward: d_x is ACCUMULATED (the norm input is the residual stream, whose gradient already holds the skip
// path), d_w and d_b are accumulated; b / d_b may be null (no bias).
#pragma once

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
void rmsnorm_backward_ref(const NormParams& p, T* d_x, T* d_w, const T* d_out, const T* x, const T* w,
                          const T* rstd);

}  // namespace tessera
