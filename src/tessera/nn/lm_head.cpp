#include "tessera/nn/lm_head.h"

#include "tessera/core/buffer.h"
#include "tessera/nn/block.h"

namespace tessera {

void LmHead::add_params(ParamBuffer& pb, size_t tied_weight) {
  if (s_.final_norm) lnf_.add_params(pb);
  lm_ = s_.tied ? tied_weight : pb.add("lm_head", {s_.V, s_.C}, true);
}

void LmHead::schedule_forward(StepSchedule& s) {
  fwd_ = s.add(Phase::Forward, "", {"ln_f", "logits", "cross-entropy"});
}

void LmHead::schedule_backward(StepSchedule& s) {
  bwd_ = s.add(Phase::Backward, "", {"cross-entropy", "lm_head dW", "lm_head dx", "ln_f + residual"});
}

void LmHead::declare(PlanBuilder& pb, DType dt) {
  const int64_t N = pb.N();
  const DType st = stat_dtype(dt);
  // ln_f's output and statistics: from the last block's residual op (the ln_f event itself is then empty).
  if (s_.final_norm) lnf_.declare(pb, dt, producer_ ? producer_->output_event() : fwd_, bwd_ + 1, bwd_ + 3);
  // The cross-entropy backward overwrites the logits with d_logits, in place.
  pb.add(logits_, "logits", dt, {N, s_.ld}, fwd_ + 1, bwd_ + 2);
  pb.add(losses_, "losses", st, {N}, fwd_ + 2, fwd_ + 2);
  pb.add(ce_lse_, "ce_lse", st, {N}, fwd_ + 2, bwd_);
  if (s_.final_norm) pb.add(d_lnf_, "d_lnf", dt, {N, s_.C}, bwd_ + 2, bwd_ + 3);
}

void LmHead::forward(const StepEnv& env, const Tensor& x) const {
  const int N = env.N(), C = s_.C;
  env.at(fwd_);
  if (s_.final_norm && !producer_) lnf_.forward(env, x);
  env.at(fwd_ + 1);
  const int64_t V0 = split(), Vt = s_.V - V0;
  const Tensor logits = rows(logits_, N, s_.ld), lnf = head_input(x, N);
  env.mm({.M = N, .N = static_cast<int>(V0), .K = C, .trans_b = true, .ldc = s_.ld}, logits, lnf, env.p(lm_, V0 * C),
         Tensor());
  if (Vt > 0)
    env.mm({.M = N, .N = static_cast<int>(Vt), .K = C, .trans_b = true, .ldc = s_.ld}, columns_from(logits, V0), lnf,
           env.p(lm_ + V0 * C, Vt * C), Tensor());
}

void LmHead::loss_forward(const StepEnv& env, const Tensor& targets, float label_smoothing,
                          std::optional<double> loss_grad_scale, const Tensor& loss_sum, const Tensor& count) const {
  const int N = env.N();
  const CrossEntropyParams cp = ce_params(env, label_smoothing);
  env.at(fwd_ + 2);
  if (loss_grad_scale)
    cross_entropy_forward_backward(cp, losses_.slice1d(0, N), ce_lse_.slice1d(0, N), logits(N), targets.slice1d(0, N),
                                   *loss_grad_scale, count, *env.ctx);
  else
    cross_entropy_forward(cp, losses_.slice1d(0, N), ce_lse_.slice1d(0, N), logits(N), targets.slice1d(0, N), *env.ctx);
  // loss = Σ losses / count of non-ignored targets, reduced on the device (no host loop, no sync).
  cross_entropy_loss_sum(cp, loss_sum, count, losses_.slice1d(0, N), targets.slice1d(0, N), *env.ctx);
}

void LmHead::backward(const StepEnv& env, const Tensor& d_res, const Tensor& x, const Tensor& targets,
                      float label_smoothing, double loss_scale, bool fused, const Tensor& count) const {
  const int N = env.N(), C = s_.C;
  const int64_t ld = s_.ld;
  // Without a final norm the dx GEMM writes the input's gradient straight into d_res.
  const Tensor logits = this->logits(N), lnf = head_input(x, N);
  const Tensor d_ln = s_.final_norm ? rows(d_lnf_, N, C) : rows(d_res, N, C);
  // In place: each element of the gradient needs only its own logit and the row's lse. The scale is
  // loss_scale / count, with the count read on the device (an all-ignored batch gives zero gradients).
  env.at(bwd_);
  if (!fused)
    cross_entropy_backward(ce_params(env, label_smoothing), logits, logits, ce_lse_.slice1d(0, N),
                           targets.slice1d(0, N), loss_scale, count, *env.ctx);
  // Split at V0 like the forward: an unaligned V as the output's row count runs on slower kernels too.
  env.at(bwd_ + 1);
  const int64_t V0 = split(), Vt = s_.V - V0;
  env.mm({.M = static_cast<int>(V0), .N = C, .K = N, .trans_a = true, .beta = 1.0f, .lda = ld}, env.g(lm_, V0 * C),
         logits, lnf, Tensor());
  if (Vt > 0)
    env.mm({.M = static_cast<int>(Vt), .N = C, .K = N, .trans_a = true, .beta = 1.0f, .lda = ld},
           env.g(lm_ + V0 * C, Vt * C), columns_from(logits, V0), lnf, Tensor());
  env.at(bwd_ + 2);
  env.mm({.M = N, .N = C, .K = static_cast<int>(V0), .lda = ld}, d_ln, logits, env.p(lm_, V0 * C), Tensor());
  if (Vt > 0)
    env.mm({.M = N, .N = C, .K = static_cast<int>(Vt), .beta = 1.0f, .lda = ld}, d_ln, columns_from(logits, V0),
           env.p(lm_ + V0 * C, Vt * C), Tensor());
  env.at(bwd_ + 3);
  if (!s_.final_norm) return;
  fill_bytes(d_res, 0, *env.ctx);
  // With the last block's final residual add backward along: its d_tmp and output bias.
  std::optional<NormResidualBackward> res;
  if (producer_) res = producer_->output_residual_backward(env);
  lnf_.backward(env, d_res, d_ln, x, res ? &*res : nullptr);
}

}  // namespace tessera
