#include "tessera/infer/kv_cache.h"

#include <vector>

#include "tessera/core/error.h"
#include "tessera/infer/decode_ops.h"

namespace tessera {

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

KvCache::Offsets KvCache::offsets(const KvCacheShape& s, DType dtype) {
  TS_CHECK(s.layers > 0 && s.S > 0 && s.Hkv > 0 && s.max_seq > 0 && s.Dh > 0, "KV cache: bad shape: ", s.layers,
           " layers, ", s.S, " slots, ", s.Hkv, " KV heads, ", s.max_seq, " positions, head dim ", s.Dh);
  Offsets o;
  o.layer_bytes = align_up(static_cast<size_t>(s.S) * s.Hkv * s.max_seq * s.Dh * dtype_size(dtype));
  size_t at = 2 * o.layer_bytes * static_cast<size_t>(s.layers);
  o.pos = at;
  at += align_up(static_cast<size_t>(s.S) * sizeof(int32_t));
  if (s.slot_table) {
    const size_t table = align_up(static_cast<size_t>(s.S) * s.max_seq * sizeof(int32_t));
    o.slots = at;
    at += table;
    o.scratch_pos = at;
    at += align_up(static_cast<size_t>(s.S) * sizeof(int32_t));
    o.scratch_slots = at;
    at += table;
  }
  o.total = at;
  return o;
}

size_t KvCache::bytes(const KvCacheShape& s, DType dtype) { return offsets(s, dtype).total; }

KvCache::KvCache(const KvCacheShape& s, DType dtype, Context& ctx)
    : s_(s), dtype_(dtype), off_(offsets(s, dtype)), buf_(off_.total, ctx.device(), "the KV cache") {
  // The cache is zeroed: a position no append has written reads as 0, never as stale memory.
  fill_bytes(buf_.view(DType::U8, {static_cast<int64_t>(off_.total)}), 0, ctx);
  reset_slots(ctx);
}

KvCacheView KvCache::layer(int l) const {
  TS_CHECK(l >= 0 && l < s_.layers, "internal: KV cache layer ", l, " of ", s_.layers);
  const std::initializer_list<int64_t> shape = {s_.S, s_.Hkv, s_.max_seq, s_.Dh};
  return {.k = buf_.view(dtype_, shape, 2 * l * off_.layer_bytes),
          .v = buf_.view(dtype_, shape, (2 * l + 1) * off_.layer_bytes)};
}

Tensor KvCache::pos() const { return buf_.view(DType::I32, {s_.S}, off_.pos); }

Tensor KvCache::slots() const {
  return s_.slot_table ? buf_.view(DType::I32, {s_.S, s_.max_seq}, off_.slots) : Tensor();
}
Tensor KvCache::scratch_pos() const {
  return s_.slot_table ? buf_.view(DType::I32, {s_.S}, off_.scratch_pos) : Tensor();
}
Tensor KvCache::scratch_slots() const {
  return s_.slot_table ? buf_.view(DType::I32, {s_.S, s_.max_seq}, off_.scratch_slots) : Tensor();
}

void KvCache::reset_slots(Context& ctx) {
  if (!s_.slot_table) return;
  std::vector<int32_t> table(static_cast<size_t>(s_.S) * s_.max_seq);
  for (int b = 0; b < s_.S; ++b)
    for (int t = 0; t < s_.max_seq; ++t) table[static_cast<size_t>(b) * s_.max_seq + t] = b;
  copy_bytes(slots().data(), ctx.device(), table.data(), Device::cpu(), table.size() * sizeof(int32_t), ctx);
  ctx.synchronize();  // the host vector dies here
}

void KvCache::reorder(const Tensor& parents, Context& ctx) {
  TS_CHECK(s_.slot_table, "internal: KV cache reorder without a slot table");
  slot_reorder(s_.S, s_.max_seq, parents, pos(), slots(), scratch_pos(), scratch_slots(), ctx);
  copy_bytes(pos().data(), ctx.device(), scratch_pos().data(), ctx.device(), pos().nbytes(), ctx);
  copy_bytes(slots().data(), ctx.device(), scratch_slots().data(), ctx.device(), slots().nbytes(), ctx);
}

}  // namespace tessera
