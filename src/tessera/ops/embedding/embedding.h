// tessera/ops/embedding — fused token + position embedding with scale, padding and dropout.
//
//   out[b,t,:] = 0                                                    if tokens[b,t] == padding_id
//   out[b,t,:] = dropout(scale * wte[tokens[b,t], :] + wpe[pos_offset + t, :])   otherwise
//
// tokens: (B*T) int32; wte: (V, C); wpe: (max_seq, C) or null (no position table, e.g. RoPE models);
// out: (B*T, C) row-major. Dropout keeps element i of out with probability 1 - dropout, drawn as
// philox_keep(seed, stream, i), and scales kept elements by 1 / (1 - dropout).
// The backward accumulates into d_wte per token id (and into d_wpe per position when d_wpe is not null);
// padded and dropped elements contribute nothing.
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

namespace tessera {

struct EmbeddingParams {
  int B = 0, T = 0, C = 0, V = 0;
  int max_seq = 0;     // rows of wpe
  int pos_offset = 0;  // position of t = 0 (non-zero when decoding after a prefix)
  float scale = 1.0f;
  int padding_id = -1;  // -1: no padding token
  float dropout = 0.0f;
  uint64_t seed = 0, stream = 0;
};

// Throws Error naming the first token id outside [0, V) or a position beyond max_seq.
void embedding_check(const EmbeddingParams& p, const int32_t* tokens, bool has_positions);

template <typename T>
void embedding_forward_ref(const EmbeddingParams& p, T* out, const int32_t* tokens, const T* wte, const T* wpe);

template <typename T>
void embedding_backward_ref(const EmbeddingParams& p, T* d_wte, T* d_wpe, const T* d_out, const int32_t* tokens);

}  // namespace tessera

// ---- Tensor-level entries (embedding.cpp): the reference (CPU) or the CUDA kernels by device and dtype. ----
// tokens: (B*T) i32 on the context's device; wte, d_wte: (V, C); wpe, d_wpe: (max_seq, C) or undefined (no
// learned positions: RoPE, or a fixed sinusoidal table passed as wpe with no d_wpe); out, d_out: (B*T, C).
// Float tensors in the compute dtype. d_wte and d_wpe are accumulated (+=), as the reference does.
// Both entries check pos_offset + T <= max_seq when a position table is given. The CPU path also checks every
// token id; the CUDA path cannot without a host sync, so there a token outside [0, V) gives a NaN row of out in
// the forward and no gradient in the backward (the loss shows it at once, and nothing is read out of bounds).
namespace tessera {

bool embedding_supports(const EmbeddingParams& p, DType dtype, Device device, std::string* why = nullptr);

void embedding_forward(const EmbeddingParams& p, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, Context& ctx);
void embedding_backward(const EmbeddingParams& p, const Tensor& d_wte, const Tensor& d_wpe, const Tensor& d_out,
                        const Tensor& tokens, Context& ctx);

// ---- CUDA launchers (embedding.cu), on ctx's stream; pointers are device memory (floats in `dtype`). ----
// Forward (embedding_forward_pack): one thread per 16-byte pack of out (scalar when C is not a multiple of the
// pack or a table is not 16-byte aligned): token row, position row, scale, padding and dropout in one pass.
// Backward, deterministic, with no float atomics:
//   d_wte: the rows are sorted by key (token id, or V for padded / invalid rows) on the device, stably, so each
//   token's rows stay in ascending order: a bucket sort (integer atomics count each key's rows, cub's prefix sum
//   places the buckets, and each row's rank among its bucket's rows, counted, places it). The sorted positions
//   are cut into chunks of 32 aligned to multiples of 32. Pass 1: one warp per chunk that begins inside a run (its
//   first key equals the previous one) sums the run's rows within the chunk into an f32 partial (scratch). Pass 2:
//   one warp per run (and 32-pack column block) sums the run's rows in its first chunk, adds the partials of the
//   chunks that continue the run in chunk order, and adds scale × sum to d_wte. A fixed order: deterministic; a
//   run of L rows costs its warp ≤ 32 rows + L / 32 partials (text's frequent ids make runs of thousands), and
//   uniform ids (runs of 1-2 rows) only the first piece.
//   d_wpe: one thread per (t, pack) sums over b in order and adds to d_wpe[pos_offset + t], in pass 2's launch.
//   Above kEmbeddingBucketSortMaxRows rows the sort is cub's radix sort instead (same output): the bucket sort's
//   ranking grows with the square of the largest bucket (every row one id is the worst case).
constexpr int kEmbeddingBucketSortMaxRows = 32768;
// Scratch: embedding_backward_scratch_bytes(B*T, V, C) bytes of ctx.scratch (5 × B*T int32, 2 × (V + 1) int32, the
// chunk partials ceil(B*T / 32) × C f32, and cub's prefix-sum or radix-sort storage).
size_t embedding_backward_scratch_bytes(int rows, int V, int C);
void embedding_forward_cuda(const EmbeddingParams& p, DType dtype, void* out, const int32_t* tokens, const void* wte,
                            const void* wpe, Context& ctx);
void embedding_backward_cuda(const EmbeddingParams& p, DType dtype, void* d_wte, void* d_wpe, const void* d_out,
                             const int32_t* tokens, Context& ctx);

}  // namespace tessera
