// Tensor-level kv_append and attention_decode: checks, then the reference (CPU) or the CUDA launchers.
#include "tessera/ops/attention/attention_decode.h"

#include <cmath>
#include <initializer_list>

#include "tessera/ops/dispatch.h"

namespace tessera {

bool attention_decode_supports(const DecodeAttentionParams& p, DType dtype, Device device, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.B < 0 || p.H <= 0 || p.Hkv <= 0 || p.Dh <= 0) return fail("needs B >= 0, H > 0, Hkv > 0 and Dh > 0");
  if (p.Tq < 1) return fail("needs Tq >= 1 new tokens per sequence, got " + std::to_string(p.Tq));
  if (p.H % p.Hkv != 0) {
    return fail("the KV heads Hkv " + std::to_string(p.Hkv) + " must divide the query heads H " + std::to_string(p.H));
  }
  if (p.S < p.B) {
    return fail("needs cache slots S >= B, got S " + std::to_string(p.S) + " for B " + std::to_string(p.B));
  }
  if (p.max_seq < 1) return fail("needs max_seq >= 1, got " + std::to_string(p.max_seq));
  if (p.splits < 0) return fail("needs splits >= 0 (0: chosen by the launcher), got " + std::to_string(p.splits));
  if (!(p.rope_theta >= 0.0f && std::isfinite(p.rope_theta))) {
    return fail("needs rope_theta >= 0 and finite (0: no RoPE)");
  }
  if (p.rope_theta > 0.0f && p.Dh % 2 != 0) {
    return fail("RoPE rotates pairs of the head dim, so Dh must be even, got " + std::to_string(p.Dh));
  }
  if (!device.is_cpu()) {
    if (p.Dh > kAttentionMaxDh) {
      return fail("the CUDA kernels take head dims Dh up to " + std::to_string(kAttentionMaxDh) + ", got " +
                  std::to_string(p.Dh));
    }
    if (p.rope_theta > 0.0f && p.max_seq > kRopeMaxPositions) {
      return fail("RoPE on the GPU takes positions up to " + std::to_string(kRopeMaxPositions));
    }
  }
  return true;
}

namespace {
// A (B, Tq, heads, Dh) view argument, its last dim contiguous.
void expect_view(const Tensor& t, const char* op, const char* name, DType dtype, int heads,
                 const DecodeAttentionParams& p, const Context& ctx) {
  TS_CHECK(t.defined(), op, ": ", name, " is required");
  TS_CHECK(t.device() == ctx.device(), op, ": ", name, " is on ", t.device().str(), " but the context is ",
           ctx.device().str());
  TS_CHECK(t.dtype() == dtype, op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dtype));
  TS_CHECK(t.ndim() == 4 && t.size(0) == p.B && t.size(1) == p.Tq && t.size(2) == heads && t.size(3) == p.Dh, op, ": ",
           name, " is ", t.shape_str(), ", expected (", p.B, ", ", p.Tq, ", ", heads, ", ", p.Dh, ")");
  TS_CHECK(t.stride(3) == 1 && t.stride(0) >= 0 && t.stride(1) >= 0 && t.stride(2) >= 0, op, ": ", name,
           " needs stride 1 over the head dim and strides >= 0");
}

// The cache (S, Hkv, max_seq, Dh) contiguous in `dtype`; pos (B) int32; slots absent or (B, max_seq) int32.
void expect_cache_and_tables(const DecodeAttentionParams& p, const KvCacheView& cache, DType dtype, const Tensor& pos,
                             const Tensor& slots, const char* op, const Context& ctx) {
  const int64_t numel = static_cast<int64_t>(p.S) * p.Hkv * p.max_seq * p.Dh;
  expect(cache.k, op, "cache.k", dtype, numel, ctx);
  expect(cache.v, op, "cache.v", dtype, numel, ctx);
  expect(pos, op, "pos", DType::I32, p.B, ctx);
  expect(slots, op, "slots", DType::I32, static_cast<int64_t>(p.B) * p.max_seq, ctx, /*optional=*/true);
}

// A view argument of an entry: the tensor, its name in messages, and its head count (H or Hkv).
struct ViewArg {
  const Tensor& t;
  const char* name;
  int heads;
};

// The checks both entries make, in order: q given, p supported in q's dtype on ctx's device, each of `views`
// (q first) a (B, Tq, heads, Dh) view in that dtype, then the cache and the tables. Returns q's dtype.
DType expect_args(const DecodeAttentionParams& p, std::initializer_list<ViewArg> views, const KvCacheView& cache,
                  const Tensor& pos, const Tensor& slots, const char* op, const Context& ctx) {
  const Tensor& q = views.begin()->t;
  TS_CHECK(q.defined(), op, ": q is required");
  const DType dt = q.dtype();
  std::string why;
  require_supported(attention_decode_supports(p, dt, ctx.device(), &why), op, why);
  for (const ViewArg& v : views) expect_view(v.t, op, v.name, dt, v.heads, p, ctx);
  expect_cache_and_tables(p, cache, dt, pos, slots, op, ctx);
  return dt;
}

template <typename T, typename P>
AttentionView<T> view_of(const Tensor& t) {
  return {static_cast<P>(t.data()), t.stride(0), t.stride(1), t.stride(2)};
}

const int32_t* slots_of(const Tensor& slots) { return slots.defined() ? slots.as<int32_t>() : nullptr; }
}  // namespace

void kv_append(const DecodeAttentionParams& p, const KvCacheView& cache, const Tensor& q, const Tensor& k_new,
               const Tensor& v_new, const Tensor& pos, const Tensor& slots, Context& ctx) {
  constexpr const char* op = "kv_append";
  const DType dt =
      expect_args(p, {{q, "q", p.H}, {k_new, "k_new", p.Hkv}, {v_new, "v_new", p.Hkv}}, cache, pos, slots, op, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        kv_append_cuda(p, dt, cache.k.data(), cache.v.data(), view_of<void, void*>(q),
                       view_of<const void, const void*>(k_new), view_of<const void, const void*>(v_new),
                       pos.as<int32_t>(), slots_of(slots), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        kv_append_ref<T>(p, cache.k.as<T>(), cache.v.as<T>(), view_of<T, T*>(q), view_of<const T, const T*>(k_new),
                         view_of<const T, const T*>(v_new), pos.as<int32_t>(), slots_of(slots));
      });
}

void attention_decode(const DecodeAttentionParams& p, const Tensor& out, const Tensor& q, const KvCacheView& cache,
                      const Tensor& pos, const Tensor& slots, Context& ctx) {
  constexpr const char* op = "attention_decode";
  const DType dt = expect_args(p, {{q, "q", p.H}, {out, "out", p.H}}, cache, pos, slots, op, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        attention_decode_cuda(p, dt, view_of<void, void*>(out), view_of<const void, const void*>(q), cache.k.data(),
                              cache.v.data(), pos.as<int32_t>(), slots_of(slots), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        attention_decode_ref<T>(p, view_of<T, T*>(out), view_of<const T, const T*>(q), cache.k.as<T>(), cache.v.as<T>(),
                                pos.as<int32_t>(), slots_of(slots));
      });
}

}  // namespace tessera
