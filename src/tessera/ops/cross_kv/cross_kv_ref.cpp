// The references of the layer-batched K/V projection (cross_kv.h): plain loops, in the order the formulas read.
#include "tessera/ops/cross_kv/cross_kv.h"

namespace tessera {

template <typename T>
void cross_kv_forward_ref(const CrossKvParams& p, T* kv, const T* m, const T* w, const T* bias) {
  // kv[i][n, j] = Σ_c m[n, c] W[i KV + j, c] + bias[i KV + j],  i = 2l + s over the 2L slices.
  for (int i = 0; i < 2 * p.L; ++i)
    for (int n = 0; n < p.Nk; ++n)
      for (int j = 0; j < p.KV; ++j) {
        const int64_t row = int64_t{i} * p.KV + j;
        double acc = bias ? static_cast<double>(bias[row]) : 0.0;
        for (int c = 0; c < p.C; ++c) acc += static_cast<double>(m[int64_t{n} * p.C + c]) * w[row * p.C + c];
        kv[i * p.stride() + int64_t{n} * p.KV + j] = static_cast<T>(acc);
      }
}

template <typename T>
void cross_kv_backward_ref(const CrossKvParams& p, T* d_w, T* d_bias, T* d_m, const T* d_kv, const T* m, const T* w,
                           bool accumulate) {
  if (!accumulate)
    for (int64_t e = 0; e < int64_t{p.Nk} * p.C; ++e) d_m[e] = T(0);
  for (int i = 0; i < 2 * p.L; ++i)
    for (int j = 0; j < p.KV; ++j) {
      const int64_t row = int64_t{i} * p.KV + j;
      for (int n = 0; n < p.Nk; ++n) {
        const T g = d_kv[i * p.stride() + int64_t{n} * p.KV + j];
        if (d_bias) d_bias[row] += g;
        for (int c = 0; c < p.C; ++c) {
          d_w[row * p.C + c] += g * m[int64_t{n} * p.C + c];  // d_W = dPᵀ m
          d_m[int64_t{n} * p.C + c] += g * w[row * p.C + c];  // d_m = dP W, summed over every layer's rows
        }
      }
    }
}

template <typename T>
void cross_kv_layout_forward_ref(const CrossKvParams& p, T* kv, const T* proj, const T* bias) {
  const int64_t W = p.width();
  for (int i = 0; i < 2 * p.L; ++i)
    for (int n = 0; n < p.Nk; ++n)
      for (int j = 0; j < p.KV; ++j) {
        const int64_t col = int64_t{i} * p.KV + j;
        kv[i * p.stride() + int64_t{n} * p.KV + j] = proj[n * W + col] + (bias ? bias[col] : T(0));
      }
}

template <typename T>
void cross_kv_layout_backward_ref(const CrossKvParams& p, T* d_proj, const T* d_kv) {
  const int64_t W = p.width();
  for (int i = 0; i < 2 * p.L; ++i)
    for (int n = 0; n < p.Nk; ++n)
      for (int j = 0; j < p.KV; ++j)
        d_proj[n * W + int64_t{i} * p.KV + j] = d_kv[i * p.stride() + int64_t{n} * p.KV + j];
}

template void cross_kv_forward_ref<float>(const CrossKvParams&, float*, const float*, const float*, const float*);
template void cross_kv_backward_ref<float>(const CrossKvParams&, float*, float*, float*, const float*, const float*,
                                           const float*, bool);
template void cross_kv_layout_forward_ref<float>(const CrossKvParams&, float*, const float*, const float*);
template void cross_kv_layout_backward_ref<float>(const CrossKvParams&, float*, const float*);
template void cross_kv_forward_ref<double>(const CrossKvParams&, double*, const double*, const double*, const double*);
template void cross_kv_backward_ref<double>(const CrossKvParams&, double*, double*, double*, const double*,
                                            const double*, const double*, bool);
template void cross_kv_layout_forward_ref<double>(const CrossKvParams&, double*, const double*, const double*);
template void cross_kv_layout_backward_ref<double>(const CrossKvParams&, double*, const double*);

}  // namespace tessera
