// tessera/nn/norm.h — a LayerNorm or RMSNorm over the model width, with its output and statistics.
//
// out = norm(x) (ops/norm/norm.h): x, out (N, C) in the compute dtype; mean (LayerNorm only) and rstd (N) in the
// stat dtype, saved for the backward. w (C) and, for a LayerNorm with biases, b (C) in the ParamBuffer, without
// weight decay. The norm often reads the output of a residual add, and then runs fused with it: the forward
// computes mid = residual + Drop(y + bias) and out = norm(mid) in one op (residual_forward), and the backward
// runs the add's backward along (NormResidualBackward) — the cross-block fusion of a pre-norm transformer, where
// layer l's last residual add computes layer l+1's first norm.
#pragma once
#include <string>

#include "tessera/nn/kinds.h"
#include "tessera/nn/step.h"
#include "tessera/ops/norm/norm.h"

namespace tessera {

class Norm {
 public:
  // name: "h.0.ln1": segments "h.0.ln1.w" (and ".b"), activations "h.0.ln1", "h.0.ln1.mean", "h.0.ln1.rstd".
  Norm(std::string name, NormKind kind, bool bias, int C, float eps)
      : name_(std::move(name)), kind_(kind), bias_(kind == NormKind::LayerNorm && bias), C_(C), eps_(eps) {}
  void add_params(ParamBuffer& pb);
  size_t weight_offset() const { return w_; }
  bool layernorm() const { return kind_ == NormKind::LayerNorm; }

  // The output and its statistics (RMSNorm keeps no mean): born at `birth`; out read last at `out_death`, the
  // statistics at `stats_death` (the norm's backward).
  void declare(PlanBuilder& pb, DType dtype, int birth, int out_death, int stats_death);
  Tensor out(int64_t N) const { return rows(out_, N, C_); }

  void forward(const StepEnv& env, const Tensor& x) const;
  // mid = residual + Drop(y + bias) under dropout stream `stream`, and out = norm(mid) (bias undefined: none).
  void residual_forward(const StepEnv& env, uint64_t stream, const Tensor& mid, const Tensor& residual, const Tensor& y,
                        const Tensor& bias) const;
  // d_x += norm'(d_out) (x: the forward's input), d_w and d_b accumulated; with `res`, the backward of the residual
  // add that made x comes along (d_y = Drop'(d_x), d_bias += Σ d_y).
  void backward(const StepEnv& env, const Tensor& d_x, const Tensor& d_out, const Tensor& x,
                const NormResidualBackward* res = nullptr) const;

 private:
  NormParams params(const StepEnv& env) const { return {.N = env.N(), .C = C_, .eps = eps_}; }
  Tensor w(const StepEnv& env) const { return env.p(w_, C_); }
  Tensor b(const StepEnv& env) const { return env.p(b_, C_); }
  std::string name_;
  NormKind kind_;
  bool bias_;
  int C_;
  float eps_;
  size_t w_ = kNoParam, b_ = kNoParam;
  Tensor out_, mean_, rstd_;
};

}  // namespace tessera
