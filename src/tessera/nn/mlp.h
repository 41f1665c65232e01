// tessera/nn/mlp.h — the feed-forward sublayer, GELU / ReLU or SwiGLU:
//
//   fc_pre = x W1ᵀ (N, F_in),  fc_act = act(fc_pre + b1) (N, F),  y = fc_act W2ᵀ (N, C), b2 added by the residual op
//
// F_in = F, or 2F for SwiGLU ([gate | up], act = silu(gate) * up). With `fused_gelu` (GELU with biases in bf16 /
// f16, the GPU's dtypes) the fc GEMM adds b1 and applies the GELU in its epilogue (gemm_gelu_forward): fc_pre
// then holds the bias, there is no activation op in the forward, and the backward writes d_fc_act straight into
// d_fc_pre and turns it into the GELU's gradient in place (no d_fc_act buffer). Activation dropout (the step's
// act_dropout > 0, not with fused_gelu): fc_act = Drop(act(fc_pre + b1)), inside the activation op.
#pragma once
#include <string>

#include "tessera/nn/linear.h"
#include "tessera/nn/sublayer.h"
#include "tessera/ops/activation/activation.h"

namespace tessera {

struct MlpShape {
  int C = 0, F = 0;
  Activation kind = Activation::Gelu;
  bool bias = true;
  bool fused_gelu = false;
};

class Mlp final : public Sublayer {
 public:
  // prefix "h.0.": segments "h.0.fc.w", "h.0.fcp.w" (and biases), activations "h.0.fc_pre", "h.0.fc_act", ...
  Mlp(std::string prefix, const MlpShape& s);
  void add_params(ParamBuffer& pb) override;
  void schedule_forward(StepSchedule& s, const std::string& group) override;
  void schedule_backward(StepSchedule& s, const std::string& group) override;
  void declare_saved(PlanBuilder& pb, DType dtype) override;
  void declare_temps(PlanBuilder& pb, DType dtype) override;
  void draw_streams(RngState* rng, bool /*attn_dropout_on*/, bool act_dropout_on) override {
    stream_act_ = act_dropout_on ? rng->take() : 0;
  }
  void forward(const StepEnv& env, const Tensor& x, const Tensor& y) const override;
  void backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x,
                bool accumulate) const override;
  Tensor output_bias(const StepEnv& env) const override { return fcp_.b(env); }
  Tensor d_output_bias(const StepEnv& env) const override { return fcp_.d_b(env); }
  int backward_begin() const override { return bwd_; }
  int x_last_use() const override { return bwd_ + 3; }    // fc dW
  int d_y_last_use() const override { return bwd_ + 1; }  // fc proj dx
  int d_x_event() const override { return bwd_ + 4; }     // fc dx
  int num_backward_ops() const override { return 5; }

 private:
  int64_t F_in() const { return fc_.out(); }
  ActivationParams act_params(const StepEnv& env) const {
    return {.N = env.N(),
            .d_ff = s_.F,
            .kind = s_.kind,
            .dropout = env.act_dropout,
            .seed = env.seed,
            .stream = stream_act_};
  }
  std::string prefix_;
  MlpShape s_;
  Linear fc_, fcp_;
  int fwd_ = -1, bwd_ = -1;
  uint64_t stream_act_ = 0;
  Tensor fc_pre_, fc_act_, d_fc_act_, d_fc_pre_;
};

}  // namespace tessera
