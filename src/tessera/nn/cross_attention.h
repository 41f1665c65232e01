// tessera/nn/cross_attention.h — multi-head attention from a decoder's stream over an encoder's output:
//
//   q  = x Wqᵀ + bq          (B*Tq, H Dh), x the decoder's normed stream
//   kv = m Wkvᵀ + bkv        (B*Tk, 2 Hkv Dh) = [k | v], m the encoder's output (the memory)
//   att = softmax(Q Kᵀ / sqrt(Dh)) V   not causal; keys j >= key_lens[b] masked when key lengths are given
//   y  = att Woᵀ             (B*Tq, C), the bias bo added by the residual op that follows
//
// The attention op's general entry takes Q, K and V as strided (B, T, heads, Dh) views, so k and v are read in
// place from the kv projection's rows. Backward: d_x from the q projection; the memory's gradient is ADDED to the
// d_memory the model gives (every decoder block adds its share). Saved: q, kv, att, lse (B, H, Tq);
// temporaries: d_att, d_q, d_kv.
//
// With CrossKvSource::Batched the layer has no kv projection of its own: K and V are this layer's slices of the one
// projection of the encoder's output for every decoder layer (CrossKvProjection, nn/cross_kv.h), each (B*Tk, Hkv Dh)
// contiguous, and the backward writes dK and dV into that projection's shared gradient slices (overwritten), whose
// one backward gives the weight, bias and memory gradients of every layer. The "cross kv" events are then empty.
#pragma once
#include <string>

#include "tessera/nn/attention.h"
#include "tessera/nn/kinds.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/sublayer.h"

namespace tessera {

class CrossAttention final : public Sublayer {
 public:
  // prefix "dec.0.cross.": segments "dec.0.cross.q.w", ".kv.w", ".proj.w" (and biases), activations alike.
  CrossAttention(std::string prefix, const AttentionShape& s, CrossKvSource kv = CrossKvSource::Own);
  // The memory's length Tk (before declaring), and each step's memory (B*Tk, C), its gradient (added to) and
  // optional key lengths ((B) int32 on the device; undefined: all Tk keys).
  void set_memory_length(int Tk) { Tk_ = Tk; }
  void set_memory(const Tensor& memory, const Tensor& d_memory, const Tensor& key_lens = Tensor()) {
    memory_ = memory;
    d_memory_ = d_memory;
    key_lens_ = key_lens;
  }
  // Batched: this step's K, V (B*Tk, Hkv Dh) and the slices their gradients go to.
  void set_batched_kv(const Tensor& k, const Tensor& v, const Tensor& d_k, const Tensor& d_v) {
    k_ = k;
    v_ = v;
    d_k_ = d_k;
    d_v_ = d_v;
  }
  // The event whose attention backward writes dK and dV (a batched projection's d_kv is born at the first).
  int attention_backward_event() const { return bwd_ + 2; }
  void add_params(ParamBuffer& pb) override;
  void schedule_forward(StepSchedule& s, const std::string& group) override;
  void schedule_backward(StepSchedule& s, const std::string& group) override;
  void declare_saved(PlanBuilder& pb, DType dtype) override;
  void declare_temps(PlanBuilder& pb, DType dtype) override;
  void draw_streams(RngState* rng, bool attn_dropout_on, bool /*act_dropout_on*/) override {
    if (attn_dropout_on) stream_probs_ = rng->take();
  }
  void forward(const StepEnv& env, const Tensor& x, const Tensor& y) const override;
  void backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x,
                bool accumulate) const override;
  Tensor output_bias(const StepEnv& env) const override { return proj_.b(env); }
  Tensor d_output_bias(const StepEnv& env) const override { return proj_.d_b(env); }
  int backward_begin() const override { return bwd_; }
  int x_last_use() const override { return bwd_ + 5; }    // q dW
  int d_y_last_use() const override { return bwd_ + 1; }  // proj dx
  int d_x_event() const override { return bwd_ + 6; }     // q dx
  int num_backward_ops() const override { return 7; }
  AttentionParams params(const StepEnv& env) const;

 private:
  // (B, T, heads, Dh) views of row-major (B*T, width) rows, starting at column `col`.
  Tensor heads(const Tensor& rows, int B, int T, int64_t width, int64_t col, int n_heads) const;
  bool batched() const { return source_ == CrossKvSource::Batched; }
  std::string prefix_;
  AttentionShape s_;
  CrossKvSource source_;
  Linear q_, kv_, proj_;
  int Tk_ = 0;
  int fwd_ = -1, bwd_ = -1;
  uint64_t stream_probs_ = 0;
  Tensor memory_, d_memory_, key_lens_;
  Tensor k_, v_, d_k_, d_v_;  // batched: this step's slices
  Tensor q_out_, kv_out_, att_, lse_, d_att_, d_q_, d_kv_;
};

}  // namespace tessera
