// tessera/nn/cross_kv.h — the K and V of every cross-attention layer of a decoder, projected from the encoder's
// output in one op (ops/cross_kv, LightSeq's layer-batched encoder-decoder attention):
//
//   kv[2l] = m W_klᵀ + b_kl,  kv[2l + 1] = m W_vlᵀ + b_vl   for l < L, by ONE GEMM over the source tokens
//
// One parameter range holds every layer's weights, (2 L KV, C) rows [k_0 | v_0 | k_1 | v_1 | ...] (segment
// "<name>.w", bias "<name>.b"), so that layer l's k_proj and v_proj are rows of it. The decoder's CrossAttention
// layers (CrossKvSource::Batched) read their slices of kv and write dK and dV into their slices of one shared
// d_kv; the backward then gives d_W, d_b and the memory's gradient summed over every layer (overwritten).
// Buffers: kv (2L slices of (B*Tk, KV)), saved until the last cross-attention backward; the GEMM's output "proj"
// (B*Tk, 2 L KV) for the forward op alone; d_kv from the first cross-attention backward; d_proj in the backward.
#pragma once
#include <string>

#include "tessera/nn/step.h"
#include "tessera/ops/cross_kv/cross_kv.h"

namespace tessera {

class CrossKvProjection {
 public:
  // name "dec.cross_kv": segments "dec.cross_kv.w", "dec.cross_kv.b"; activations alike.
  CrossKvProjection(std::string name, int C, int L, int KV, bool bias)
      : name_(std::move(name)), C_(C), L_(L), KV_(KV), bias_(bias) {}
  void add_params(ParamBuffer& pb);
  size_t weight_offset() const { return w_; }
  size_t bias_offset() const { return b_; }
  int64_t width() const { return 2 * int64_t{L_} * KV_; }

  void schedule_forward(StepSchedule& s) { fwd_ = s.add(Phase::Forward, "", {"cross kv (all layers)"}); }
  void schedule_backward(StepSchedule& s) { bwd_ = s.add(Phase::Backward, "", {"cross kv (all layers)"}); }
  int forward_event() const { return fwd_; }
  int backward_event() const { return bwd_; }
  // pb: the source side's builder (N = B * Tk). kv_death: the last cross-attention backward that reads K and V;
  // d_kv_birth: the first that writes dK and dV.
  void declare(PlanBuilder& pb, DType dtype, int kv_death, int d_kv_birth);

  // Layer l's K and V, and the slices of their gradients, for Nk = B * Tk source tokens.
  Tensor k(int l, int64_t Nk) const { return slice(kv_, 2 * l, Nk); }
  Tensor v(int l, int64_t Nk) const { return slice(kv_, 2 * l + 1, Nk); }
  Tensor d_k(int l, int64_t Nk) const { return slice(d_kv_, 2 * l, Nk); }
  Tensor d_v(int l, int64_t Nk) const { return slice(d_kv_, 2 * l + 1, Nk); }

  // memory: the encoder's output (env.N(), C) of the source side's env.
  void forward(const StepEnv& env, const Tensor& memory) const;
  // d_memory = the memory's gradient from every layer (overwritten); d_W and d_b accumulated.
  void backward(const StepEnv& env, const Tensor& d_memory, const Tensor& memory) const;

 private:
  CrossKvParams params(const StepEnv& env) const;
  Tensor slice(const Tensor& t, int i, int64_t Nk) const;
  std::string name_;
  int C_, L_, KV_;
  bool bias_;
  size_t w_ = kNoParam, b_ = kNoParam;
  int fwd_ = -1, bwd_ = -1;
  int64_t planned_Nk_ = 0;  // the slices' stride is planned_Nk_ KV
  Tensor kv_, proj_, d_kv_, d_proj_;
};

}  // namespace tessera
