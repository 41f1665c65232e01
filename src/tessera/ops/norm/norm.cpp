// Tensor-level LayerNorm / RMSNorm: checks, then the reference (CPU) or the CUDA kernels.
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/dispatch.h"
#include "tessera/ops/residual/residual.h"

namespace tessera {

bool norm_supports(const NormParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.N < 0 || p.C <= 0) {
    if (why) *why = "needs N >= 0 and C > 0";
    return false;
  }
  if (!device.is_cpu() && p.C > kNormMaxC) {
    if (why) *why = "the CUDA kernels take C up to " + std::to_string(kNormMaxC) + ", got " + std::to_string(p.C);
    return false;
  }
  return true;
}

namespace {
void check_norm(const char* op, const NormParams& p, const Tensor& x, const Context& ctx) {
  std::string why;
  require_supported(norm_supports(p, x.dtype(), ctx.device(), &why), op, why);
}
// The fused norm + residual ops: both ops supported, one shape, and RMSNorm without a mean or a bias (b: the bias,
// or its gradient).
void check_norm_residual(const char* op, const NormParams& p, const ResidualParams& rp, bool layernorm, const Tensor& x,
                         const Tensor& mean, const Tensor& b, const Context& ctx) {
  check_norm(op, p, x, ctx);
  std::string why;
  require_supported(residual_supports(rp, x.dtype(), ctx.device(), &why), op, why);
  TS_CHECK(rp.N == p.N && rp.C == p.C, op, ": the residual's shape (", rp.N, ", ", rp.C, ") is not the norm's (", p.N,
           ", ", p.C, ")");
  TS_CHECK(layernorm || (!mean.defined() && !b.defined()), op, ": RMSNorm has no mean and no bias");
}
}  // namespace

void layernorm_forward(const NormParams& p, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& w, const Tensor& b, Context& ctx) {
  constexpr const char* op = "layernorm_forward";
  check_norm(op, p, x, ctx);
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(x, op, "x", dt, NC, ctx);
  expect(out, op, "out", dt, NC, ctx);
  expect(w, op, "w", dt, p.C, ctx);
  expect(b, op, "b", dt, p.C, ctx, /*optional=*/true);
  expect(mean, op, "mean", st, p.N, ctx);
  expect(rstd, op, "rstd", st, p.N, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        layernorm_forward_cuda(p, dt, out.data(), mean.as<float>(), rstd.as<float>(), x.data(), w.data(), b.data(),
                               ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        layernorm_forward_ref<T>(p, out.as<T>(), mean.as<T>(), rstd.as<T>(), x.as<T>(), w.as<T>(), b.as<T>());
      });
}

void layernorm_backward(const NormParams& p, const Tensor& d_x, const Tensor& d_w, const Tensor& d_b,
                        const Tensor& d_out, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        Context& ctx) {
  constexpr const char* op = "layernorm_backward";
  check_norm(op, p, x, ctx);
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(x, op, "x", dt, NC, ctx);
  expect(d_out, op, "d_out", dt, NC, ctx);
  expect(d_x, op, "d_x", dt, NC, ctx);
  expect(w, op, "w", dt, p.C, ctx);
  expect(d_w, op, "d_w", dt, p.C, ctx);
  expect(d_b, op, "d_b", dt, p.C, ctx, /*optional=*/true);
  expect(mean, op, "mean", st, p.N, ctx);
  expect(rstd, op, "rstd", st, p.N, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        layernorm_backward_cuda(p, dt, d_x.data(), d_w.data(), d_b.data(), d_out.data(), x.data(), w.data(),
                                mean.as<float>(), rstd.as<float>(), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        layernorm_backward_ref<T>(p, d_x.as<T>(), d_w.as<T>(), d_b.as<T>(), d_out.as<T>(), x.as<T>(), w.as<T>(),
                                  mean.as<T>(), rstd.as<T>());
      });
}

void rmsnorm_forward(const NormParams& p, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     Context& ctx) {
  constexpr const char* op = "rmsnorm_forward";
  check_norm(op, p, x, ctx);
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(x, op, "x", dt, NC, ctx);
  expect(out, op, "out", dt, NC, ctx);
  expect(w, op, "w", dt, p.C, ctx);
  expect(rstd, op, "rstd", st, p.N, ctx);
  dispatch(
      ctx, dt, op, [&] { rmsnorm_forward_cuda(p, dt, out.data(), rstd.as<float>(), x.data(), w.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        rmsnorm_forward_ref<T>(p, out.as<T>(), rstd.as<T>(), x.as<T>(), w.as<T>());
      });
}

void rmsnorm_backward(const NormParams& p, const Tensor& d_x, const Tensor& d_w, const Tensor& d_out, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, Context& ctx) {
  constexpr const char* op = "rmsnorm_backward";
  check_norm(op, p, x, ctx);
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(x, op, "x", dt, NC, ctx);
  expect(d_out, op, "d_out", dt, NC, ctx);
  expect(d_x, op, "d_x", dt, NC, ctx);
  expect(w, op, "w", dt, p.C, ctx);
  expect(d_w, op, "d_w", dt, p.C, ctx);
  expect(rstd, op, "rstd", st, p.N, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        rmsnorm_backward_cuda(p, dt, d_x.data(), d_w.data(), d_out.data(), x.data(), w.data(), rstd.as<float>(), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        rmsnorm_backward_ref<T>(p, d_x.as<T>(), d_w.as<T>(), d_out.as<T>(), x.as<T>(), w.as<T>(), rstd.as<T>());
      });
}

void norm_residual_forward(const NormParams& p, bool layernorm, const ResidualParams& rp, const Tensor& mid,
                           const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                           const Tensor& y, const Tensor& bias, const Tensor& w, const Tensor& b, Context& ctx) {
  constexpr const char* op = "norm_residual_forward";
  check_norm_residual(op, p, rp, layernorm, residual, mean, b, ctx);
  const DType dt = residual.dtype(), st = stat_dtype(dt);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(residual, op, "residual", dt, NC, ctx);
  expect(y, op, "y", dt, NC, ctx);
  expect(mid, op, "mid", dt, NC, ctx);
  expect(out, op, "out", dt, NC, ctx);
  for (const void* in : {residual.data(), y.data()})
    TS_CHECK(mid.data() != in && out.data() != in, op, ": mid and out must not be residual's or y's memory");
  TS_CHECK(out.data() != mid.data(), op, ": out must not be mid's memory (the backward reads mid)");
  expect(bias, op, "bias", dt, p.C, ctx, /*optional=*/true);
  expect(w, op, "w", dt, p.C, ctx);
  expect(b, op, "b", dt, p.C, ctx, /*optional=*/true);
  if (layernorm) expect(mean, op, "mean", st, p.N, ctx);
  expect(rstd, op, "rstd", st, p.N, ctx);
  if (on_cuda(ctx, [&] {
        norm_residual_forward_cuda(p, dt, rp, mid.data(), out.data(), layernorm ? mean.as<float>() : nullptr,
                                   rstd.as<float>(), residual.data(), y.data(), bias.data(), w.data(), b.data(), ctx);
      }))
    return;
  residual_forward(rp, mid, residual, y, bias, ctx);
  if (layernorm) layernorm_forward(p, out, mean, rstd, mid, w, b, ctx);
  else rmsnorm_forward(p, out, rstd, mid, w, ctx);
}

void norm_residual_backward(const NormParams& p, bool layernorm, const Tensor& d_x, const Tensor& d_w,
                            const Tensor& d_b, const Tensor& d_out, const Tensor& x, const Tensor& w,
                            const Tensor& mean, const Tensor& rstd, const NormResidualBackward& res, Context& ctx) {
  constexpr const char* op = "norm_residual_backward";
  check_norm_residual(op, p, res.p, layernorm, x, mean, d_b, ctx);
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const int64_t NC = static_cast<int64_t>(p.N) * p.C;
  expect(x, op, "x", dt, NC, ctx);
  expect(d_out, op, "d_out", dt, NC, ctx);
  expect(d_x, op, "d_x", dt, NC, ctx);
  expect(res.d_y, op, "d_y", dt, NC, ctx);
  TS_CHECK(res.d_y.data() != d_x.data(), op, ": d_y must not be d_x's memory");
  expect(w, op, "w", dt, p.C, ctx);
  expect(d_w, op, "d_w", dt, p.C, ctx);
  expect(d_b, op, "d_b", dt, p.C, ctx, /*optional=*/true);
  expect(res.d_bias, op, "d_bias", dt, p.C, ctx, /*optional=*/true);
  if (layernorm) expect(mean, op, "mean", st, p.N, ctx);
  expect(rstd, op, "rstd", st, p.N, ctx);
  if (on_cuda(ctx, [&] {
        norm_residual_backward_cuda(p, dt, d_x.data(), d_w.data(), d_b.data(), d_out.data(), x.data(), w.data(),
                                    layernorm ? mean.as<float>() : nullptr, rstd.as<float>(), res.p, res.d_y.data(),
                                    res.d_bias.data(), ctx);
      }))
    return;
  if (layernorm) layernorm_backward(p, d_x, d_w, d_b, d_out, x, w, mean, rstd, ctx);
  else rmsnorm_backward(p, d_x, d_w, d_out, x, w, rstd, ctx);
  residual_backward(res.p, res.d_y, res.d_bias, d_x, ctx);
}

}  // namespace tessera
