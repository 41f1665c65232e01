// Tensor-level GEMM and bias gradient: checks, then the reference (CPU) or cuBLASLt (CUDA).
#include "tessera/ops/gemm/gemm.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/dispatch.h"

namespace tessera {

bool gemm_supports(const GemmParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.M < 0 || p.N < 0 || p.K < 0) {
    if (why) *why = "needs M, N, K >= 0";
    return false;
  }
  if (p.batch < 1) {
    if (why) *why = "needs batch >= 1, got " + std::to_string(p.batch);
    return false;
  }
  if (p.batch > 1 && (p.stride_a < 0 || p.stride_b < 0 || p.stride_c < 0)) {
    if (why) *why = "needs non-negative batch strides";
    return false;
  }
  if (p.lda < 0 || p.ldb < 0 || p.ldc < 0 || (p.lda && p.lda < p.a_cols()) || (p.ldb && p.ldb < p.b_cols()) ||
      (p.ldc && p.ldc < p.N)) {
    if (why) *why = "a row stride (lda, ldb, ldc) is below its matrix's row length";
    return false;
  }
  if (p.batch > 1 && p.stride_c < (p.M - 1) * p.ld_c() + p.N) {
    if (why) *why = "batched outputs overlap: stride_c " + std::to_string(p.stride_c) + " < (M-1)*ldc + N";
    return false;
  }
  // The K == 0 / bias fallback kernel puts the batch on gridDim.y.
  if (!device.is_cpu() && p.batch > 65535) {
    if (why) *why = "the CUDA path takes batch up to 65535, got " + std::to_string(p.batch);
    return false;
  }
  return true;
}

namespace {

// A matrix argument of `rows` rows of `cols` elements, `ld` apart: with batch 1 and packed rows the exact
// contract of expect(); otherwise contiguous memory covering every row of every product.
void expect_matrix(const Tensor& t, const char* op, const char* name, DType dt, int64_t rows, int64_t cols, int64_t ld,
                   int batch, int64_t stride, const Context& ctx) {
  const int64_t size = rows == 0 ? 0 : (rows - 1) * ld + cols;
  if (batch == 1 && ld == cols) {
    expect(t, op, name, dt, size, ctx);
    return;
  }
  expect(t, op, name, dt, t.numel(), ctx);
  if (batch == 1) stride = 0;
  const int64_t extent = (batch - 1) * stride + size;
  TS_CHECK(t.numel() >= extent, op, ": ", name, " has ", t.numel(), " elements ", t.shape_str(), ", but ", batch,
           " product(s) of ", rows, " rows ", ld, " elements apart, ", stride, " apart, need ", extent);
}

}  // namespace

void gemm(const GemmParams& p, const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, Context& ctx) {
  constexpr const char* op = "gemm";
  const DType dt = a.defined() ? a.dtype() : c.dtype();
  std::string why;
  require_supported(gemm_supports(p, dt, ctx.device(), &why), op, why);
  expect_matrix(a, op, "a", dt, p.a_rows(), p.a_cols(), p.ld_a(), p.batch, p.stride_a, ctx);
  expect_matrix(b, op, "b", dt, p.b_rows(), p.b_cols(), p.ld_b(), p.batch, p.stride_b, ctx);
  expect_matrix(c, op, "c", dt, p.M, p.N, p.ld_c(), p.batch, p.stride_c, ctx);
  expect(bias, op, "bias", dt, p.N, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op, [&] { gemm_cuda(p, dt, c.data(), a.data(), b.data(), bias.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        for (int i = 0; i < p.batch; ++i)
          gemm_ref<T>(p, c.as<T>() + i * p.stride_c, a.as<T>() + i * p.stride_a, b.as<T>() + i * p.stride_b,
                      bias.as<T>());
      });
}

namespace {

// The fused GELU GEMMs take the plain case only: alpha 1, beta 0, one product, packed rows.
void check_gemm_gelu(const char* op, const GemmParams& p, DType dt, const Context& ctx) {
  std::string why;
  require_supported(gemm_supports(p, dt, ctx.device(), &why), op, why);
  TS_CHECK(p.alpha == 1.0f && p.beta == 0.0f && p.batch == 1 && p.ld_a() == p.a_cols() && p.ld_b() == p.b_cols() &&
               p.ld_c() == p.N,
           op, ": takes alpha 1, beta 0, batch 1 and packed rows only");
}

}  // namespace

void gemm_gelu_forward(const GemmParams& p, const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b,
                       const Tensor& bias, Context& ctx) {
  constexpr const char* op = "gemm_gelu_forward";
  const DType dt = a.dtype();
  check_gemm_gelu(op, p, dt, ctx);
  const int64_t MN = static_cast<int64_t>(p.M) * p.N;
  expect(a, op, "a", dt, p.a_rows() * p.a_cols(), ctx);
  expect(b, op, "b", dt, p.b_rows() * p.b_cols(), ctx);
  expect(out, op, "out", dt, MN, ctx);
  expect(pre, op, "pre", dt, MN, ctx);
  expect(bias, op, "bias", dt, p.N, ctx);
  // Where cuBLASLt has no fused algorithm (false), the GEMM and the GELU run apart, each routed on its own.
  if (on_cuda(ctx, [&] {
        return gemm_gelu_forward_cuda(p, dt, out.data(), pre.data(), a.data(), b.data(), bias.data(), ctx);
      }))
    return;
  gemm(p, pre, a, b, bias, ctx);
  activation_forward({.N = p.M, .d_ff = p.N, .kind = Activation::Gelu}, out, pre, Tensor(), ctx);
}

void bias_grad(const BiasGradParams& p, const Tensor& d_bias, const Tensor& d_c, Context& ctx) {
  constexpr const char* op = "bias_grad";
  const DType dt = d_c.dtype();
  std::string why;
  require_supported(supports_dtype(dt, ctx.device(), &why), op, why);
  TS_CHECK(p.M >= 0 && p.N >= 0, op, ": needs M, N >= 0");
  expect(d_c, op, "d_c", dt, static_cast<int64_t>(p.M) * p.N, ctx);
  expect(d_bias, op, "d_bias", dt, p.N, ctx);
  dispatch(
      ctx, dt, op, [&] { bias_grad_cuda(p, dt, d_bias.data(), d_c.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        bias_grad_ref<T>(p.M, p.N, d_bias.as<T>(), d_c.as<T>());
      });
}

}  // namespace tessera
