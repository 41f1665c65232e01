#include <cmath>

#include "tessera/core/error.h"
#include "tessera/core/parallel.h"
#include "tessera/ops/activation/activation.h"

namespace tessera {

Activation activation_from_name(std::string_view name) {
  if (name == "gelu") return Activation::Gelu;
  if (name == "relu") return Activation::Relu;
  if (name == "swiglu") return Activation::Swiglu;
  TS_THROW("unknown mlp activation '", name, "' (expected gelu, relu or swiglu)");
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::Gelu: return "gelu";
    case Activation::Relu: return "relu";
    case Activation::Swiglu: return "swiglu";
  }
  return "?";
}

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;

double gelu(double u) { return 0.5 * u * (1.0 + std::tanh(kSqrt2OverPi * (u + 0.044715 * u * u * u))); }
double gelu_grad(double u) {
  const double inner = kSqrt2OverPi * (u + 0.044715 * u * u * u);
  const double th = std::tanh(inner);
  return 0.5 * (1.0 + th) + 0.5 * u * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * u * u);
}
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
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
        out[n * F + f] = static_cast<T>(g * sigmoid(g) * u);
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) if (static_cast <long>(p.N) * F >= kParallelMinWork)
  for (long n = 0; n < p.N; ++n) {
    for (int f = 0; f < F; ++f) {
      const double u = in[n * F + f] + (bias ? bias[f] : T(0));
      out[n * F + f] = static_cast<T>(p.kind == Activation::Gelu ? gelu(u) : (u > 0 ? u : 0.0));
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
        const double dy = d_out[n * F + f];
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
        const double grad = p.kind == Activation::Gelu ? gelu_grad(u) : (u > 0 ? 1.0 : 0.0);
        d_in[n * F + f] = static_cast<T>(d_out[n * F + f] * grad);
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
