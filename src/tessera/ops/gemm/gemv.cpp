// The few-row product (gemv.h): the reference, and the Tensor-level entry's checks and routing.
#include "tessera/ops/gemm/gemv.h"

#include <cstdint>

#include "tessera/ops/dispatch.h"
#include "tessera/ops/gemm/gemm.h"

namespace tessera {

template <typename T>
void gemv_ref(const GemvParams& p, T* c, const T* a, const T* w, const T* bias) {
  gemm_ref<T>({.M = p.M, .N = p.N, .K = p.K, .trans_b = true, .ldc = p.ld_c()}, c, a, w, bias);
  if (!p.act) return;
  // In place, one row at a time (c's rows are ldc apart); the bias is already in.
  for (int m = 0; m < p.M; ++m) {
    T* row = c + static_cast<int64_t>(m) * p.ld_c();
    activation_forward_ref<T>({.N = 1, .d_ff = p.N, .kind = *p.act}, row, row, nullptr);
  }
}
template void gemv_ref<float>(const GemvParams&, float*, const float*, const float*, const float*);
template void gemv_ref<double>(const GemvParams&, double*, const double*, const double*, const double*);

bool gemv_supports(const GemvParams& p, DType dtype, Device device, const void* a, const void* w, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.M < 0 || p.N < 0 || p.K < 0) return no("needs M, N, K >= 0");
  if (p.ldc != 0 && p.ldc < p.N) return no("ldc is below N");
  if (p.act && *p.act == Activation::Swiglu) return no("Swiglu has a gate; it is not an epilogue");
  if (device.is_cpu()) return true;
  if (dtype != DType::BF16 && dtype != DType::F16) return no("the CUDA kernel computes in bf16 or f16");
  if (p.M < 1 || p.M > kGemvMaxRows)
    return no("the CUDA kernel takes 1 to " + std::to_string(kGemvMaxRows) + " rows, got " + std::to_string(p.M));
  if (p.K % 8 != 0) return no("the CUDA kernel needs K a multiple of 8, got " + std::to_string(p.K));
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
  if (!aligned(a) || !aligned(w)) return no("the CUDA kernel needs a and w 16-byte aligned");
  return true;
}

void gemv(const GemvParams& p, const Tensor& c, const Tensor& a, const Tensor& w, const Tensor& bias, Context& ctx) {
  constexpr const char* op = "gemv";
  const DType dt = a.dtype();
  std::string why;
  require_supported(gemv_supports(p, dt, ctx.device(), a.data(), w.data(), &why), op, why);
  expect(a, op, "a", dt, static_cast<int64_t>(p.M) * p.K, ctx);
  expect(w, op, "w", dt, static_cast<int64_t>(p.N) * p.K, ctx);
  expect(c, op, "c", dt, p.M == 0 ? 0 : (p.M - 1) * p.ld_c() + p.N, ctx);
  expect(bias, op, "bias", dt, p.N, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op, [&] { gemv_cuda(p, dt, c.data(), a.data(), w.data(), bias.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        gemv_ref<T>(p, c.as<T>(), a.as<T>(), w.as<T>(), bias.as<T>());
      });
}

}  // namespace tessera
