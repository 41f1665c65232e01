// tessera/ops/activation/activation_math.cuh — the activations' scalar math on the device (activation.h gives the
// formulas), shared by the activation kernels and the epilogues that apply an activation in place (ops/gemm/gemv.cu).
#pragma once
#include <type_traits>

#include "tessera/ops/activation/activation.h"

namespace tessera::act_math {

constexpr float kSqrt2OverPi = 0.7978845608028654f;

// tanh for the GELU of T: the hardware approximation (tanh.approx.f32, one MUFU op, max relative error 2^-10.99)
// for 16-bit T, whose rounding of the result (2^-8 for bf16, 2^-11 for f16) is as coarse; the accurate tanhf for
// f32, whose tests compare at 1e-5. tanhf's instruction count would hold a 16-bit forward well below the copy
// bandwidth.
template <typename T>
__device__ __forceinline__ float tanh_for(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return tanhf(x);
  } else {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }
}
template <typename T>
__device__ __forceinline__ float gelu_tanh(float u) {
  return 0.5f * u * (1.0f + tanh_for<T>(kSqrt2OverPi * (u + 0.044715f * u * u * u)));
}
template <typename T>
__device__ __forceinline__ float gelu_tanh_grad(float u) {
  const float th = tanh_for<T>(kSqrt2OverPi * (u + 0.044715f * u * u * u));
  return 0.5f * (1.0f + th) + 0.5f * u * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * u * u);
}
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
// The exact GELU, 0.5 u (1 + erf(u / sqrt 2)), and its derivative Φ(u) + u φ(u).
__device__ __forceinline__ float gelu_erf(float u) { return 0.5f * u * (1.0f + erff(u * 0.70710678f)); }
__device__ __forceinline__ float gelu_erf_grad(float u) {
  return 0.5f * (1.0f + erff(u * 0.70710678f)) + u * 0.39894228f * expf(-0.5f * u * u);
}
// The activations without a gate, by the code the launchers pass: kActRelu, kActGelu (tanh form), kActGeluErf.
enum : int { kActRelu = 0, kActGelu = 1, kActGeluErf = 2 };
template <typename T>
__device__ __forceinline__ float act_of(int act, float u) {
  return act == kActGelu ? gelu_tanh<T>(u) : act == kActGeluErf ? gelu_erf(u) : fmaxf(u, 0.0f);
}
template <typename T>
__device__ __forceinline__ float act_grad_of(int act, float u) {
  return act == kActGelu ? gelu_tanh_grad<T>(u) : act == kActGeluErf ? gelu_erf_grad(u) : (u > 0.0f ? 1.0f : 0.0f);
}
// The code of an activation without a gate (Swiglu has none: its kernels take the gate apart).
inline int act_code(Activation k) {
  return k == Activation::Gelu ? kActGelu : k == Activation::GeluErf ? kActGeluErf : kActRelu;
}
}  // namespace tessera::act_math
