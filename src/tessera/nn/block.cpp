#include "tessera/nn/block.h"

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/nn/cross_attention.h"

namespace tessera {

Block::Block(std::string prefix, std::string group, const BlockShape& s)
    : prefix_(std::move(prefix)), group_(std::move(group)), s_(s) {
  AttentionShape self = s.attention;
  self.causal = s.kind != BlockKind::Encoder;
  auto stage = [&](const char* name, std::unique_ptr<Sublayer> sub) {
    const std::string norm = "ln" + std::to_string(stages_.size() + 1);
    stages_.push_back({.name = name,
                       .norm = Norm(prefix_ + norm, s.norm, s.attention.bias, s.attention.C, s.norm_eps),
                       .sub = std::move(sub),
                       .stream = 0,
                       .res_event = -1,
                       .norm_event = -1,
                       .norm_bwd_event = -1,
                       .mid = Tensor{}});
  };
  auto attn = std::make_unique<SelfAttention>(prefix_, self);
  self_ = attn.get();
  stage("attn", std::move(attn));
  if (s.kind == BlockKind::DecoderCross) {
    auto cross = std::make_unique<CrossAttention>(prefix_ + "cross.", s.attention, s.cross_kv);
    cross_ = cross.get();
    stage("cross", std::move(cross));
  }
  stage("mlp", std::make_unique<Mlp>(prefix_, s.mlp));
}

Block::~Block() = default;
Block::Block(Block&&) noexcept = default;

void Block::add_params(ParamBuffer& pb) {
  param_begin_ = pb.size();
  for (Stage& st : stages_) {
    // Pre-norm: a stage's norm comes before its sublayer, as it runs; post-norm: after.
    if (pre()) st.norm.add_params(pb);
    st.sub->add_params(pb);
    if (!pre()) st.norm.add_params(pb);
  }
  param_end_ = pb.size();
}

void Block::schedule_forward(StepSchedule& s) {
  const size_t S = stages_.size();
  if (pre()) stages_[0].norm_event = s.add(Phase::Forward, group_, {"ln1"});
  for (size_t k = 0; k < S; ++k) {
    Stage& st = stages_[k];
    st.sub->schedule_forward(s, group_);
    const std::string norm = !pre()      ? "ln" + std::to_string(k + 1)
                             : k + 1 < S ? "ln" + std::to_string(k + 2)
                                         : std::string("next norm");
    const std::string op = st.name + " residual + " + norm;
    st.res_event = s.add(Phase::Forward, group_, {op.c_str()});
  }
}

void Block::schedule_backward(StepSchedule& s) {
  bwd_ = s.end();
  for (size_t k = stages_.size(); k-- > 0;) {
    Stage& st = stages_[k];
    const std::string op = "ln" + std::to_string(k + 1) + " + residual";
    if (!pre()) st.norm_bwd_event = s.add(Phase::Backward, group_, {op.c_str()});
    st.sub->schedule_backward(s, group_);
    if (pre()) st.norm_bwd_event = s.add(Phase::Backward, group_, {op.c_str()});
  }
}

int Block::input_last_use() const { return pre() ? stages_.front().norm_bwd_event : stages_.front().sub->x_last_use(); }

int Block::first_grad_event() const {
  // The reader's norm backward sums the last projection's bias along with the residual's backward.
  return pre() && s_.mlp.bias ? bwd_ - 1 : bwd_;
}

void Block::declare(PlanBuilder& pb, DType dt, const std::string& out_name, int out_death) {
  const int64_t N = pb.N(), C = s_.attention.C;
  const size_t S = stages_.size();
  auto mid_name = [&](size_t k) { return prefix_ + (k == 1 ? std::string("mid") : "mid" + std::to_string(k)); };
  if (pre()) {
    TS_CHECK(next_norm_, "internal: a pre-norm block needs the norm that reads its output");
    for (size_t k = 0; k < S; ++k) {
      Stage& st = stages_[k];
      // Stage k's input norm: made by the add before it (the producer's for k = 0), or by its own op.
      const int birth = k > 0 ? stages_[k - 1].res_event : producer_ ? producer_->output_event() : st.norm_event;
      if (k > 0) pb.add(st.mid, mid_name(k), dt, {N, C}, birth, st.norm_bwd_event);
      st.norm.declare(pb, dt, birth, st.sub->x_last_use(), st.norm_bwd_event);
      st.sub->declare_saved(pb, dt);
    }
    pb.add(out_, out_name, dt, {N, C}, stages_.back().res_event, out_death);
    // d_tmp is born in the reader's norm backward, the event before this block's (the residual's backward).
    pb.add(d_tmp_, prefix_ + "d_tmp", dt, {N, C}, bwd_ - 1, stages_.front().sub->d_y_last_use());
    for (size_t k = S; k-- > 0;) {
      stages_[k].sub->declare_temps(pb, dt);
      if (k + 1 == S)
        pb.add(d_ln_, prefix_ + "d_ln", dt, {N, C}, stages_[k].sub->d_x_event(), stages_.front().norm_bwd_event);
    }
    return;
  }
  for (size_t k = 0; k < S; ++k) {
    Stage& st = stages_[k];
    st.sub->declare_saved(pb, dt);
    pb.add(st.mid, prefix_ + "sum" + std::to_string(k + 1), dt, {N, C}, st.res_event, st.norm_bwd_event);
    // x_{k+1} = Norm_k(...): read by the next stage (its sublayer's dW last), or by the block's reader.
    st.norm.declare(pb, dt, st.res_event, k + 1 < S ? stages_[k + 1].sub->x_last_use() : out_death, st.norm_bwd_event);
  }
  pb.add(d_tmp_, prefix_ + "d_tmp", dt, {N, C}, bwd_, stages_.front().sub->d_y_last_use());
  pb.add(d_ln_, prefix_ + "d_mid", dt, {N, C}, bwd_, stages_.front().sub->d_x_event());
  for (size_t k = S; k-- > 0;) stages_[k].sub->declare_temps(pb, dt);
}

Tensor Block::out(int64_t N) const { return pre() ? rows(out_, N, s_.attention.C) : stages_.back().norm.out(N); }

Tensor Block::stage_input(size_t k, const Tensor& x, int64_t N) const {
  if (k == 0) return x;
  return pre() ? rows(stages_[k].mid, N, s_.attention.C) : stages_[k - 1].norm.out(N);
}

void Block::draw_streams(RngState* rng, bool dropout_on, bool attn_dropout_on, bool act_dropout_on) {
  if (dropout_on)
    for (Stage& st : stages_) st.stream = rng->take();
  for (Stage& st : stages_) st.sub->draw_streams(rng, attn_dropout_on, act_dropout_on);
}

void Block::forward(const StepEnv& env, const Tensor& x, const Tensor& tmp) const {
  const int64_t N = env.N(), C = s_.attention.C;
  const size_t S = stages_.size();
  if (pre()) {
    // The first norm is made by the producer's last residual op; the event stays, empty.
    env.at(stages_[0].norm_event);
    if (!producer_) stages_[0].norm.forward(env, x);
  }
  for (size_t k = 0; k < S; ++k) {
    const Stage& st = stages_[k];
    const Tensor in = stage_input(k, x, N);
    st.sub->forward(env, pre() ? st.norm.out(N) : in, tmp);
    env.at(st.res_event);
    if (!pre()) {
      st.norm.residual_forward(env, st.stream, rows(st.mid, N, C), in, tmp, st.sub->output_bias(env));
      continue;
    }
    // x_{k+1} = x_k + Drop(y + b), and the norm that reads it: the next stage's, or the block reader's.
    const Norm& next = k + 1 < S ? stages_[k + 1].norm : *next_norm_;
    const Tensor sum = k + 1 < S ? rows(stages_[k + 1].mid, N, C) : rows(out_, N, C);
    next.residual_forward(env, st.stream, sum, in, tmp, st.sub->output_bias(env));
  }
}

NormResidualBackward Block::output_residual_backward(const StepEnv& env) const {
  const Stage& st = stages_.back();
  return {.p = residual_params(env, st),
          .d_y = rows(d_tmp_, env.N(), s_.attention.C),
          .d_bias = st.sub->d_output_bias(env)};
}

void Block::backward(const StepEnv& env, const Tensor& d_res, const Tensor& x) const {
  if (!pre()) return backward_post(env, d_res, x);
  const int64_t N = env.N(), C = s_.attention.C;
  const Tensor d_tmp = rows(d_tmp_, N, C), d_ln = rows(d_ln_, N, C);
  // d_tmp (d of the last sublayer's output) and its bias's gradient are in place: the reader's norm backward ran
  // this block's last residual add backward along.
  for (size_t k = stages_.size(); k-- > 0;) {
    const Stage& st = stages_[k];
    st.sub->backward(env, d_tmp, st.norm.out(N), d_ln, /*accumulate=*/false);
    // Norm_k's input is x_k = x_{k-1} + Drop(y_{k-1} + b_{k-1}): d_res += the norm's backward, then d_tmp =
    // Drop'(d_res) and d b_{k-1}, in one kernel on the GPU. Stage 0's input is the producer's output, whose add
    // comes along the same way (none for the embedding's: its dropout is the embedding backward's).
    env.at(st.norm_bwd_event);
    std::optional<NormResidualBackward> below;
    if (k > 0)
      below = NormResidualBackward{.p = residual_params(env, stages_[k - 1]),
                                   .d_y = d_tmp,
                                   .d_bias = stages_[k - 1].sub->d_output_bias(env)};
    else if (producer_) below = producer_->output_residual_backward(env);
    st.norm.backward(env, d_res, d_ln, stage_input(k, x, N), below ? &*below : nullptr);
  }
}

void Block::backward_post(const StepEnv& env, const Tensor& d_res, const Tensor& x) const {
  const int64_t N = env.N(), C = s_.attention.C;
  const Tensor d_tmp = rows(d_tmp_, N, C), d_mid = rows(d_ln_, N, C);
  const size_t bytes = static_cast<size_t>(N * C) * dtype_size(env.dtype);
  for (size_t k = stages_.size(); k-- > 0;) {
    const Stage& st = stages_[k];
    // x_{k+1} = Norm(s), s = x_k + Drop(y + b): d s = Norm'(d x_{k+1}) (d_mid from zero), d_tmp = Drop'(d s) and
    // d b; then d x_k = d s + sub'(d_tmp), into d_res for the stage below.
    env.at(st.norm_bwd_event);
    fill_bytes(d_mid, 0, *env.ctx);
    const NormResidualBackward res{.p = residual_params(env, st), .d_y = d_tmp, .d_bias = st.sub->d_output_bias(env)};
    st.norm.backward(env, d_mid, d_res, rows(st.mid, N, C), &res);
    st.sub->backward(env, d_tmp, stage_input(k, x, N), d_mid, /*accumulate=*/true);
    copy_bytes(d_res.data(), d_res.device(), d_mid.data(), d_mid.device(), bytes, *env.ctx);
  }
}

}  // namespace tessera
