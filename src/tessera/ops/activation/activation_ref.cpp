#include <cmath>

#include "tessera/core/error.h"
#include "tessera/core/parallel.h"
#include "tessera/core/philox.h"
#include "tessera/ops/activation/activation.h"

namespace tessera {

Activation activation_from_name(std::string_view name) {
  if (name == "gelu") return Activation::Gelu;
  if (name == "relu") return Activation::Relu;
  if (name == "swiglu") return Activation::Swiglu;
  if (name == "gelu_erf") return Activation::GeluErf;
  TS_THROW("unknown mlp activation '", name, "' (expected gelu, relu, swiglu or gelu_erf)");
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::Gelu: return "gelu";
    case Activation::Relu: return "relu";
    case Activation::Swiglu: return "swiglu";
    case Activation::GeluErf: return "gelu_erf";
  }
  return "?";
}

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kSqrtHalf = 0.7071067811865476;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1 / sqrt(2 pi)

double gelu(double u) { return 0.5 * u * (1.0 + std::tanh(kSqrt2OverPi * (u + 0.044715 * u * u * u))); }
double gelu_grad(double u) {
  const double inner = kSqrt2OverPi * (u + 0.044715 * u * u * u);
  const double th = std::tanh(inner);
  return 0.5 * (1.0 + th) + 0.5 * u * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * u * u);
}
// 0.5 u (1 + erf(u / sqrt 2)); its derivative Φ(u) + u φ(u).
double gelu_erf(double u) { return 0.5 * u * (1.0 + std::erf(u * kSqrtHalf)); }
double gelu_erf_grad(double u) {
  return 0.5 * (1.0 + std::erf(u * kSqrtHalf)) + u * kInvSqrt2Pi * std::exp(-0.5 * u * u);
}
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
// Gelu, GeluErf or Relu of u, and its derivative.
double act(Activation k, double u) {
  return k == Activation::Gelu ? gelu(u) : k == Activation::GeluErf ? gelu_erf(u) : (u > 0 ? u : 0.0);
}
double act_grad(Activation k, double u) {
  return k == Activation::Gelu ? gelu_grad(u) : k == Activation::GeluErf ? gelu_erf_grad(u) : (u > 0 ? 1.0 : 0.0);
}
// The dropout factor of output element i: Z_i = keep_i / (1 - p), or 1 without dropout.
template <typename T>
T drop_factor(const ActivationParams& p, long i) {
  if (p.dropout <= 0) return T(1);
  const T keep_scale = T(1) / (T(1) - T(p.dropout));
  return philox_keep(p.seed, p.stream, static_cast<uint64_t>(i), p.dropout) ? keep_scale : T(0);
}
}  // namespace

template <typename T>
void activation_forward_ref(const ActivationParams& p, T* out, const T* in, const T* bias) {
  const int F = p.d_ff;
  if (p.kind == Activation::Swiglu) {
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * F >= kParallelMinWork)
    for (long n = 0; n < p.N; ++n) {
      const T* r = in + n * 2L * F;
      for (int f = 0; f < F; ++f) {
        const double g = r[f] + (bias ? bias[f] : T(0));
        const double u = r[F + f] + (bias ? bias[F + f] : T(0));
        out[n * F + f] = static_cast<T>(g * sigmoid(g) * u) * drop_factor<T>(p, n * F + f);
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * F >= kParallelMinWork)
  for (long n = 0; n < p.N; ++n) {
    for (int f = 0; f < F; ++f) {
      const double u = in[n * F + f] + (bias ? bias[f] : T(0));
      out[n * F + f] = static_cast<T>(act(p.kind, u)) * drop_factor<T>(p, n * F + f);
    }
  }
}

template <typename T>
void activation_backward_ref(const ActivationParams& p, T* d_in, T* d_bias, const T* d_out, const T* in,
                             const T* bias) {
  const int F = p.d_ff;
  const int in_w = p.kind == Activation::Swiglu ? 2 * F : F;
  if (p.kind == Activation::Swiglu) {
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * F >= kParallelMinWork)
    for (long n = 0; n < p.N; ++n) {
      const T* r = in + n * 2L * F;
      T* dr = d_in + n * 2L * F;
      for (int f = 0; f < F; ++f) {
        const double g = r[f] + (bias ? bias[f] : T(0));
        const double u = r[F + f] + (bias ? bias[F + f] : T(0));
        const double s = sigmoid(g);
        const double dy = d_out[n * F + f] * drop_factor<T>(p, n * F + f);
        const double dg = dy * u * s * (1.0 + g * (1.0 - s));
        const double du = dy * g * s;
        dr[f] = static_cast<T>(dg);
        dr[F + f] = static_cast<T>(du);
      }
    }
  } else {
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * F >= kParallelMinWork)
    for (long n = 0; n < p.N; ++n) {
      for (int f = 0; f < F; ++f) {
        const double u = in[n * F + f] + (bias ? bias[f] : T(0));
        const double grad = act_grad(p.kind, u);
        d_in[n * F + f] = static_cast<T>(d_out[n * F + f] * drop_factor<T>(p, n * F + f) * grad);
      }
    }
  }
  // d_bias: column sums of d_in, in row order (serial, so the sum does not depend on the thread count).
  if (d_bias)
    for (long n = 0; n < p.N; ++n)
      for (int f = 0; f < in_w; ++f) d_bias[f] += d_in[n * in_w + f];
}

template void activation_forward_ref<float>(const ActivationParams&, float*, const float*, const float*);
template void activation_forward_ref<double>(const ActivationParams&, double*, const double*, const double*);
template void activation_backward_ref<float>(const ActivationParams&, float*, float*, const float*, const float*,
                                             const float*);
template void activation_backward_ref<double>(const ActivationParams&, double*, double*, const double*, const double*,
                                              const double*);

}  // namespace tessera
