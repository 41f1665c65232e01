// tessera/models/gpt.h — decoder-only transformer with explicit forward and backward (no autograd tape).
//
// Pre-norm blocks:  h = x + Drop(Attn(Norm1(x)) Woᵀ + bo),  x' = h + Drop(Act(Norm2(h) W1ᵀ + b1) W2ᵀ + b2)
// then a final norm and logits = Norm_f(x) W_lmᵀ (W_lm = wte when tied). Shapes: tokens (B, T), residual
// stream (B*T, C), qkv (B*T, 3C), logits (B*T, V).
//
// Parameters live in one ParamBuffer (names below); activations in one Arena planned for N = B*T tokens: what
// the backward needs is kept per layer, temporaries and gradient buffers are shared across layers, and the
// logits buffer is overwritten in place by its gradient. Every buffer is sized by N alone, so a plan serves
// any forward with B*T no larger than the planned N; it is re-planned only when a forward needs more.
//
// Real is float for training and double for gradient checks by finite differences.
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/core/arena.h"
#include "tessera/core/philox.h"
#include "tessera/models/config.h"
#include "tessera/nn/param_buffer.h"

namespace tessera {

struct ForwardOptions {
  bool training = false;        // dropout on
  float label_smoothing = 0.0f;
  RngState* rng = nullptr;      // dropout streams are taken from here when training with dropout > 0
};

template <typename Real>
class GptT {
 public:
  explicit GptT(const ModelConfig& cfg);

  const ModelConfig& config() const { return cfg_; }
  ParamBuffer<Real>& params() { return params_; }
  const ParamBuffer<Real>& params() const { return params_; }

  // GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, residual projections scaled by
  // 1/sqrt(2 n_layers), zero biases, unit norm gains. Each tensor draws its own Philox stream of `seed`.
  void init_weights(uint64_t seed);

  // Runs the model on tokens (B*T). With targets (B*T) it also computes the cross-entropy and returns the
  // mean loss over non-ignored targets (padding_id is ignored); without, returns 0.
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T, const ForwardOptions& opt);
  // Accumulates into params().grad() the gradient of loss_scale * (mean loss of the last forward).
  // Needs a forward with targets just before. Overwrites the logits.
  void backward(double loss_scale = 1.0);
  void zero_grad() { params_.zero_grad(); }

  // Logits of the last forward: (B*T, V).
  const Real* logits() const { return acts_.logits; }
  int last_B() const { return B_; }
  int last_T() const { return T_; }

  // Plans the activations for forwards of up to B*T tokens (T <= max_seq) now, so that later forwards of
  // that size or smaller reuse the plan. Never shrinks a larger plan. Generation calls it once.
  void reserve(int B, int T);

  // Bytes of the activation plan for (B, T) (a function of B*T only), and the arena's peak so far.
  static size_t activation_bytes(const ModelConfig& cfg, int B, int T);
  size_t activation_peak() const { return arena_.peak(); }
  // Tokens (B*T) the current plan holds, and how many times the activations were planned.
  int64_t planned_tokens() const { return planned_N_; }
  int64_t plan_count() const { return plan_count_; }

 private:
  struct LayerOffsets {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b;
  };
  struct LayerActs {
    Real *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse, *mid, *ln2, *ln2_mean, *ln2_rstd, *fc_pre, *fc_act;
    uint64_t stream_attn = 0, stream_mlp = 0;
  };
  struct Acts {
    std::vector<Real*> res;  // L + 1 residual stream states
    std::vector<LayerActs> layers;
    Real *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *ce_lse, *tmp;
    Real *d_res, *d_tmp, *d_ln, *d_att, *d_qkv, *d_fc_act, *d_fc_pre;
    int32_t *tokens, *targets;
    uint64_t stream_emb = 0;
  };

  static void plan(const ModelConfig& cfg, int B, int T, Arena& arena, Acts& acts);
  void ensure_plan(int B, int T);
  void norm_forward(int N, Real* out, Real* mean, Real* rstd, const Real* x, size_t w, size_t b);
  void norm_backward(int N, Real* d_x, const Real* d_out, const Real* x, size_t w, size_t b, const Real* mean,
                     const Real* rstd);
  void layer_forward(int l, int B, int T);
  void layer_backward(int l, int B, int T);

  ModelConfig cfg_;
  ParamBuffer<Real> params_;
  size_t wte_ = kNoParam, wpe_ = kNoParam, lnf_w_ = kNoParam, lnf_b_ = kNoParam, lm_head_ = kNoParam;
  std::vector<LayerOffsets> layers_;
  std::vector<Real> sinusoid_;  // (max_seq, C) table for sinusoidal positions

  Arena arena_;
  Acts acts_;
  int B_ = 0, T_ = 0;
  int64_t planned_N_ = 0;       // B*T of the current plan
  int64_t plan_count_ = 0;
  long count_ = 0;              // targets counted by the last forward
  uint64_t dropout_seed_ = 0;   // dropout of the last forward (0 probability when off)
  float dropout_p_ = 0.0f;
  float label_smoothing_ = 0;
  bool has_targets_ = false;
};

using Gpt = GptT<float>;

}  // namespace tessera
