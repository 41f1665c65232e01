// tessera/ops/activation — bias + activation, fused.
//
// Gelu (tanh form, GPT-2's "gelu_new"): y = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u³))),  u = x + bias
// Relu: y = max(u, 0)
// in, out: (N, d_ff); bias: (d_ff) or null.
// Swiglu: in is (N, 2 d_ff) with each row [gate | up] (+ bias of 2 d_ff), y = silu(gate) * up: (N, d_ff),
//   silu(g) = g / (1 + exp(-g)).
// Backward: d_in overwritten (same shape as in), d_bias accumulated (may be null).
#pragma once
#include <string_view>

namespace tessera {

enum class Activation { Gelu, Relu, Swiglu };

Activation activation_from_name(std::string_view name);
std::string_view activation_name(Activation a);

struct ActivationParams {
  int N = 0, d_ff = 0;
  Activation kind = Activation::Gelu;
};

template <typename T>
void activation_forward_ref(const ActivationParams& p, T* out, const T* in, const T* bias);
template <typename T>
void activation_backward_ref(const ActivationParams& p, T* d_in, T* d_bias, const T* d_out, const T* in,
                             const T* bias);

}  // namespace tessera
