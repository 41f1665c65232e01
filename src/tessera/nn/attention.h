// tessera/nn/attention.h — multi-head self-attention with grouped KV heads (ops/attention):
//
//   qkv = x Wqkvᵀ + bqkv   (N, (H + 2 Hkv) Dh): [q | k | v], H query heads and Hkv key/value heads (Hkv
//                          dividing H: each key/value head serves H / Hkv query heads; the packed fast path)
//   att = softmax(Q Kᵀ / sqrt(Dh), causal) V   (N, H Dh), RoPE on q and k inside the op when rope_theta > 0
//   y   = att Woᵀ          (N, C), the bias bo added by the residual op that follows
//
// Saved: qkv, att, lse (B, H, T). Temporaries of the backward: d_att, d_qkv.
#pragma once
#include <string>

#include "tessera/nn/linear.h"
#include "tessera/nn/sublayer.h"
#include "tessera/ops/attention/attention.h"

namespace tessera {

struct AttentionShape {
  int C = 0, H = 0, Hkv = 0, Dh = 0;
  bool bias = true;
  bool causal = true;
  float rope_theta = 0.0f;  // 0: no RoPE
};

class SelfAttention final : public Sublayer {
 public:
  // prefix "h.0.": segments "h.0.qkv.w", "h.0.proj.w" (and biases), activations "h.0.qkv", "h.0.att", ...
  SelfAttention(std::string prefix, const AttentionShape& s);
  void add_params(ParamBuffer& pb) override;
  void schedule_forward(StepSchedule& s, const std::string& group) override;
  void schedule_backward(StepSchedule& s, const std::string& group) override;
  void declare_saved(PlanBuilder& pb, DType dtype) override;
  void declare_temps(PlanBuilder& pb, DType dtype) override;
  void draw_streams(RngState* rng, bool attn_dropout_on, bool /*act_dropout_on*/) override {
    if (attn_dropout_on) stream_probs_ = rng->take();
  }
  // Each step's key lengths ((B) int32 on the device: keys t >= key_lens[b] of sequence b are masked, an encoder's
  // source padding); undefined: all T keys.
  void set_key_lens(const Tensor& key_lens) { key_lens_ = key_lens; }
  void forward(const StepEnv& env, const Tensor& x, const Tensor& y) const override;
  void backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x,
                bool accumulate) const override;
  Tensor output_bias(const StepEnv& env) const override { return proj_.b(env); }
  Tensor d_output_bias(const StepEnv& env) const override { return proj_.d_b(env); }
  int backward_begin() const override { return bwd_; }
  int x_last_use() const override { return bwd_ + 3; }    // qkv dW
  int d_y_last_use() const override { return bwd_ + 1; }  // attn proj dx
  int d_x_event() const override { return bwd_ + 4; }     // qkv dx
  int num_backward_ops() const override { return 5; }
  // The attention op's call for this step: its shape, causal, dropout with this layer's stream, RoPE.
  AttentionParams params(const StepEnv& env) const;

 private:
  std::string prefix_;
  AttentionShape s_;
  Linear qkv_, proj_;
  int fwd_ = -1, bwd_ = -1;
  uint64_t stream_probs_ = 0;
  Tensor key_lens_;
  Tensor qkv_out_, att_, lse_, d_att_, d_qkv_;
};

}  // namespace tessera
