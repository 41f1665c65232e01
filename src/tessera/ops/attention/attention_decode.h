// tessera/ops/attention/attention_decode.h — attention of a few new queries per sequence against a KV cache, and
// the append that writes the new keys and values into it (the inference engine's decode step and prefill).
//
// Cache layout, per layer: K and V each (S, Hkv, max_seq, Dh) in the compute dtype, contiguous; S cache slots
// (batch x beams). Slot s, KV head g, position t holds element d at ((s Hkv + g) max_seq + t) Dh + d, so one head's
// keys are contiguous rows (what the split-KV kernel streams).
//
// Positions: pos (B) int32, on the call's device, is each sequence's cache length before this call: its Tq new
// tokens take positions pos[b] .. pos[b] + Tq - 1. Sequences have their own lengths (prompts of unequal lengths,
// finished beams); pos is read on the device, so a captured CUDA graph replays with new values.
//
// Slot table (optional, beam search): slots (B, max_seq) int32: position t of sequence b lives in cache slot
//   slots[b max_seq + t]. Without it sequence b's positions all live in slot b. A beam step that makes beam b a
//   child of beam p rewrites row b as row p for t < pos (an int per position; no layer's K or V is copied), and
//   the append writes the new token's K and V into the slot that the table names at its position.
//
// kv_append: for i < Tq, t = pos[b] + i, s = slot(b, t):
//   K[s, g, t] = rope(k_new[b, i, g], t),  V[s, g, t] = v_new[b, i, g];  q[b, i, h] = rope(q[b, i, h], t) in place
//   (rope: attention.h's rotate-half form with theta rope_theta, the identity when rope_theta == 0). Sequences with
//   pos[b] + Tq > max_seq are an error on the CPU; the CUDA kernel skips the positions past max_seq.
// attention_decode: query i of sequence b (query head h, KV head g = h / (H / Hkv)) sees keys t < pos[b] + i + 1
//   (the cache after the append: causal among the new queries):
//   S_t = q · K[slot(b, t), g, t] / sqrt(Dh),  out[b, i, h] = Σ_t softmax(S)_t V[slot(b, t), g, t]
//   A sequence whose pos[b] + i + 1 exceeds max_seq reads max_seq keys. The statistics are f32 whatever the dtype.
// Split-KV (FlashDecoding): the CUDA kernel divides each (b, h) row's keys into splits that run as separate blocks,
//   each writing a partial (max, sum, out) to scratch; the last split of each row group to finish combines them, in
//   the same launch:
//   m = max_s m_s,  l = Σ_s l_s e^(m_s - m),  out = Σ_s e^(m_s - m) out_s / l.
//   The result does not depend on the split count beyond f32 rounding. splits 0 lets the launcher choose from
//   the SM count and max_seq (it cannot read pos); each split then covers at least 64 of the sequence's keys.
// On the GPU (attention_decode.cu): a slot-table entry outside [0, S), which the device cannot refuse, makes the
//   append skip that position and the decode read slot 0 there. More than one split uses B H Tq splits (Dh + 2)
//   floats of ctx.scratch, and RoPE a table that ctx.device_table makes on the first call: a CUDA graph capture
//   must follow one eager call of the same shape (as for every op that uses them).
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/attention/attention.h"

namespace tessera {

struct DecodeAttentionParams {
  int B = 0;   // sequences in the call
  int Tq = 1;  // new tokens per sequence (1 for a decode step; the prompt length for a prefill's append)
  int H = 0, Hkv = 0, Dh = 0;
  int S = 0;        // cache slots (>= B)
  int max_seq = 0;  // cache positions per slot
  float rope_theta = 0.0f;
  int splits = 0;  // split-KV blocks per (b, h) row on the GPU; 0: the launcher chooses
};

// The cache of one layer, and the per-call device arrays.
struct KvCacheView {
  Tensor k, v;  // (S, Hkv, max_seq, Dh) contiguous, compute dtype
};

bool attention_decode_supports(const DecodeAttentionParams& p, DType dtype, Device device, std::string* why = nullptr);

// q: (B, Tq, H, Dh) and k_new, v_new: (B, Tq, Hkv, Dh), strided views with the last stride 1 (slices of the fused
// qkv projection's output); q is rotated in place. pos: (B) int32; slots: (B, max_seq) int32 or undefined.
void kv_append(const DecodeAttentionParams& p, const KvCacheView& cache, const Tensor& q, const Tensor& k_new,
               const Tensor& v_new, const Tensor& pos, const Tensor& slots, Context& ctx);
// out: (B, Tq, H, Dh), a strided view with the last stride 1. Reads the cache after kv_append.
void attention_decode(const DecodeAttentionParams& p, const Tensor& out, const Tensor& q, const KvCacheView& cache,
                      const Tensor& pos, const Tensor& slots, Context& ctx);

// References (CPU, T = float or double): readable loops over the definitions above.
template <typename T>
void kv_append_ref(const DecodeAttentionParams& p, T* cache_k, T* cache_v, AttentionView<T> q,
                   AttentionView<const T> k_new, AttentionView<const T> v_new, const int32_t* pos,
                   const int32_t* slots);
template <typename T>
void attention_decode_ref(const DecodeAttentionParams& p, AttentionView<T> out, AttentionView<const T> q,
                          const T* cache_k, const T* cache_v, const int32_t* pos, const int32_t* slots);

// CUDA launchers (attention_decode.cu), on ctx's stream; device pointers in `dtype` (f32, bf16, f16).
void kv_append_cuda(const DecodeAttentionParams& p, DType dtype, void* cache_k, void* cache_v, AttentionView<void> q,
                    AttentionView<const void> k_new, AttentionView<const void> v_new, const int32_t* pos,
                    const int32_t* slots, Context& ctx);
void attention_decode_cuda(const DecodeAttentionParams& p, DType dtype, AttentionView<void> out,
                           AttentionView<const void> q, const void* cache_k, const void* cache_v, const int32_t* pos,
                           const int32_t* slots, Context& ctx);

}  // namespace tessera
