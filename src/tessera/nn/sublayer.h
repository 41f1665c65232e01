// tessera/nn/sublayer.h — the part of a transformer block between its norm and its residual add: self-attention,
// cross-attention or an MLP (Block runs them; attention.h, mlp.h).
//
// A sublayer maps the normed stream x (N, C) to y (N, C) without its output bias: the bias of its last
// projection is added by the residual op that follows (residual + Drop(y + bias)), whose backward also sums its
// gradient. Its backward takes d_y and writes (or adds to) d_x.
#pragma once
#include "tessera/core/philox.h"
#include "tessera/nn/step.h"

namespace tessera {

class Sublayer {
 public:
  virtual ~Sublayer() = default;
  virtual void add_params(ParamBuffer& pb) = 0;
  virtual void schedule_forward(StepSchedule& s, const std::string& group) = 0;
  virtual void schedule_backward(StepSchedule& s, const std::string& group) = 0;
  // The buffers kept for the backward, and the gradient temporaries of the backward.
  virtual void declare_saved(PlanBuilder& pb, DType dtype) = 0;
  virtual void declare_temps(PlanBuilder& pb, DType dtype) = 0;
  // Takes this step's dropout streams from `rng`: attention dropout on the probabilities, activation dropout on
  // an MLP's activation.
  virtual void draw_streams(RngState* rng, bool attn_dropout_on, bool act_dropout_on) {}
  virtual void forward(const StepEnv& env, const Tensor& x, const Tensor& y) const = 0;
  // Adds the parameters' gradients; d_x = (or +=, with accumulate) the gradient of x.
  virtual void backward(const StepEnv& env, const Tensor& d_y, const Tensor& x, const Tensor& d_x,
                        bool accumulate) const = 0;
  // The bias the residual add applies (undefined: none), and its gradient.
  virtual Tensor output_bias(const StepEnv& env) const = 0;
  virtual Tensor d_output_bias(const StepEnv& env) const = 0;
  // Events: the first of the backward, the last that reads x (its dW), the last that reads d_y, the one that
  // writes d_x.
  virtual int backward_begin() const = 0;
  virtual int x_last_use() const = 0;
  virtual int d_y_last_use() const = 0;
  virtual int d_x_event() const = 0;
  virtual int num_backward_ops() const = 0;
};

}  // namespace tessera
