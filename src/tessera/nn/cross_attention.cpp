#include "tessera/nn/cross_attention.h"

#include "tessera/core/error.h"

namespace tessera {

CrossAttention::CrossAttention(std::string prefix, const AttentionShape& s, CrossKvSource kv)
    : prefix_(std::move(prefix)), s_(s), source_(kv), q_(prefix_ + "q", s.C, int64_t{s.H} * s.Dh, s.bias),
      kv_(prefix_ + "kv", s.C, 2 * int64_t{s.Hkv} * s.Dh, s.bias),
      proj_(prefix_ + "proj", int64_t{s.H} * s.Dh, s.C, s.bias) {}

void CrossAttention::add_params(ParamBuffer& pb) {
  q_.add_params(pb);
  if (!batched()) kv_.add_params(pb);
  proj_.add_params(pb);
}

void CrossAttention::schedule_forward(StepSchedule& s, const std::string& group) {
  fwd_ = s.add(Phase::Forward, group, {"cross q", "cross kv", "cross attention", "cross proj"});
}

void CrossAttention::schedule_backward(StepSchedule& s, const std::string& group) {
  bwd_ = s.add(Phase::Backward, group,
               {"cross proj dW", "cross proj dx", "cross attention", "cross kv dW", "cross kv dx", "cross q dW",
                "cross q dx"});
}

void CrossAttention::declare_saved(PlanBuilder& pb, DType dt) {
  TS_CHECK(Tk_ > 0, "internal: cross-attention declared before its memory length");
  const int64_t N = pb.N(), Nk = pb.B() * Tk_;
  pb.add(q_out_, prefix_ + "q", dt, {N, q_.out()}, fwd_, bwd_ + 2);
  if (!batched()) pb.add(kv_out_, prefix_ + "kv", dt, {Nk, kv_.out()}, fwd_ + 1, bwd_ + 2);
  pb.add(att_, prefix_ + "att", dt, {N, proj_.in()}, fwd_ + 2, bwd_ + 2);
  pb.add(lse_, prefix_ + "lse", stat_dtype(dt), {N * s_.H}, fwd_ + 2, bwd_ + 2);
}

void CrossAttention::declare_temps(PlanBuilder& pb, DType dt) {
  const int64_t N = pb.N(), Nk = pb.B() * Tk_;
  pb.add(d_att_, prefix_ + "d_att", dt, {N, proj_.in()}, bwd_ + 1, bwd_ + 2);
  pb.add(d_q_, prefix_ + "d_q", dt, {N, q_.out()}, bwd_ + 2, bwd_ + 6);
  if (!batched()) pb.add(d_kv_, prefix_ + "d_kv", dt, {Nk, kv_.out()}, bwd_ + 2, bwd_ + 4);
}

AttentionParams CrossAttention::params(const StepEnv& env) const {
  return {.B = env.B,
          .T = env.T,
          .H = s_.H,
          .Dh = s_.Dh,
          .causal = false,
          .dropout = env.attn_dropout,
          .seed = env.seed,
          .stream = stream_probs_,
          .n_kv_heads = s_.Hkv,
          .Tq = env.T,
          .Tk = Tk_,
          .key_lens = key_lens_};
}

Tensor CrossAttention::heads(const Tensor& rows, int B, int T, int64_t width, int64_t col, int n_heads) const {
  char* base = static_cast<char*>(rows.data()) + col * static_cast<int64_t>(dtype_size(rows.dtype()));
  return Tensor::strided(base, rows.dtype(), {B, T, n_heads, s_.Dh}, {T * width, width, s_.Dh, 1}, rows.device());
}

void CrossAttention::forward(const StepEnv& env, const Tensor& x, const Tensor& y) const {
  const int B = env.B, Tq = env.T;
  const int64_t N = env.N(), Nk = int64_t{B} * Tk_, Wq = q_.out(), Wkv = kv_.out(), KV = int64_t{s_.Hkv} * s_.Dh;
  const Tensor q = rows(q_out_, N, Wq), att = rows(att_, N, proj_.in());
  env.at(fwd_);
  q_.forward(env, N, q, x, /*with_bias=*/true);
  env.at(fwd_ + 1);
  Tensor k, v;
  if (batched()) {
    k = heads(k_, B, Tk_, KV, 0, s_.Hkv);
    v = heads(v_, B, Tk_, KV, 0, s_.Hkv);
  } else {
    const Tensor kv = rows(kv_out_, Nk, Wkv);
    kv_.forward(env, Nk, kv, memory_, /*with_bias=*/true);
    k = heads(kv, B, Tk_, Wkv, 0, s_.Hkv);
    v = heads(kv, B, Tk_, Wkv, KV, s_.Hkv);
  }
  env.at(fwd_ + 2);
  attention_forward(params(env), heads(att, B, Tq, Wq, 0, s_.H), lse_.slice1d(0, N * s_.H),
                    heads(q, B, Tq, Wq, 0, s_.H), k, v, *env.ctx);
  env.at(fwd_ + 3);
  proj_.forward(env, N, y, att, /*with_bias=*/false);
}

void CrossAttention::backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x,
                              bool accumulate) const {
  const int B = env.B, Tq = env.T;
  const int64_t N = env.N(), Nk = int64_t{B} * Tk_, Wq = q_.out(), Wkv = kv_.out(), KV = int64_t{s_.Hkv} * s_.Dh;
  const Tensor q = rows(q_out_, N, Wq), att = rows(att_, N, proj_.in());
  const Tensor d_att = rows(d_att_, N, proj_.in()), d_q = rows(d_q_, N, Wq);
  // K, V and their gradients: this layer's slices of the batched projection, or the halves of its own kv rows.
  const Tensor kv = batched() ? Tensor() : rows(kv_out_, Nk, Wkv), d_kv = batched() ? Tensor() : rows(d_kv_, Nk, Wkv);
  const Tensor k = batched() ? heads(k_, B, Tk_, KV, 0, s_.Hkv) : heads(kv, B, Tk_, Wkv, 0, s_.Hkv);
  const Tensor v = batched() ? heads(v_, B, Tk_, KV, 0, s_.Hkv) : heads(kv, B, Tk_, Wkv, KV, s_.Hkv);
  const Tensor d_k = batched() ? heads(d_k_, B, Tk_, KV, 0, s_.Hkv) : heads(d_kv, B, Tk_, Wkv, 0, s_.Hkv);
  const Tensor d_v = batched() ? heads(d_v_, B, Tk_, KV, 0, s_.Hkv) : heads(d_kv, B, Tk_, Wkv, KV, s_.Hkv);
  env.at(bwd_);
  proj_.backward_weight(env, N, d_y, att, /*with_bias=*/false);
  env.at(bwd_ + 1);
  proj_.backward_input(env, N, d_att, d_y);
  env.at(bwd_ + 2);
  attention_backward(params(env), heads(d_q, B, Tq, Wq, 0, s_.H), d_k, d_v, heads(d_att, B, Tq, Wq, 0, s_.H),
                     heads(q, B, Tq, Wq, 0, s_.H), k, v, heads(att, B, Tq, Wq, 0, s_.H), lse_.slice1d(0, N * s_.H),
                     *env.ctx);
  if (!batched()) {
    env.at(bwd_ + 3);
    kv_.backward_weight(env, Nk, d_kv, memory_, /*with_bias=*/true);
    env.at(bwd_ + 4);
    kv_.backward_input(env, Nk, d_memory_, d_kv, /*accumulate=*/true);
  }
  env.at(bwd_ + 5);
  q_.backward_weight(env, N, d_q, x, /*with_bias=*/true);
  env.at(bwd_ + 6);
  q_.backward_input(env, N, d_x, d_q, accumulate);
}

}  // namespace tessera
