// Tensor-level attention and RoPE: checks, then the reference (CPU) or the CUDA kernels.
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/dispatch.h"

#include <algorithm>
#include <cmath>

namespace tessera {

bool attention_supports(const AttentionParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.B < 0 || p.T < 0 || p.H <= 0 || p.Dh <= 0) {
    if (why) *why = "needs B >= 0, T >= 0, H > 0 and Dh > 0";
    return false;
  }
  const int Hkv = attention_kv_heads(p);
  if (p.n_kv_heads < 0 || p.H % Hkv != 0) {
    if (why) *why = "n_kv_heads must divide n_heads " + std::to_string(p.H) + ", got " + std::to_string(p.n_kv_heads);
    return false;
  }
  if (p.Tq < 0 || p.Tk < 0 || p.q_offset < 0) {
    if (why) *why = "needs Tq >= 0, Tk >= 0 and q_offset >= 0";
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
  const int64_t rope_end = int64_t{p.rope_pos_offset} +
                           std::max<int64_t>(int64_t{p.q_offset} + attention_tq(p), attention_tk(p));
  if (p.rope_theta > 0.0f && !device.is_cpu() && rope_end > kRopeMaxPositions) {
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
  if (p.n_kv_heads < 0 || (p.n_kv_heads > 0 && p.H % p.n_kv_heads != 0)) {
    if (why) *why = "n_kv_heads must divide H " + std::to_string(p.H) + ", got " + std::to_string(p.n_kv_heads);
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

RopeParams rope_of(const AttentionParams& p, int T, int pos_offset) {
  return {.B = p.B, .T = T, .H = p.H, .Dh = p.Dh, .theta = p.rope_theta, .pos_offset = pos_offset};
}

// key_lens: absent, or (B) int32 on ctx's device; on the CPU each in [0, Tk].
void expect_key_lens(const AttentionParams& p, const char* op, const Context& ctx) {
  expect(p.key_lens, op, "key_lens", DType::I32, p.B, ctx, /*optional=*/true);
  if (!p.key_lens.defined() || !ctx.device().is_cpu()) return;
  const int32_t* len = p.key_lens.as<int32_t>();
  for (int b = 0; b < p.B; ++b) {
    TS_CHECK(len[b] >= 0 && len[b] <= attention_tk(p), op, ": key_lens[", b, "] = ", len[b], " is outside [0, ",
             attention_tk(p), "]");
  }
}

// The packed call: one length T, qkv rows of width (H + 2 Hkv) Dh.
void expect_packed(const AttentionParams& p, const char* op) {
  TS_CHECK(attention_tq(p) == p.T && attention_tk(p) == p.T, op, ": the packed qkv call has Tq = Tk = T = ", p.T,
           ", got Tq ", p.Tq, " and Tk ", p.Tk, " (the general call takes separate q, k, v)");
}

// A 4-D (B, T, heads, Dh) view argument of the general call, its last dim contiguous.
void expect_view(const Tensor& t, const char* op, const char* name, DType dtype, int T, int heads,
                 const AttentionParams& p, const Context& ctx) {
  TS_CHECK(t.defined(), op, ": ", name, " is required");
  TS_CHECK(t.device() == ctx.device(), op, ": ", name, " is on ", t.device().str(), " but the context is ",
           ctx.device().str());
  TS_CHECK(t.dtype() == dtype, op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dtype));
  TS_CHECK(t.ndim() == 4 && t.size(0) == p.B && t.size(1) == T && t.size(2) == heads && t.size(3) == p.Dh, op, ": ",
           name, " is ", t.shape_str(), ", expected (", p.B, ", ", T, ", ", heads, ", ", p.Dh, ")");
  TS_CHECK(t.stride(3) == 1 && t.stride(0) >= 0 && t.stride(1) >= 0 && t.stride(2) >= 0, op, ": ", name,
           " needs stride 1 over the head dim and strides >= 0");
}

template <typename T, typename P>
AttentionView<T> view_of(const Tensor& t) {
  return {static_cast<P>(t.data()), t.stride(0), t.stride(1), t.stride(2)};
}
}  // namespace

RopeParams attention_rope(const AttentionParams& p) {
  return {.B = p.B,
          .T = p.T,
          .H = p.H,
          .Dh = p.Dh,
          .theta = p.rope_theta,
          .pos_offset = p.rope_pos_offset,
          .n_kv_heads = p.n_kv_heads};
}

void attention_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       Context& ctx) {
  constexpr const char* op = "attention_forward";
  std::string why;
  require_supported(attention_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  expect_packed(p, op);
  const DType dt = qkv.dtype(), st = stat_dtype(dt);
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh, N = rows(p.B, p.T);
  expect(qkv, op, "qkv", dt, N * attention_qkv_width(p), ctx);
  expect(out, op, "out", dt, N * C, ctx);
  expect(lse, op, "lse", st, N * p.H, ctx);
  expect_key_lens(p, op, ctx);
  // RoPE on the way in: q and k rotated in place, then attention over them without it.
  AttentionParams plain = p;
  if (p.rope_theta > 0.0f) rope_forward(attention_rope(p), qkv, ctx);
  plain.rope_theta = 0.0f;
  dispatch(
      ctx, dt, op, [&] { attention_forward_cuda(plain, dt, out.data(), lse.as<float>(), qkv.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        attention_forward_ref<T>(plain, out.as<T>(), lse.as<T>(), qkv.as<T>());
      });
}

void attention_backward(const AttentionParams& p, const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, Context& ctx) {
  constexpr const char* op = "attention_backward";
  std::string why;
  require_supported(attention_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  expect_packed(p, op);
  const DType dt = qkv.dtype(), st = stat_dtype(dt);
  const int64_t C = static_cast<int64_t>(p.H) * p.Dh, N = rows(p.B, p.T), W = attention_qkv_width(p);
  expect(qkv, op, "qkv", dt, N * W, ctx);
  expect(d_qkv, op, "d_qkv", dt, N * W, ctx);
  expect(out, op, "out", dt, N * C, ctx);
  expect(d_out, op, "d_out", dt, N * C, ctx);
  expect(lse, op, "lse", st, N * p.H, ctx);
  expect_key_lens(p, op, ctx);
  // The CUDA launcher takes p with its RoPE and rotates d_qkv back itself; the reference attends without it.
  AttentionParams plain = p;
  plain.rope_theta = 0.0f;
  dispatch(
      ctx, dt, op,
      [&] { attention_backward_cuda(p, dt, d_qkv.data(), d_out.data(), qkv.data(), out.data(), lse.as<float>(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        attention_backward_ref<T>(plain, d_qkv.as<T>(), d_out.as<T>(), qkv.as<T>(), out.as<T>(), lse.as<T>());
        if (p.rope_theta > 0.0f) rope_backward_ref<T>(attention_rope(p), d_qkv.as<T>());
      });
}

// The general call. RoPE (rope_theta > 0) rotates q at positions rope_pos_offset + q_offset + i and k at
// rope_pos_offset + j, in place, before attending; the backward rotates dq and dk back.
void attention_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, Context& ctx) {
  constexpr const char* op = "attention_forward";
  std::string why;
  require_supported(attention_supports(p, q.dtype(), ctx.device(), &why), op, why);
  const DType dt = q.dtype();
  const int Tq = attention_tq(p), Tk = attention_tk(p), Hkv = attention_kv_heads(p);
  expect_view(q, op, "q", dt, Tq, p.H, p, ctx);
  expect_view(k, op, "k", dt, Tk, Hkv, p, ctx);
  expect_view(v, op, "v", dt, Tk, Hkv, p, ctx);
  expect_view(out, op, "out", dt, Tq, p.H, p, ctx);
  expect(lse, op, "lse", stat_dtype(dt), rows(p.B, Tq) * p.H, ctx);
  expect_key_lens(p, op, ctx);
  AttentionParams plain = p;
  plain.rope_theta = 0.0f;
  dispatch(
      ctx, dt, op,
      [&] {
        if (p.rope_theta > 0.0f) {
          rope_view_cuda(rope_of(p, Tq, p.rope_pos_offset + p.q_offset), p.H, dt, view_of<void, void*>(q), 1.0f, ctx);
          rope_view_cuda(rope_of(p, Tk, p.rope_pos_offset), Hkv, dt, view_of<void, void*>(k), 1.0f, ctx);
        }
        attention_forward_general_cuda(plain, dt, view_of<void, void*>(out), lse.as<float>(),
                                       view_of<const void, const void*>(q), view_of<const void, const void*>(k),
                                       view_of<const void, const void*>(v), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        if (p.rope_theta > 0.0f) {
          rope_rotate_view_ref<T>(rope_of(p, Tq, p.rope_pos_offset + p.q_offset), p.H, view_of<T, T*>(q), 1.0);
          rope_rotate_view_ref<T>(rope_of(p, Tk, p.rope_pos_offset), Hkv, view_of<T, T*>(k), 1.0);
        }
        attention_forward_ref<T>(plain, view_of<T, T*>(out), lse.as<T>(), view_of<const T, const T*>(q),
                                 view_of<const T, const T*>(k), view_of<const T, const T*>(v));
      });
}

void attention_backward(const AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Tensor& d_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, Context& ctx) {
  constexpr const char* op = "attention_backward";
  std::string why;
  require_supported(attention_supports(p, q.dtype(), ctx.device(), &why), op, why);
  const DType dt = q.dtype();
  const int Tq = attention_tq(p), Tk = attention_tk(p), Hkv = attention_kv_heads(p);
  expect_view(q, op, "q", dt, Tq, p.H, p, ctx);
  expect_view(k, op, "k", dt, Tk, Hkv, p, ctx);
  expect_view(v, op, "v", dt, Tk, Hkv, p, ctx);
  expect_view(out, op, "out", dt, Tq, p.H, p, ctx);
  expect_view(d_out, op, "d_out", dt, Tq, p.H, p, ctx);
  expect_view(dq, op, "dq", dt, Tq, p.H, p, ctx);
  expect_view(dk, op, "dk", dt, Tk, Hkv, p, ctx);
  expect_view(dv, op, "dv", dt, Tk, Hkv, p, ctx);
  expect(lse, op, "lse", stat_dtype(dt), rows(p.B, Tq) * p.H, ctx);
  expect_key_lens(p, op, ctx);
  AttentionParams plain = p;
  plain.rope_theta = 0.0f;
  dispatch(
      ctx, dt, op,
      [&] {
        attention_backward_general_cuda(plain, dt, view_of<void, void*>(dq), view_of<void, void*>(dk),
                                        view_of<void, void*>(dv), view_of<const void, const void*>(d_out),
                                        view_of<const void, const void*>(q), view_of<const void, const void*>(k),
                                        view_of<const void, const void*>(v), view_of<const void, const void*>(out),
                                        lse.as<float>(), ctx);
        if (p.rope_theta > 0.0f) {
          rope_view_cuda(rope_of(p, Tq, p.rope_pos_offset + p.q_offset), p.H, dt, view_of<void, void*>(dq), -1.0f, ctx);
          rope_view_cuda(rope_of(p, Tk, p.rope_pos_offset), Hkv, dt, view_of<void, void*>(dk), -1.0f, ctx);
        }
      },
      [&](auto t) {
        using T = decltype(t);
        attention_backward_ref<T>(plain, view_of<T, T*>(dq), view_of<T, T*>(dk), view_of<T, T*>(dv),
                                  view_of<const T, const T*>(d_out), view_of<const T, const T*>(q),
                                  view_of<const T, const T*>(k), view_of<const T, const T*>(v),
                                  view_of<const T, const T*>(out), lse.as<T>());
        if (p.rope_theta > 0.0f) {
          rope_rotate_view_ref<T>(rope_of(p, Tq, p.rope_pos_offset + p.q_offset), p.H, view_of<T, T*>(dq), -1.0);
          rope_rotate_view_ref<T>(rope_of(p, Tk, p.rope_pos_offset), Hkv, view_of<T, T*>(dk), -1.0);
        }
      });
}

void rope_forward(const RopeParams& p, const Tensor& qkv, Context& ctx) {
  constexpr const char* op = "rope_forward";
  std::string why;
  require_supported(rope_supports(p, qkv.dtype(), ctx.device(), &why), op, why);
  const int64_t W = (static_cast<int64_t>(p.H) + 2 * (p.n_kv_heads > 0 ? p.n_kv_heads : p.H)) * p.Dh;
  expect(qkv, op, "qkv", qkv.dtype(), rows(p.B, p.T) * W, ctx);
  dispatch(
      ctx, qkv.dtype(), op, [&] { rope_forward_cuda(p, qkv.dtype(), qkv.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        rope_forward_ref<T>(p, qkv.as<T>());
      });
}

void rope_backward(const RopeParams& p, const Tensor& d_qkv, Context& ctx) {
  constexpr const char* op = "rope_backward";
  std::string why;
  require_supported(rope_supports(p, d_qkv.dtype(), ctx.device(), &why), op, why);
  const int64_t W = (static_cast<int64_t>(p.H) + 2 * (p.n_kv_heads > 0 ? p.n_kv_heads : p.H)) * p.Dh;
  expect(d_qkv, op, "d_qkv", d_qkv.dtype(), rows(p.B, p.T) * W, ctx);
  dispatch(
      ctx, d_qkv.dtype(), op, [&] { rope_backward_cuda(p, d_qkv.dtype(), d_qkv.data(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        rope_backward_ref<T>(p, d_qkv.as<T>());
      });
}

}  // namespace tessera
