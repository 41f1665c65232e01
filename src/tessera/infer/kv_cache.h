// tessera/infer/kv_cache.h — the inference engine's KV cache: every layer's keys and values, the positions and the
// optional slot table of attention_decode.h, in one allocation on the model's device.
//
// Layout (bytes, each part starting 256-byte aligned): for l < L, K_l then V_l, each (S, Hkv, max_seq, Dh) in the
// compute dtype; pos (S) int32; with a slot table, slots (S, max_seq) int32 and a second table of that size with
// its own pos (S), the out-of-place target of slot_reorder (decode_ops.h), copied back after it. S = cache slots
// (batch x beams).
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/ops/attention/attention_decode.h"

namespace tessera {

struct KvCacheShape {
  int layers = 0, S = 0, Hkv = 0, max_seq = 0, Dh = 0;
  bool slot_table = false;
};

class KvCache {
 public:
  KvCache() = default;
  // Allocates the cache on ctx's device; pos starts at 0 and a slot table as the identity (slots[b, t] = b).
  KvCache(const KvCacheShape& s, DType dtype, Context& ctx);
  // The bytes of the allocation for (s, dtype): exactly what the constructor allocates.
  static size_t bytes(const KvCacheShape& s, DType dtype);
  size_t bytes() const { return buf_.bytes(); }
  const KvCacheShape& shape() const { return s_; }
  DType dtype() const { return dtype_; }

  KvCacheView layer(int l) const;
  Tensor pos() const;          // (S) int32
  Tensor slots() const;        // (S, max_seq) int32, or undefined without a table
  Tensor scratch_pos() const;  // slot_reorder's targets (undefined without a table)
  Tensor scratch_slots() const;
  // Sets every row of the slot table to its own slot (slots[b, t] = b), on the host's order of ctx's stream.
  void reset_slots(Context& ctx);
  // Beam step: row b of the table (and its pos) becomes a child of row parents[b] (decode_ops.h's slot_reorder),
  // parents (S) int32 on the device; no K or V moves. Queued on ctx's stream, no host sync (graph-capturable).
  void reorder(const Tensor& parents, Context& ctx);

 private:
  struct Offsets {
    size_t layer_bytes = 0, pos = 0, slots = 0, scratch_pos = 0, scratch_slots = 0, total = 0;
  };
  static Offsets offsets(const KvCacheShape& s, DType dtype);
  KvCacheShape s_;
  DType dtype_ = DType::F32;
  Offsets off_;
  Buffer buf_;
};

}  // namespace tessera
