// The engine's small ops: references and Tensor-level entries (decode_ops.h).
#include "tessera/infer/decode_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "tessera/core/buffer.h"

#include "tessera/ops/dispatch.h"

namespace tessera {

template <typename T>
void decode_embedding_ref(const DecodeEmbeddingParams& p, T* out, const int32_t* tokens, const int32_t* pos,
                          const T* wte, const T* wpe) {
  for (int b = 0; b < p.B; ++b) {
    T* o = out + static_cast<int64_t>(b) * p.C;
    const int32_t tok = tokens[b];
    if (tok == p.padding_id) {
      std::fill(o, o + p.C, T(0));
      continue;
    }
    TS_CHECK(tok >= 0 && tok < p.V, "decode_embedding: token id ", tok, " of row ", b, " is outside the vocab ", p.V);
    TS_CHECK(!wpe || (pos[b] >= 0 && pos[b] < p.max_seq), "decode_embedding: position ", pos[b], " of row ", b,
             " is outside the table of ", p.max_seq);
    const T* e = wte + static_cast<int64_t>(tok) * p.C;
    const T* w = wpe ? wpe + static_cast<int64_t>(pos[b]) * p.C : nullptr;
    // The same expression as embedding_forward_ref's: scale * wte + wpe.
    for (int c = 0; c < p.C; ++c) o[c] = static_cast<T>(p.scale) * e[c] + (w ? w[c] : T(0));
  }
}

template <typename T>
void greedy_argmax_ref(int B, int V, int64_t ld, const T* logits, int32_t* out) {
  for (int b = 0; b < B; ++b) {
    const T* row = logits + b * ld;
    int best = 0;
    T best_v = -std::numeric_limits<T>::infinity();
    for (int v = 0; v < V; ++v)
      if (row[v] > best_v) {  // strict: the lowest id wins a tie; NaN never compares greater
        best_v = row[v];
        best = v;
      }
    out[b] = best;
  }
}

void positions_advance_ref(int n, int32_t* pos) {
  for (int b = 0; b < n; ++b) pos[b] += 1;
}

void slot_reorder_ref(int S, int max_seq, const int32_t* parents, const int32_t* pos_in, const int32_t* slots_in,
                      int32_t* pos_out, int32_t* slots_out) {
  for (int b = 0; b < S; ++b) {
    TS_CHECK(parents[b] >= 0 && parents[b] < S, "slot_reorder: parent ", parents[b], " of row ", b, " is outside ", S,
             " rows");
    const int p = parents[b];
    const int n = std::clamp(pos_in[p], 0, max_seq);
    pos_out[b] = pos_in[p];
    for (int t = 0; t < max_seq; ++t)
      slots_out[int64_t{b} * max_seq + t] = t < n ? slots_in[int64_t{p} * max_seq + t]
                                                  : slots_in[int64_t{b} * max_seq + t];
  }
}

template void decode_embedding_ref<float>(const DecodeEmbeddingParams&, float*, const int32_t*, const int32_t*,
                                          const float*, const float*);
template void decode_embedding_ref<double>(const DecodeEmbeddingParams&, double*, const int32_t*, const int32_t*,
                                           const double*, const double*);
template void greedy_argmax_ref<float>(int, int, int64_t, const float*, int32_t*);
template void greedy_argmax_ref<double>(int, int, int64_t, const double*, int32_t*);

namespace {
// A tensor of at least `numel` elements of `dtype` on ctx's device (views with row strides are not contiguous
// tensors of an exact size, so only the lower bound is checked).
void expect_at_least(const Tensor& t, const char* op, const char* name, DType dtype, int64_t numel,
                     const Context& ctx) {
  TS_CHECK(t.defined(), op, ": ", name, " is required");
  TS_CHECK(t.device() == ctx.device(), op, ": ", name, " is on ", t.device().str(), " but the context is ",
           ctx.device().str());
  TS_CHECK(t.dtype() == dtype, op, ": ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dtype));
  TS_CHECK(t.is_contiguous() && t.numel() >= numel, op, ": ", name, " has ", t.numel(), " elements, needs ", numel);
}
}  // namespace

void decode_embedding(const DecodeEmbeddingParams& p, const Tensor& out, const Tensor& tokens, const Tensor& pos,
                      const Tensor& wte, const Tensor& wpe, Context& ctx) {
  constexpr const char* op = "decode_embedding";
  const DType dt = wte.dtype();
  std::string why;
  require_supported(supports_dtype(dt, ctx.device(), &why), op, why);
  TS_CHECK(p.B >= 0 && p.C > 0 && p.V > 0 && p.max_seq > 0, op, ": bad shape B ", p.B, " C ", p.C, " V ", p.V);
  expect(out, op, "out", dt, int64_t{p.B} * p.C, ctx);
  expect(tokens, op, "tokens", DType::I32, p.B, ctx);
  expect(pos, op, "pos", DType::I32, p.B, ctx);
  expect(wte, op, "wte", dt, int64_t{p.V} * p.C, ctx);
  expect(wpe, op, "wpe", dt, int64_t{p.max_seq} * p.C, ctx, /*optional=*/true);
  dispatch(
      ctx, dt, op,
      [&] {
        decode_embedding_cuda(p, dt, out.data(), tokens.as<int32_t>(), pos.as<int32_t>(), wte.data(), wpe.data(), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        decode_embedding_ref<T>(p, out.as<T>(), tokens.as<int32_t>(), pos.as<int32_t>(), wte.as<T>(), wpe.as<T>());
      });
}

void greedy_argmax(int B, int V, int64_t ld, const Tensor& logits, const Tensor& out, Context& ctx) {
  constexpr const char* op = "greedy_argmax";
  const DType dt = logits.dtype();
  std::string why;
  require_supported(supports_dtype(dt, ctx.device(), &why), op, why);
  TS_CHECK(B >= 0 && V > 0 && ld >= V, op, ": bad shape B ", B, " V ", V, " ld ", ld);
  expect_at_least(logits, op, "logits", dt, B > 0 ? (B - 1) * ld + V : 0, ctx);
  expect(out, op, "out", DType::I32, B, ctx);
  dispatch(
      ctx, dt, op, [&] { greedy_argmax_cuda(B, V, ld, dt, logits.data(), out.as<int32_t>(), ctx); },
      [&](auto t) {
        using T = decltype(t);
        greedy_argmax_ref<T>(B, V, ld, logits.as<T>(), out.as<int32_t>());
      });
}

void positions_advance(const Tensor& pos, Context& ctx) {
  constexpr const char* op = "positions_advance";
  expect(pos, op, "pos", DType::I32, pos.numel(), ctx);
  const int n = static_cast<int>(pos.numel());
  if (!on_cuda(ctx, [&] { positions_advance_cuda(n, pos.as<int32_t>(), ctx); }))
    positions_advance_ref(n, pos.as<int32_t>());
}

void slot_reorder(int S, int max_seq, const Tensor& parents, const Tensor& pos_in, const Tensor& slots_in,
                  const Tensor& pos_out, const Tensor& slots_out, Context& ctx) {
  constexpr const char* op = "slot_reorder";
  TS_CHECK(S >= 0 && max_seq > 0, op, ": bad shape S ", S, " max_seq ", max_seq);
  for (const auto& [t, name, n] : {std::tuple{&parents, "parents", int64_t{S}},
                                   {&pos_in, "pos_in", int64_t{S}},
                                   {&pos_out, "pos_out", int64_t{S}},
                                   {&slots_in, "slots_in", int64_t{S} * max_seq},
                                   {&slots_out, "slots_out", int64_t{S} * max_seq}})
    expect(*t, op, name, DType::I32, n, ctx);
  TS_CHECK(pos_in.data() != pos_out.data() && slots_in.data() != slots_out.data(), op, ": runs out of place");
  if (!on_cuda(ctx, [&] {
        slot_reorder_cuda(S, max_seq, parents.as<int32_t>(), pos_in.as<int32_t>(), slots_in.as<int32_t>(),
                          pos_out.as<int32_t>(), slots_out.as<int32_t>(), ctx);
      }))
    slot_reorder_ref(S, max_seq, parents.as<int32_t>(), pos_in.as<int32_t>(), slots_in.as<int32_t>(),
                     pos_out.as<int32_t>(), slots_out.as<int32_t>());
}

void read_to_host(void* pinned, void* host, const Tensor& src, Context& ctx) {
  const size_t bytes = src.nbytes();
  TS_CHECK(src.is_contiguous() && src.device() == ctx.device(), "read_to_host: src must be contiguous on ",
           ctx.device().str());
  if (on_cuda(ctx, [&] {
        TS_CHECK(pinned, "internal: read_to_host on a GPU needs a pinned buffer");
        copy_device_to_host_async(pinned, src.data(), bytes, ctx);
        ctx.synchronize();
        std::memcpy(host, pinned, bytes);
      }))
    return;
  copy_bytes(host, Device::cpu(), src.data(), ctx.device(), bytes, ctx);
}

}  // namespace tessera
