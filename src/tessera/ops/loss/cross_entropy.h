// tessera/ops/loss — softmax cross-entropy with label smoothing and an ignore index.
//
// For row n with target y (skipped when y == ignore_index), q = softmax(logits[n]) and the smoothed target
// p = (1 - eps) onehot(y) + eps / V:
//   loss_n = -Σ_j p_j log q_j = lse_n - (1 - eps) logits[n, y] - (eps / V) Σ_j logits[n, j]
//   d_logits[n] = (q - p) * d_loss_n
// The forward writes per-row losses (0 for ignored rows) and lse, and returns the number of counted rows;
// mean loss = Σ losses / count, matching torch.nn.functional.cross_entropy(label_smoothing=eps).
// logits: (N, V); targets: (N) int32; losses, lse: (N). d_logits is overwritten; for a mean loss pass
// d_loss = 1 / count.
#pragma once
#include <cstdint>

namespace tessera {

struct CrossEntropyParams {
  int N = 0, V = 0;
  float label_smoothing = 0.0f;
  int ignore_index = -1;
};

template <typename T>
long cross_entropy_forward_ref(const CrossEntropyParams& p, T* losses, T* lse, const T* logits,
                               const int32_t* targets);
template <typename T>
void cross_entropy_backward_ref(const CrossEntropyParams& p, T* d_logits, const T* logits, const T* lse,
                                const int32_t* targets, double d_loss);

}  // namespace tessera
