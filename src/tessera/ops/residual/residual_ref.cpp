#include "tessera/core/philox.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

template <typename T>
void residual_forward_ref(const ResidualParams& p, T* out, const T* residual, const T* x, const T* bias) {
  const T keep_scale = p.dropout > 0 ? T(1) / (T(1) - T(p.dropout)) : T(1);
  for (long n = 0; n < p.N; ++n) {
    for (int c = 0; c < p.C; ++c) {
      const long i = n * p.C + c;
      T v = x[i] + (bias ? bias[c] : T(0));
      if (p.dropout > 0) v = philox_keep(p.seed, p.stream, static_cast<uint64_t>(i), p.dropout) ? v * keep_scale : T(0);
      out[i] = residual[i] + v;
    }
  }
}

template <typename T>
void residual_backward_ref(const ResidualParams& p, T* d_x, T* d_bias, const T* d_out) {
  const T keep_scale = p.dropout > 0 ? T(1) / (T(1) - T(p.dropout)) : T(1);
  for (long n = 0; n < p.N; ++n) {
    for (int c = 0; c < p.C; ++c) {
      const long i = n * p.C + c;
      T g = d_out[i];
      if (p.dropout > 0) g = philox_keep(p.seed, p.stream, static_cast<uint64_t>(i), p.dropout) ? g * keep_scale : T(0);
      d_x[i] = g;
      if (d_bias) d_bias[c] += g;
    }
  }
}

template void residual_forward_ref<float>(const ResidualParams&, float*, const float*, const float*, const float*);
template void residual_forward_ref<double>(const ResidualParams&, double*, const double*, const double*, const double*);
template void residual_backward_ref<float>(const ResidualParams&, float*, float*, const float*);
template void residual_backward_ref<double>(const ResidualParams&, double*, double*, const double*);

}  // namespace tessera
