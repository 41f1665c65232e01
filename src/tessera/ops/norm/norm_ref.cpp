#include <cmath>

#include "tessera/ops/norm/norm.h"

namespace tessera {

// Statistics are accumulated in double so the reference is the accurate side of every comparison.
template <typename T>
void layernorm_forward_ref(const NormParams& p, T* out, T* mean, T* rstd, const T* x, const T* w, const T* b) {
  for (int n = 0; n < p.N; ++n) {
    const T* xr = x + static_cast<long>(n) * p.C;
    double m = 0;
    for (int c = 0; c < p.C; ++c) m += xr[c];
    m /= p.C;
    double var = 0;
    for (int c = 0; c < p.C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= p.C;
    const double rs = 1.0 / std::sqrt(var + p.eps);
    T* o = out + static_cast<long>(n) * p.C;
    for (int c = 0; c < p.C; ++c) o[c] = static_cast<T>((xr[c] - m) * rs * w[c] + (b ? b[c] : T(0)));
    mean[n] = static_cast<T>(m);
    rstd[n] = static_cast<T>(rs);
  }
}

// With xhat = (x - mean) * rstd and g = d_out * w:
//   d_x = rstd * (g - mean(g) - xhat * mean(g * xhat)),  d_w += Σ_n d_out * xhat,  d_b += Σ_n d_out
template <typename T>
void layernorm_backward_ref(const NormParams& p, T* d_x, T* d_w, T* d_b, const T* d_out, const T* x, const T* w,
                            const T* mean, const T* rstd) {
  for (int n = 0; n < p.N; ++n) {
    const long off = static_cast<long>(n) * p.C;
    const double m = mean[n], rs = rstd[n];
    double g_mean = 0, gx_mean = 0;
    for (int c = 0; c < p.C; ++c) {
      const double xhat = (x[off + c] - m) * rs;
      const double g = static_cast<double>(d_out[off + c]) * w[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= p.C;
    gx_mean /= p.C;
    for (int c = 0; c < p.C; ++c) {
      const double xhat = (x[off + c] - m) * rs;
      const double g = static_cast<double>(d_out[off + c]) * w[c];
      d_x[off + c] += static_cast<T>(rs * (g - g_mean - xhat * gx_mean));
      d_w[c] += static_cast<T>(d_out[off + c] * xhat);
      if (d_b) d_b[c] += d_out[off + c];
    }
  }
}

template <typename T>
void rmsnorm_forward_ref(const NormParams& p, T* out, T* rstd, const T* x, const T* w) {
  for (int n = 0; n < p.N; ++n) {
    const T* xr = x + static_cast<long>(n) * p.C;
    double ms = 0;
    for (int c = 0; c < p.C; ++c) ms += static_cast<double>(xr[c]) * xr[c];
    const double rs = 1.0 / std::sqrt(ms / p.C + p.eps);
    T* o = out + static_cast<long>(n) * p.C;
    for (int c = 0; c < p.C; ++c) o[c] = static_cast<T>(xr[c] * rs * w[c]);
    rstd[n] = static_cast<T>(rs);
  }
}

// With xhat = x * rstd and g = d_out * w:  d_x = rstd * (g - xhat * mean(g * xhat)),  d_w += Σ_n d_out * xhat
template <typename T>
void rmsnorm_backward_ref(const NormParams& p, T* d_x, T* d_w, const T* d_out, const T* x, const T* w, const T* rstd) {
  for (int n = 0; n < p.N; ++n) {
    const long off = static_cast<long>(n) * p.C;
    const double rs = rstd[n];
    double gx_mean = 0;
    for (int c = 0; c < p.C; ++c) gx_mean += static_cast<double>(d_out[off + c]) * w[c] * x[off + c] * rs;
    gx_mean /= p.C;
    for (int c = 0; c < p.C; ++c) {
      const double xhat = x[off + c] * rs;
      const double g = static_cast<double>(d_out[off + c]) * w[c];
      d_x[off + c] += static_cast<T>(rs * (g - xhat * gx_mean));
      d_w[c] += static_cast<T>(d_out[off + c] * xhat);
    }
  }
}

#define TS_INSTANTIATE_NORM(T) \
  template void layernorm_forward_ref<T>(const NormParams&, T*, T*, T*, const T*, const T*, const T*); \
  template void layernorm_backward_ref<T>(const NormParams&, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                          const T*); \
  template void rmsnorm_forward_ref<T>(const NormParams&, T*, T*, const T*, const T*); \
  template void rmsnorm_backward_ref<T>(const NormParams&, T*, T*, const T*, const T*, const T*, const T*);
TS_INSTANTIATE_NORM(float)
TS_INSTANTIATE_NORM(double)
#undef TS_INSTANTIATE_NORM

}  // namespace tessera
