// tessera/nn/linear.h — y = x Wᵀ + b, with W (out, in) and b (out) in the model's ParamBuffer.
//
// x: (N, in), y: (N, out), row-major in the compute dtype. Backward: d_W += d_yᵀ x, d_b += Σ_rows d_y,
// d_x = d_y W (or += with accumulate). The bias may be applied elsewhere: a projection whose output goes into a
// residual add leaves it to that op (residual + Drop(y + b)), and the fc of an MLP to its activation; `with_bias`
// says whether the GEMM adds it (forward) and sums its gradient (backward_weight).
#pragma once
#include <cstdint>
#include <string>

#include "tessera/nn/step.h"

namespace tessera {

class Linear {
 public:
  // name: "h.0.qkv" gives the segments "h.0.qkv.w" (weight decay) and "h.0.qkv.b" (none).
  Linear(std::string name, int64_t in, int64_t out, bool bias)
      : name_(std::move(name)), in_(in), out_(out), bias_(bias) {}
  void add_params(ParamBuffer& pb);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  bool has_bias() const { return bias_; }
  size_t weight_offset() const { return w_; }
  Tensor w(const StepEnv& env) const { return env.p(w_, in_ * out_); }
  Tensor b(const StepEnv& env) const { return env.p(b_, out_); }  // undefined without a bias
  Tensor d_w(const StepEnv& env) const { return env.g(w_, in_ * out_); }
  Tensor d_b(const StepEnv& env) const { return env.g(b_, out_); }

  void forward(const StepEnv& env, int64_t N, const Tensor& y, const Tensor& x, bool with_bias) const;
  void backward_weight(const StepEnv& env, int64_t N, const Tensor& d_y, const Tensor& x, bool with_bias) const;
  void backward_input(const StepEnv& env, int64_t N, const Tensor& d_x, const Tensor& d_y,
                      bool accumulate = false) const;

 private:
  std::string name_;
  int64_t in_, out_;
  bool bias_;
  size_t w_ = kNoParam, b_ = kNoParam;
};

}  // namespace tessera
