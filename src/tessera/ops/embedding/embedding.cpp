// Tensor-level fused embedding: checks, then the reference (CPU) or the CUDA kernels.
#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/dispatch.h"

namespace tessera {

bool embedding_supports(const EmbeddingParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.B < 0 || p.T < 0 || p.C <= 0 || p.V <= 0 || p.pos_offset < 0) {
    if (why) *why = "needs B, T, pos_offset >= 0 and C, V > 0";
    return false;
  }
  if (!(p.dropout >= 0.0f && p.dropout < 1.0f)) {
    if (why) *why = "dropout must be in [0, 1), got " + std::to_string(p.dropout);
    return false;
  }
  if (!device.is_cpu() && (static_cast<int64_t>(p.B) * p.T > 2147483647LL || p.V == 2147483647)) {
    if (why) *why = "the CUDA kernels index B*T rows and V + 1 sort keys in int32";
    return false;
  }
  return true;
}

namespace {
void check_embedding(const char* op, const EmbeddingParams& p, DType dtype, bool has_positions, const Context& ctx) {
  std::string why;
  require_supported(embedding_supports(p, dtype, ctx.device(), &why), op, why);
  TS_CHECK(!has_positions || p.pos_offset + static_cast<int64_t>(p.T) <= p.max_seq, op, ": sequence of ",
           p.pos_offset + static_cast<int64_t>(p.T), " positions exceeds max_seq ", p.max_seq);
}
}  // namespace

void embedding_forward(const EmbeddingParams& p, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, Context& ctx) {
  constexpr const char* op = "embedding_forward";
  const DType dt = wte.dtype();
  check_embedding(op, p, dt, wpe.defined(), ctx);
  const int64_t BT = static_cast<int64_t>(p.B) * p.T;
  expect(tokens, op, "tokens", DType::I32, BT, ctx);
  expect(wte, op, "wte", dt, static_cast<int64_t>(p.V) * p.C, ctx);
  expect(wpe, op, "wpe", dt, static_cast<int64_t>(p.max_seq) * p.C, ctx, /*optional=*/true);
  expect(out, op, "out", dt, BT * p.C, ctx);
  dispatch(
      ctx, dt, op,
      [&] { embedding_forward_cuda(p, dt, out.data(), tokens.as<int32_t>(), wte.data(), wpe.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        embedding_forward_ref<T>(p, out.as<T>(), tokens.as<int32_t>(), wte.as<T>(), wpe.as<T>());
      });
}

void embedding_backward(const EmbeddingParams& p, const Tensor& d_wte, const Tensor& d_wpe, const Tensor& d_out,
                        const Tensor& tokens, Context& ctx) {
  constexpr const char* op = "embedding_backward";
  const DType dt = d_wte.dtype();
  check_embedding(op, p, dt, d_wpe.defined(), ctx);
  const int64_t BT = static_cast<int64_t>(p.B) * p.T;
  expect(tokens, op, "tokens", DType::I32, BT, ctx);
  expect(d_wte, op, "d_wte", dt, static_cast<int64_t>(p.V) * p.C, ctx);
  expect(d_wpe, op, "d_wpe", dt, static_cast<int64_t>(p.max_seq) * p.C, ctx, /*optional=*/true);
  expect(d_out, op, "d_out", dt, BT * p.C, ctx);
  dispatch(
      ctx, dt, op,
      [&] { embedding_backward_cuda(p, dt, d_wte.data(), d_wpe.data(), d_out.data(), tokens.as<int32_t>(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        embedding_backward_ref<T>(p, d_wte.as<T>(), d_wpe.as<T>(), d_out.as<T>(), tokens.as<int32_t>());
      });
}

}  // namespace tessera
