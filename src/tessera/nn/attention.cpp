#include "tessera/nn/attention.h"

namespace tessera {

SelfAttention::SelfAttention(std::string prefix, const AttentionShape& s)
    : prefix_(std::move(prefix)), s_(s), qkv_(prefix_ + "qkv", s.C, int64_t{s.H + 2 * s.Hkv} * s.Dh, s.bias),
      proj_(prefix_ + "proj", int64_t{s.H} * s.Dh, s.C, s.bias) {}

void SelfAttention::add_params(ParamBuffer& pb) {
  qkv_.add_params(pb);
  proj_.add_params(pb);
}

void SelfAttention::schedule_forward(StepSchedule& s, const std::string& group) {
  fwd_ = s.add(Phase::Forward, group, {"qkv", "attention", "attn proj"});
}

void SelfAttention::schedule_backward(StepSchedule& s, const std::string& group) {
  bwd_ = s.add(Phase::Backward, group, {"attn proj dW", "attn proj dx", "attention", "qkv dW", "qkv dx"});
}

void SelfAttention::declare_saved(PlanBuilder& pb, DType dt) {
  const int64_t N = pb.N();
  pb.add(qkv_out_, prefix_ + "qkv", dt, {N, qkv_.out()}, fwd_, bwd_ + 2);
  pb.add(att_, prefix_ + "att", dt, {N, proj_.in()}, fwd_ + 1, bwd_ + 2);
  pb.add(lse_, prefix_ + "lse", stat_dtype(dt), {N * s_.H}, fwd_ + 1, bwd_ + 2);
}

void SelfAttention::declare_temps(PlanBuilder& pb, DType dt) {
  const int64_t N = pb.N();
  pb.add(d_att_, prefix_ + "d_att", dt, {N, proj_.in()}, bwd_ + 1, bwd_ + 2);
  pb.add(d_qkv_, prefix_ + "d_qkv", dt, {N, qkv_.out()}, bwd_ + 2, bwd_ + 4);
}

AttentionParams SelfAttention::params(const StepEnv& env) const {
  // RoPE rides with the attention op: q and k rotated on the way in, dQ and dK rotated back as they are stored.
  return {.B = env.B,
          .T = env.T,
          .H = s_.H,
          .Dh = s_.Dh,
          .causal = s_.causal,
          .dropout = env.attn_dropout,
          .seed = env.seed,
          .stream = stream_probs_,
          .rope_theta = s_.rope_theta,
          .n_kv_heads = s_.Hkv,
          .key_lens = key_lens_};
}

void SelfAttention::forward(const StepEnv& env, const Tensor& x, const Tensor& y) const {
  const int64_t N = env.N();
  const Tensor qkv = rows(qkv_out_, N, qkv_.out()), att = rows(att_, N, proj_.in());
  env.at(fwd_);
  qkv_.forward(env, N, qkv, x, /*with_bias=*/true);
  env.at(fwd_ + 1);
  attention_forward(params(env), att, lse_.slice1d(0, N * s_.H), qkv, *env.ctx);
  env.at(fwd_ + 2);
  proj_.forward(env, N, y, att, /*with_bias=*/false);
}

void SelfAttention::backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x,
                             bool accumulate) const {
  const int64_t N = env.N();
  const Tensor qkv = rows(qkv_out_, N, qkv_.out()), att = rows(att_, N, proj_.in());
  const Tensor d_att = rows(d_att_, N, proj_.in()), d_qkv = rows(d_qkv_, N, qkv_.out());
  env.at(bwd_);
  proj_.backward_weight(env, N, d_y, att, /*with_bias=*/false);
  env.at(bwd_ + 1);
  proj_.backward_input(env, N, d_att, d_y);
  env.at(bwd_ + 2);
  attention_backward(params(env), d_qkv, d_att, qkv, att, lse_.slice1d(0, N * s_.H), *env.ctx);
  env.at(bwd_ + 3);
  qkv_.backward_weight(env, N, d_qkv, x, /*with_bias=*/true);
  env.at(bwd_ + 4);
  qkv_.backward_input(env, N, d_x, d_qkv, accumulate);
}

}  // namespace tessera
