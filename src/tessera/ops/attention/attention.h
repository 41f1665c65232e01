// tessera/ops/attention — causal multi-head attention (reference) and rotary position embedding.
//
// qkv: (B, T, 3, H, Dh) row-major, i.e. rows of width 3C = [q | k | v] with C = H * Dh, head h at h*Dh.
// out: (B, T, H, Dh) = (B*T, C).  lse: (B, H, T), the logsumexp of each score row, saved for the backward.
//   S = Q Kᵀ / sqrt(Dh) (entries j > i masked when causal),  lse_i = log Σ_j exp(S_ij),  O = exp(S - lse) V
// Backward (FlashAttention-2 form, P recomputed from lse): D_i = dO_i · O_i,  dS = P ∘ (dO Vᵀ - D),
//   dQ = dS K / sqrt(Dh),  dK = dSᵀ Q / sqrt(Dh),  dV = Pᵀ dO.   d_qkv is overwritten.
#pragma once

namespace tessera {

struct AttentionParams {
  int B = 0, T = 0, H = 0, Dh = 0;
  bool causal = true;
};

template <typename T>
void attention_forward_ref(const AttentionParams& p, T* out, T* lse, const T* qkv);
template <typename T>
void attention_backward_ref(const AttentionParams& p, T* d_qkv, const T* d_out, const T* qkv, const T* out,
                            const T* lse);

// Rotary position embedding (the "rotate half" form of GPT-NeoX and Hugging Face Llama), applied in place to
// the q and k parts of qkv. For i < Dh/2 and position pos = pos_offset + t, with a = pos * theta^(-2i/Dh):
//   x'[i] = x[i] cos a - x[i + Dh/2] sin a,   x'[i + Dh/2] = x[i + Dh/2] cos a + x[i] sin a
// The backward applies the transposed rotation to d_qkv in place.
struct RopeParams {
  int B = 0, T = 0, H = 0, Dh = 0;
  float theta = 10000.0f;
  int pos_offset = 0;
};

template <typename T>
void rope_forward_ref(const RopeParams& p, T* qkv);
template <typename T>
void rope_backward_ref(const RopeParams& p, T* d_qkv);

}  // namespace tessera
