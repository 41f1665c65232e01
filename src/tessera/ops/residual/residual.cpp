// Tensor-level bias + dropout + residual: checks, then the reference (CPU) or the CUDA kernels.
#include "tessera/ops/residual/residual.h"
#include "tessera/ops/dispatch.h"

namespace tessera {

bool residual_supports(const ResidualParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.N < 0 || p.C <= 0) {
    if (why) *why = "needs N >= 0 and C > 0";
    return false;
  }
  if (!(p.dropout >= 0.0f && p.dropout < 1.0f)) {
    if (why) *why = "dropout must be in [0, 1), got " + std::to_string(p.dropout);
    return false;
  }
  return true;
}

namespace {
void check_residual(const char* op, const ResidualParams& p, DType dtype, const Context& ctx) {
  std::string why;
  require_supported(residual_supports(p, dtype, ctx.device(), &why), op, why);
}
}  // namespace

void residual_forward(const ResidualParams& p, const Tensor& out, const Tensor& residual, const Tensor& x,
                      const Tensor& bias, Context& ctx) {
  constexpr const char* op = "residual_forward";
  const DType dt = x.dtype();
  check_residual(op, p, dt, ctx);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(x, op, "x", dt, NC, ctx);
  expect(residual, op, "residual", dt, NC, ctx);
  expect(out, op, "out", dt, NC, ctx);
  expect(bias, op, "bias", dt, p.C, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op, [&] { residual_forward_cuda(p, dt, out.data(), residual.data(), x.data(), bias.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        residual_forward_ref<T>(p, out.as<T>(), residual.as<T>(), x.as<T>(), bias.as<T>());
      });
}

void residual_backward(const ResidualParams& p, const Tensor& d_x, const Tensor& d_bias, const Tensor& d_out,
                       Context& ctx) {
  constexpr const char* op = "residual_backward";
  const DType dt = d_out.dtype();
  check_residual(op, p, dt, ctx);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(d_out, op, "d_out", dt, NC, ctx);
  expect(d_x, op, "d_x", dt, NC, ctx);
  expect(d_bias, op, "d_bias", dt, p.C, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op, [&] { residual_backward_cuda(p, dt, d_x.data(), d_bias.data(), d_out.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        residual_backward_ref<T>(p, d_x.as<T>(), d_bias.as<T>(), d_out.as<T>());
      });
}

}  // namespace tessera
