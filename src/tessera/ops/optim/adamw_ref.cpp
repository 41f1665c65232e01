#include <cmath>

#include "tessera/core/error.h"
#include "tessera/ops/optim/adamw.h"

namespace tessera {

void adamw_update_ref(const AdamWParams& p, const std::vector<ParamSegment>& segments, float* params,
                      const float* grads, float* m, float* v) {
  TS_CHECK(p.step >= 1, "adamw: step must start at 1, got ", p.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  for (const ParamSegment& seg : segments) {
    const float decay = seg.decay ? p.lr * p.weight_decay : 0.0f;
    for (size_t i = seg.offset; i < seg.offset + seg.numel; ++i) {
      const float g = grads[i];
      m[i] = p.beta1 * m[i] + (1.0f - p.beta1) * g;
      v[i] = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
      const double m_hat = m[i] / bc1;
      const double v_hat = v[i] / bc2;
      float w = params[i] * (1.0f - decay);
      w -= static_cast<float>(p.lr * m_hat / (std::sqrt(v_hat) + p.eps));
      params[i] = w;
    }
  }
}

double grad_norm_ref(const float* grads, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(grads[i]) * grads[i];
  return std::sqrt(s);
}

void unscale_clip_grads_ref(float* grads, size_t n, double norm, double max_norm, double grad_scale) {
  double coef = 1.0 / grad_scale;
  if (max_norm > 0) {
    const double clip = max_norm / (norm + 1e-6);
    if (clip < 1.0) coef *= clip;
  }
  if (coef == 1.0) return;
  for (size_t i = 0; i < n; ++i) grads[i] = static_cast<float>(grads[i] * coef);
}

double clip_grad_norm_ref(float* grads, size_t n, double max_norm, double grad_scale) {
  TS_CHECK(grad_scale > 0 && std::isfinite(grad_scale),
           "clip_grad_norm: the gradient scale must be a positive "
           "number, got ",
           grad_scale);
  const double norm = grad_norm_ref(grads, n) / grad_scale;
  unscale_clip_grads_ref(grads, n, norm, max_norm, grad_scale);
  return norm;
}

}  // namespace tessera
