// Tensor-level layer-batched K/V projection: checks, the GEMMs (ops/gemm), then the layout step on the CPU
// reference or the CUDA kernel.
#include "tessera/ops/cross_kv/cross_kv.h"

#include "tessera/core/buffer.h"
#include "tessera/ops/dispatch.h"
#include "tessera/ops/gemm/gemm.h"

namespace tessera {

bool cross_kv_supports(const CrossKvParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.Nk < 0 || p.C <= 0 || p.L <= 0 || p.KV <= 0) {
    if (why) *why = "needs Nk >= 0 and C, L, KV > 0";
    return false;
  }
  if (p.slice_stride != 0 && p.slice_stride < int64_t{p.Nk} * p.KV) {
    if (why) *why = "slice_stride " + std::to_string(p.slice_stride) + " is shorter than a slice (Nk KV)";
    return false;
  }
  return true;
}

namespace {
void check_cross_kv(const char* op, const CrossKvParams& p, DType dt, const Context& ctx) {
  std::string why;
  require_supported(cross_kv_supports(p, dt, ctx.device(), &why), op, why);
}
// Elements the 2L slices span.
int64_t kv_numel(const CrossKvParams& p) { return (2 * int64_t{p.L} - 1) * p.stride() + int64_t{p.Nk} * p.KV; }
void expect_kv(const Tensor& t, const char* op, const char* name, DType dt, const CrossKvParams& p,
               const Context& ctx) {
  TS_CHECK(t.defined(), op, ": ", name, " is required");
  TS_CHECK(t.device() == ctx.device() && t.dtype() == dt, op, ": ", name, " must be ", dtype_name(dt), " on ",
           ctx.device().str());
  TS_CHECK(t.numel() >= kv_numel(p), op, ": ", name, " has ", t.numel(), " elements, the slices need ", kv_numel(p));
}
}  // namespace

void cross_kv_forward(const CrossKvParams& p, const Tensor& kv, const Tensor& proj, const Tensor& m, const Tensor& w,
                      const Tensor& bias, Context& ctx) {
  constexpr const char* op = "cross_kv_forward";
  const DType dt = m.dtype();
  check_cross_kv(op, p, dt, ctx);
  const int64_t W = p.width();
  expect(m, op, "m", dt, int64_t{p.Nk} * p.C, ctx);
  expect(w, op, "w", dt, W * p.C, ctx);
  expect(bias, op, "bias", dt, W, ctx, /*optional=*/true);
  expect(proj, op, "proj", dt, p.Nk * W, ctx);
  expect_kv(kv, op, "kv", dt, p, ctx);
  if (p.Nk == 0) return;
  // P = m Wᵀ for every layer's K and V at once: (Nk, C) x (C, 2 L KV).
  gemm({.M = p.Nk, .N = static_cast<int>(W), .K = p.C, .trans_b = true, .allow_tf32 = p.allow_tf32}, proj, m, w,
       Tensor(), ctx);
  dispatch(
      ctx, dt, op, [&] { cross_kv_layout_forward_cuda(p, dt, kv.data(), proj.data(), bias.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        cross_kv_layout_forward_ref<T>(p, kv.as<T>(), proj.as<T>(), bias.as<T>());
      });
}

void cross_kv_backward(const CrossKvParams& p, const Tensor& d_w, const Tensor& d_bias, const Tensor& d_m,
                       const Tensor& d_proj, const Tensor& d_kv, const Tensor& m, const Tensor& w, bool accumulate,
                       Context& ctx) {
  constexpr const char* op = "cross_kv_backward";
  const DType dt = m.dtype();
  check_cross_kv(op, p, dt, ctx);
  const int64_t W = p.width();
  expect(m, op, "m", dt, int64_t{p.Nk} * p.C, ctx);
  expect(d_m, op, "d_m", dt, int64_t{p.Nk} * p.C, ctx);
  expect(w, op, "w", dt, W * p.C, ctx);
  expect(d_w, op, "d_w", dt, W * p.C, ctx);
  expect(d_bias, op, "d_bias", dt, W, ctx, /*optional=*/true);
  expect(d_proj, op, "d_proj", dt, p.Nk * W, ctx);
  expect_kv(d_kv, op, "d_kv", dt, p, ctx);
  if (p.Nk == 0) {
    if (!accumulate) fill_bytes(d_m, 0, ctx);
    return;
  }
  dispatch(
      ctx, dt, op, [&] { cross_kv_layout_backward_cuda(p, dt, d_proj.data(), d_kv.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        cross_kv_layout_backward_ref<T>(p, d_proj.as<T>(), d_kv.as<T>());
      });
  if (d_bias.defined()) bias_grad({.M = p.Nk, .N = static_cast<int>(W)}, d_bias, d_proj, ctx);
  // d_W += dPᵀ m: (2 L KV, Nk) x (Nk, C).
  gemm({.M = static_cast<int>(W), .N = p.C, .K = p.Nk, .trans_a = true, .beta = 1.0f, .allow_tf32 = p.allow_tf32}, d_w,
       d_proj, m, Tensor(), ctx);
  // d_m = dP W: (Nk, 2 L KV) x (2 L KV, C), the sum over every layer's K and V in the one reduction.
  gemm({.M = p.Nk, .N = p.C, .K = static_cast<int>(W), .beta = accumulate ? 1.0f : 0.0f, .allow_tf32 = p.allow_tf32},
       d_m, d_proj, w, Tensor(), ctx);
}

}  // namespace tessera
