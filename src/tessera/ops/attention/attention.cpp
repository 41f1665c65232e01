// Tensor-level attention and RoPE: checks, then the reference (CPU) or the CUDA kernels.
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/dispatch.h"

#include <cmath>

namespace tessera {

bool attention_supports(const AttentionParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.B < 0 || p.T < 0 || p.H <= 0 || p.Dh <= 0) {
    if (why) *why = "needs B >= 0, T >= 0, H > 0 and Dh > 0";
    return false;
  }
  if (!(p.dropout >= 0.0f && p.dropout < 1.0f)) {
    if (why) *why = "attention dropout must be in [0, 1), got " + std::to_string(p.dropout);
    return false;
  }
  if (!(p.rope_theta >= 0.0f && std::isfinite(p.rope_theta)) || p.rope_pos_offset < 0) {
    if (why) *why = "needs rope_theta >= 0 and finite (0: no RoPE) and rope_pos_offset >= 0";
    return false;
  }
  if (p.rope_theta > 0.0f && !device.is_cpu() && int64_t{p.rope_pos_offset} + p.T > kRopeMaxPositions) {
    if (why) *why = "RoPE on the GPU takes positions up to " + std::to_string(kRopeMaxPositions);
    return false;
  }
  if (!device.is_cpu() && p.Dh > kAttentionMaxDh) {
    if (why) {
      *why = "the CUDA kernels take head dims Dh up to " + std::to_string(kAttentionMaxDh) + ", got " +
             std::to_string(p.Dh);
    }
    return false;
  }
  return true;
}

bool rope_supports(const RopeParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.B < 0 || p.T < 0 || p.H <= 0 || p.Dh <= 0) {
    if (why) *why = "needs B >= 0, T >= 0, H > 0 and Dh > 0";
    return false;
  }
  if (!device.is_cpu() && int64_t{p.pos_offset} + p.T > kRopeMaxPositions) {
    if (why) *why = "RoPE on the GPU takes positions up to " + std::to_string(kRopeMaxPositions);
    return false;
  }
  return true;
}

namespace {
int64_t rows(int B, int T) { return static_cast<int64_t>(B) * T; }
}  // namespace

RopeParams attention_rope(const AttentionParams& p) {
  return {.B = p.B, .T = p.T, .H = p.H, .Dh = p.Dh, .theta = p.rope_theta, .pos_offset = p.rope_pos_offset};
}

void attention_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       Context& ctx) {
  constexpr const char* op = "attention_forward";
  std::string why;
  require_supported(attention_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  const DType dt = qkv.dtype(), st = stat_dtype(dt);
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh, N = rows(p.B, p.T);
  expect(qkv, op, "qkv", dt, N * 3 * C, ctx);
  expect(out, op, "out", dt, N * C, ctx);
  expect(lse, op, "lse", st, N * p.H, ctx);
  // RoPE on the way in: q and k rotated in place, then attention over them without it.
  AttentionParams plain = p;
  if (p.rope_theta > 0.0f) rope_forward(attention_rope(p), qkv, ctx);
  plain.rope_theta = 0.0f;
#ifdef TESSERA_WITH_CUDA
  if (ctx.is_cuda()) {
    attention_forward_cuda(plain, dt, out.data(), lse.as<float>(), qkv.data(), ctx);
    return;
  }
#endif
  dispatch_ref(dt, op, [&](auto t) {
    using T = decltype(t);
    attention_forward_ref<T>(plain, out.as<T>(), lse.as<T>(), qkv.as<T>());
  });
}

void attention_backward(const AttentionParams& p, const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, Context& ctx) {
  constexpr const char* op = "attention_backward";
  std::string why;
  require_supported(attention_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  const DType dt = qkv.dtype(), st = stat_dtype(dt);
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh, N = rows(p.B, p.T);
  expect(qkv, op, "qkv", dt, N * 3 * C, ctx);
  expect(d_qkv, op, "d_qkv", dt, N * 3 * C, ctx);
  expect(out, op, "out", dt, N * C, ctx);
  expect(d_out, op, "d_out", dt, N * C, ctx);
  expect(lse, op, "lse", st, N * p.H, ctx);
#ifdef TESSERA_WITH_CUDA
  if (ctx.is_cuda()) {
    attention_backward_cuda(p, dt, d_qkv.data(), d_out.data(), qkv.data(), out.data(), lse.as<float>(), ctx);
    return;
  }
#endif
  AttentionParams plain = p;
  plain.rope_theta = 0.0f;
  dispatch_ref(dt, op, [&](auto t) {
    using T = decltype(t);
    attention_backward_ref<T>(plain, d_qkv.as<T>(), d_out.as<T>(), qkv.as<T>(), out.as<T>(), lse.as<T>());
    if (p.rope_theta > 0.0f) rope_backward_ref<T>(attention_rope(p), d_qkv.as<T>());
  });
}

void rope_forward(const RopeParams& p, const Tensor& qkv, Context& ctx) {
  constexpr const char* op = "rope_forward";
  std::string why;
  require_supported(rope_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  expect(qkv, op, "qkv", qkv.dtype(), rows(p.B, p.T) * 3 * p.H * p.Dh, ctx);
#ifdef TESSERA_WITH_CUDA
  if (ctx.is_cuda()) {
    rope_forward_cuda(p, qkv.dtype(), qkv.data(), ctx);
    return;
  }
#endif
  dispatch_ref(qkv.dtype(), op, [&](auto t) {
    using T = decltype(t);
    rope_forward_ref<T>(p, qkv.as<T>());
  });
}

void rope_backward(const RopeParams& p, const Tensor& d_qkv, Context& ctx) {
  constexpr const char* op = "rope_backward";
  std::string why;
  require_supported(rope_supports(p, d_qkv.dtype(), ctx.device(), &why), op, why);
  expect(d_qkv, op, "d_qkv", d_qkv.dtype(), rows(p.B, p.T) * 3 * p.H * p.Dh, ctx);
#ifdef TESSERA_WITH_CUDA
  if (ctx.is_cuda()) {
    rope_backward_cuda(p, d_qkv.dtype(), d_qkv.data(), ctx);
    return;
  }
#endif
  dispatch_ref(d_qkv.dtype(), op, [&](auto t) {
    using T = decltype(t);
    rope_backward_ref<T>(p, d_qkv.as<T>());
  });
}

}  // namespace tessera
