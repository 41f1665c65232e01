#include "tessera/nn/mlp.h"

#include "tessera/core/error.h"

namespace tessera {

Mlp::Mlp(std::string prefix, const MlpShape& s)
    : prefix_(std::move(prefix)), s_(s),
      fc_(prefix_ + "fc", s.C, s.kind == Activation::Swiglu ? 2 * int64_t{s.F} : s.F, s.bias),
      fcp_(prefix_ + "fcp", s.F, s.C, s.bias) {}

void Mlp::add_params(ParamBuffer& pb) {
  fc_.add_params(pb);
  fcp_.add_params(pb);
}

void Mlp::schedule_forward(StepSchedule& s, const std::string& group) {
  fwd_ = s.add(Phase::Forward, group, {"fc", "activation", "fc proj"});
}

void Mlp::schedule_backward(StepSchedule& s, const std::string& group) {
  bwd_ = s.add(Phase::Backward, group, {"fc proj dW", "fc proj dx", "activation", "fc dW", "fc dx"});
}

void Mlp::declare_saved(PlanBuilder& pb, DType dt) {
  const int64_t N = pb.N();
  pb.add(fc_pre_, prefix_ + "fc_pre", dt, {N, F_in()}, fwd_, bwd_ + 2);
  pb.add(fc_act_, prefix_ + "fc_act", dt, {N, s_.F}, s_.fused_gelu ? fwd_ : fwd_ + 1, bwd_);
}

void Mlp::declare_temps(PlanBuilder& pb, DType dt) {
  const int64_t N = pb.N();
  if (!s_.fused_gelu) pb.add(d_fc_act_, prefix_ + "d_fc_act", dt, {N, s_.F}, bwd_ + 1, bwd_ + 2);
  pb.add(d_fc_pre_, prefix_ + "d_fc_pre", dt, {N, F_in()}, s_.fused_gelu ? bwd_ + 1 : bwd_ + 2, bwd_ + 4);
}

void Mlp::forward(const StepEnv& env, const Tensor& x, const Tensor& y) const {
  const int N = env.N(), F = s_.F;
  const Tensor fc_pre = rows(fc_pre_, N, F_in()), fc_act = rows(fc_act_, N, F);
  env.at(fwd_);
  TS_CHECK(!s_.fused_gelu || env.act_dropout == 0.0f, "internal: activation dropout with the fused GELU");
  if (s_.fused_gelu) {
    // fc_pre = x W1ᵀ + b1 and fc_act = gelu(fc_pre) from one GEMM (cuBLASLt's GELU epilogue).
    gemm_gelu_forward({.M = N, .N = F, .K = s_.C, .trans_b = true}, fc_act, fc_pre, x, fc_.w(env), fc_.b(env),
                      *env.ctx);
  } else {
    fc_.forward(env, N, fc_pre, x, /*with_bias=*/false);
    env.at(fwd_ + 1);
    activation_forward(act_params(env), fc_act, fc_pre, fc_.b(env), *env.ctx);
  }
  env.at(fwd_ + 2);
  fcp_.forward(env, N, y, fc_act, /*with_bias=*/false);
}

void Mlp::backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x, bool accumulate) const {
  const int N = env.N(), F = s_.F;
  const Tensor fc_act = rows(fc_act_, N, F), fc_pre = rows(fc_pre_, N, F_in());
  const Tensor d_fc_pre = rows(d_fc_pre_, N, F_in());
  env.at(bwd_);
  fcp_.backward_weight(env, N, d_y, fc_act, /*with_bias=*/false);
  env.at(bwd_ + 1);
  if (s_.fused_gelu) {
    // d_fc_pre = (d_y W2) ⊙ gelu'(fc_pre): the product into d_fc_pre, then the GELU gradient in place (fc_pre
    // holds the bias; b1's gradient summed on the way).
    fcp_.backward_input(env, N, d_fc_pre, d_y);
    env.at(bwd_ + 2);
    activation_backward({.N = N, .d_ff = F, .kind = s_.kind}, d_fc_pre, fc_.d_b(env), d_fc_pre, fc_pre, Tensor(),
                        *env.ctx);
  } else {
    const Tensor d_fc_act = rows(d_fc_act_, N, F);
    fcp_.backward_input(env, N, d_fc_act, d_y);
    env.at(bwd_ + 2);
    activation_backward(act_params(env), d_fc_pre, fc_.d_b(env), d_fc_act, fc_pre, fc_.b(env), *env.ctx);
  }
  env.at(bwd_ + 3);
  fc_.backward_weight(env, N, d_fc_pre, x, /*with_bias=*/false);
  env.at(bwd_ + 4);
  fc_.backward_input(env, N, d_x, d_fc_pre, accumulate);
}

}  // namespace tessera
