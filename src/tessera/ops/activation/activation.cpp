// Tensor-level bias + activation: checks, then the reference (CPU) or the CUDA kernels.
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/dispatch.h"

namespace tessera {

bool activation_supports(const ActivationParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.N < 0 || p.d_ff <= 0) {
    if (why) *why = "needs N >= 0 and d_ff > 0";
    return false;
  }
  if (!(p.dropout >= 0.0f && p.dropout < 1.0f)) {
    if (why) *why = "dropout must be in [0, 1)";
    return false;
  }
  return true;
}

namespace {
// Widths of in (and bias) and of out.
int64_t in_width(const ActivationParams& p) { return p.kind == Activation::Swiglu ? 2LL * p.d_ff : p.d_ff; }

void check_activation(const char* op, const ActivationParams& p, DType dtype, const Context& ctx) {
  std::string why;
  require_supported(activation_supports(p, dtype, ctx.device(), &why), op, why);
}
}  // namespace

void activation_forward(const ActivationParams& p, const Tensor& out, const Tensor& in, const Tensor& bias,
                        Context& ctx) {
  constexpr const char* op = "activation_forward";
  const DType dt = in.dtype();
  check_activation(op, p, dt, ctx);
  const int64_t W = in_width(p);
  expect(in, op, "in", dt, p.N * W, ctx);
  expect(out, op, "out", dt, static_cast<int64_t>(p.N) * p.d_ff, ctx);
  expect(bias, op, "bias", dt, W, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op, [&] { activation_forward_cuda(p, dt, out.data(), in.data(), bias.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        activation_forward_ref<T>(p, out.as<T>(), in.as<T>(), bias.as<T>());
      });
}

void activation_backward(const ActivationParams& p, const Tensor& d_in, const Tensor& d_bias, const Tensor& d_out,
                         const Tensor& in, const Tensor& bias, Context& ctx) {
  constexpr const char* op = "activation_backward";
  const DType dt = in.dtype();
  check_activation(op, p, dt, ctx);
  const int64_t W = in_width(p);
  expect(in, op, "in", dt, p.N * W, ctx);
  expect(d_in, op, "d_in", dt, p.N * W, ctx);
  expect(d_out, op, "d_out", dt, static_cast<int64_t>(p.N) * p.d_ff, ctx);
  expect(bias, op, "bias", dt, W, ctx, /*optional=*/true);
  expect(d_bias, op, "d_bias", dt, W, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op,
      [&] { activation_backward_cuda(p, dt, d_in.data(), d_bias.data(), d_out.data(), in.data(), bias.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        activation_backward_ref<T>(p, d_in.as<T>(), d_bias.as<T>(), d_out.as<T>(), in.as<T>(), bias.as<T>());
      });
}

}  // namespace tessera
