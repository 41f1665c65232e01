// The decode step's products (decode_linear.h): gemv or the GEMM, by device, rows and what gemv takes.
#include "tessera/infer/decode_linear.h"

#include "tessera/core/error.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/gemm/gemm.h"

namespace tessera {

bool decode_linear_uses_gemv(const GemvParams& p, const Tensor& a, const Tensor& w, const Context& ctx) {
  return ctx.is_cuda() && p.M >= 1 && p.M <= kDecodeGemvRows &&
         gemv_supports(p, a.dtype(), ctx.device(), a.data(), w.data());
}

void decode_linear(const GemvParams& p, const Tensor& c, const Tensor& a, const Tensor& w, const Tensor& bias,
                   Context& ctx) {
  TS_CHECK(!p.act, "internal: decode_linear takes no activation (decode_linear_act does)");
  if (decode_linear_uses_gemv(p, a, w, ctx)) {
    gemv(p, c, a, w, bias, ctx);
    return;
  }
  gemm({.M = p.M, .N = p.N, .K = p.K, .trans_b = true, .allow_tf32 = a.dtype() != DType::F32, .ldc = p.ldc}, c, a, w,
       bias, ctx);
}

void decode_linear_act(const GemvParams& p, const Tensor& c, const Tensor& pre, const Tensor& a, const Tensor& w,
                       const Tensor& bias, Context& ctx) {
  TS_CHECK(p.act && *p.act != Activation::Swiglu, "internal: decode_linear_act takes an activation other than Swiglu");
  TS_CHECK(p.ld_c() == p.N, "internal: decode_linear_act writes c packed");
  if (decode_linear_uses_gemv(p, a, w, ctx)) {
    gemv(p, c, a, w, bias, ctx);
    return;
  }
  gemm({.M = p.M, .N = p.N, .K = p.K, .trans_b = true, .allow_tf32 = a.dtype() != DType::F32}, pre, a, w, Tensor(),
       ctx);
  activation_forward({.N = p.M, .d_ff = p.N, .kind = *p.act}, c, pre, bias, ctx);
}

}  // namespace tessera
