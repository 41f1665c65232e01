// tessera/infer/decode_ops — the inference engine's small device ops around the layers: the embedding of one new
// token per row at a position read on the device, the greedy argmax of a logits row, the advance of the positions,
// and the reorder of a KV cache's slot table after a beam step.
//
// decode_embedding: for row b, with tok = tokens[b], t = pos[b] (both on the device):
//   out[b, :] = 0                                   if tok == padding_id
//             = scale * wte[tok, :] + wpe[t, :]     otherwise (no wpe term without a position table)
//   The embedding op's (ops/embedding) with T = 1 and each row at its own position. t is clamped to max_seq - 1 and
//   tok to [0, V) on the device (it cannot refuse without a host sync; the engine checks both on the host first).
// greedy_argmax: out[b] = the lowest id v < V with logits[b, v] maximal among the row's V logits (row stride ld);
//   NaN is never taken (a row of NaN gives 0).
// positions_advance: pos[b] += 1 for b < n.
// slot_reorder (beam search, attention_decode.h's slot table, (S, max_seq) int32): every row b becomes a child of
//   row p = parents[b]: pos_out[b] = pos_in[p], slots_out[b, t] = slots_in[p, t] for t < pos_in[p], and
//   slots_out[b, t] = slots_in[b, t] for t >= pos_in[p] (a row's own slot, where its new tokens go). Out of place:
//   a row may be read as a parent after it was rewritten. parents out of [0, S) are clamped on the device.
#pragma once
#include <cstdint>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct DecodeEmbeddingParams {
  int B = 0, C = 0, V = 0, max_seq = 0;
  float scale = 1.0f;
  int padding_id = -1;  // -1: none
};

template <typename T>
void decode_embedding_ref(const DecodeEmbeddingParams& p, T* out, const int32_t* tokens, const int32_t* pos,
                          const T* wte, const T* wpe);
template <typename T>
void greedy_argmax_ref(int B, int V, int64_t ld, const T* logits, int32_t* out);
void positions_advance_ref(int n, int32_t* pos);
void slot_reorder_ref(int S, int max_seq, const int32_t* parents, const int32_t* pos_in, const int32_t* slots_in,
                      int32_t* pos_out, int32_t* slots_out);

// Tensor-level entries: the reference on a CPU context (f32 / f64), the CUDA kernels on a GPU one (f32, bf16, f16).
// out (B, C), wte (V, C), wpe (max_seq, C) or undefined, in the compute dtype; tokens, pos (B) int32.
void decode_embedding(const DecodeEmbeddingParams& p, const Tensor& out, const Tensor& tokens, const Tensor& pos,
                      const Tensor& wte, const Tensor& wpe, Context& ctx);
// logits: at least (B - 1) ld + V elements; out (B) int32.
void greedy_argmax(int B, int V, int64_t ld, const Tensor& logits, const Tensor& out, Context& ctx);
void positions_advance(const Tensor& pos, Context& ctx);
// parents, pos_in, pos_out (S) int32; slots_in, slots_out (S, max_seq) int32; the outs must not overlap the ins.
void slot_reorder(int S, int max_seq, const Tensor& parents, const Tensor& pos_in, const Tensor& slots_in,
                  const Tensor& pos_out, const Tensor& slots_out, Context& ctx);

// Copies src (contiguous, any dtype) to `host`. On a GPU through `pinned` (page-locked, at least src's bytes): an
// async copy on ctx's stream, then one stream sync, then a host copy; on the CPU a plain copy (pinned unused).
void read_to_host(void* pinned, void* host, const Tensor& src, Context& ctx);

// CUDA launchers (decode_ops.cu), on ctx's stream; device pointers, floats in `dtype`.
void decode_embedding_cuda(const DecodeEmbeddingParams& p, DType dtype, void* out, const int32_t* tokens,
                           const int32_t* pos, const void* wte, const void* wpe, Context& ctx);
void greedy_argmax_cuda(int B, int V, int64_t ld, DType dtype, const void* logits, int32_t* out, Context& ctx);
void positions_advance_cuda(int n, int32_t* pos, Context& ctx);
void slot_reorder_cuda(int S, int max_seq, const int32_t* parents, const int32_t* pos_in, const int32_t* slots_in,
                       int32_t* pos_out, int32_t* slots_out, Context& ctx);
// An async copy of device memory into page-locked host memory on ctx's stream (the host syncs the stream before it
// reads): how the engine reads each step's new tokens.
void copy_device_to_host_async(void* pinned_host, const void* device, size_t bytes, Context& ctx);

}  // namespace tessera
