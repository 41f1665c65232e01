// tessera/nn/lm_head.h — the head of a language model: the final norm, the logits and the fused cross-entropy.
//
//   h = Norm_f(x) (N, C),  logits = h W_lmᵀ (N, ld) with V columns used (W_lm (V, C): its own, or the token
//   embedding's when tied),  loss = mean over non-ignored targets of CE(logits, targets) with label smoothing
//
// The logits' row stride ld is V for f32 / f64 models and V rounded up to 64 for 16-bit ones (each row 128-byte
// aligned for cuBLASLt's aligned tensor-core kernels; the padding columns are never read or written). With
// padded rows the forward and dx GEMMs run over the first V0 = V rounded down to 64 vocabulary entries, then the
// V - V0 left in a second, small GEMM: cuBLASLt runs an unaligned V (GPT-2's 50257) as an output width or a
// reduction length on slower kernels than the aligned V0. Without a final norm (a post-norm encoder-decoder's
// decoder: BART) h = x, and the dx GEMM writes the input's gradient itself. The cross-entropy backward writes d_logits
// over the logits in place, or the forward writes them already (a training step's loss_grad_scale: the logits read once
// and written once).
#pragma once
#include <optional>
#include <string>

#include "tessera/nn/norm.h"
#include "tessera/ops/loss/cross_entropy.h"

namespace tessera {

struct LmHeadShape {
  int V = 0, C = 0;
  int64_t ld = 0;  // the logits' row stride
  NormKind norm = NormKind::LayerNorm;
  bool bias = true;  // the final LayerNorm's bias
  float norm_eps = 1e-5f;
  bool tied = true;
  int ignore_index = -1;
  bool final_norm = true;  // false: the logits read the stream as it comes
};

class Block;

class LmHead {
 public:
  // Segments "lnf.w" (".b") and, untied, "lm_head"; buffers "lnf", "logits", "losses", "ce_lse", "d_lnf".
  explicit LmHead(const LmHeadShape& s) : s_(s), lnf_("lnf", s.norm, s.bias, s.C, s.norm_eps) {}
  // tied_weight: the token embedding's offset, the head's weight when tied.
  void add_params(ParamBuffer& pb, size_t tied_weight);
  size_t param_begin() const { return lnf_.weight_offset(); }
  size_t weight_offset() const { return lm_; }
  const Norm& input_norm() const { return lnf_; }
  // The pre-norm block whose last residual op computes the final norm (null: the head runs it).
  void set_producer(const Block* block) { producer_ = block; }

  void schedule_forward(StepSchedule& s);
  void schedule_backward(StepSchedule& s);
  int input_last_use() const { return s_.final_norm ? bwd_ + 3 : bwd_ + 1; }  // ln_f + residual, or lm_head dW
  int backward_end() const { return bwd_ + 3; }
  // The event that writes the gradient of the head's input.
  int d_input_event() const { return s_.final_norm ? bwd_ + 3 : bwd_ + 2; }
  int first_grad_event() const { return s_.tied ? bwd_ + 3 : bwd_ + 1; }
  int lm_head_dw_event() const { return bwd_ + 1; }
  int loss_event() const { return fwd_ + 2; }
  void declare(PlanBuilder& pb, DType dtype);
  Tensor logits(int64_t N) const { return rows(logits_, N, s_.ld); }

  // x: the stream (N, C). With targets: the mean loss into loss (device scalar {Σ, mean}: loss_sum) and the
  // non-ignored count into count; with loss_grad_scale also d_logits over the logits.
  void forward(const StepEnv& env, const Tensor& x) const;
  void loss_forward(const StepEnv& env, const Tensor& targets, float label_smoothing,
                    std::optional<double> loss_grad_scale, const Tensor& loss_sum, const Tensor& count) const;
  // d_res = the gradient of x (overwritten), scaled by loss_scale; `fused`: the forward wrote d_logits.
  void backward(const StepEnv& env, const Tensor& d_res, const Tensor& x, const Tensor& targets, float label_smoothing,
                double loss_scale, bool fused, const Tensor& count) const;

 private:
  int64_t split() const { return s_.ld == s_.V ? s_.V : s_.V / 64 * 64; }
  // What the logits read: ln_f's output, or the stream x itself.
  Tensor head_input(const Tensor& x, int64_t N) const { return s_.final_norm ? lnf_.out(N) : rows(x, N, s_.C); }
  CrossEntropyParams ce_params(const StepEnv& env, float label_smoothing) const {
    return {.N = env.N(), .V = s_.V, .label_smoothing = label_smoothing, .ignore_index = s_.ignore_index, .ld = s_.ld};
  }
  LmHeadShape s_;
  Norm lnf_;
  size_t lm_ = kNoParam;
  const Block* producer_ = nullptr;
  int fwd_ = -1, bwd_ = -1;
  Tensor logits_, losses_, ce_lse_, d_lnf_;
};

}  // namespace tessera
