// tessera/ops/activation — bias + activation, fused.
//
// Gelu (tanh form, GPT-2's "gelu_new"): y = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u³))),  u = x + bias
// GeluErf (the exact form, BART's and torch's "gelu"): y = 0.5 u (1 + erf(u / sqrt(2)))
// Relu: y = max(u, 0)
// in, out: (N, d_ff); bias: (d_ff) or null.
// Swiglu: in is (N, 2 d_ff) with each row [gate | up] (+ bias of 2 d_ff), y = silu(gate) * up: (N, d_ff),
//   silu(g) = g / (1 + exp(-g)).
// Dropout on the output (dropout > 0: an encoder-decoder's activation dropout): out[n, f] = Z_i y, Z_i =
//   philox_keep(seed, stream, i = n d_ff + f) / (1 - dropout); the backward multiplies d_out by the same Z_i.
// Backward: d_in overwritten (same shape as in), d_bias accumulated (may be null).
#pragma once
#include <string>
#include <string_view>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

enum class Activation { Gelu, Relu, Swiglu, GeluErf };

Activation activation_from_name(std::string_view name);
std::string_view activation_name(Activation a);

struct ActivationParams {
  int N = 0, d_ff = 0;
  Activation kind = Activation::Gelu;
  float dropout = 0.0f;  // on the output, in [0, 1)
  uint64_t seed = 0, stream = 0;
};

template <typename T>
void activation_forward_ref(const ActivationParams& p, T* out, const T* in, const T* bias);
template <typename T>
void activation_backward_ref(const ActivationParams& p, T* d_in, T* d_bias, const T* d_out, const T* in, const T* bias);

}  // namespace tessera

// ---- Tensor-level entries (activation.cpp): the reference (CPU) or the CUDA kernels by device and dtype. ----
// Gelu / Relu: in, out, d_in, d_out: (N, d_ff). Swiglu: in, d_in: (N, 2 d_ff) rows [gate | up]; out, d_out:
// (N, d_ff). bias, d_bias: (d_ff), or (2 d_ff) for Swiglu, or undefined (no bias). All in the compute dtype.
// In place: Gelu / Relu may run with out == in and d_in == d_out (each element is read, then written, by one
// thread); Swiglu may not (the layouts differ).
namespace tessera {

bool activation_supports(const ActivationParams& p, DType dtype, Device device, std::string* why = nullptr);

void activation_forward(const ActivationParams& p, const Tensor& out, const Tensor& in, const Tensor& bias,
                        Context& ctx);
void activation_backward(const ActivationParams& p, const Tensor& d_in, const Tensor& d_bias, const Tensor& d_out,
                         const Tensor& in, const Tensor& bias, Context& ctx);

// ---- CUDA launchers (activation.cu), on ctx's stream; pointers are device memory in `dtype`. ----
// All math in f32 registers (tanhf / expf, no fast-math intrinsics). Forward: one thread per 16-byte pack of out
// (scalar when d_ff is not a multiple of the pack or a pointer is not 16-byte aligned), one read of each input
// and one write of out. Backward: a grid of (column chunks × row groups) blocks of 32 × 8 threads writes d_in
// and sums it per column in registers; the 8 row lanes are reduced in shared memory in a fixed order into an
// f32 partial row per group in ctx.scratch (groups × width floats), which the last block of each column chunk to
// finish (counted in ctx.arrival_counters()) adds over groups in order to d_bias, in the same launch:
// deterministic, no float atomics. The grid is one wave of blocks.
void activation_forward_cuda(const ActivationParams& p, DType dtype, void* out, const void* in, const void* bias,
                             Context& ctx);
void activation_backward_cuda(const ActivationParams& p, DType dtype, void* d_in, void* d_bias, const void* d_out,
                              const void* in, const void* bias, Context& ctx);

}  // namespace tessera
