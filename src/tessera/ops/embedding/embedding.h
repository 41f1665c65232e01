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

namespace tessera {

struct EmbeddingParams {
  int B = 0, T = 0, C = 0, V = 0;
  int max_seq = 0;           // rows of wpe
  int pos_offset = 0;        // position of t = 0 (non-zero when decoding after a prefix)
  float scale = 1.0f;
  int padding_id = -1;       // -1: no padding token
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
