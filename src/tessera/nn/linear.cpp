#include "tessera/nn/linear.h"

namespace tessera {

void Linear::add_params(ParamBuffer& pb) {
  w_ = pb.add(name_ + ".w", {out_, in_}, true);
  b_ = bias_ ? pb.add(name_ + ".b", {out_}, false) : kNoParam;
}

void Linear::forward(const StepEnv& env, int64_t N, const Tensor& y, const Tensor& x, bool with_bias) const {
  env.mm({.M = static_cast<int>(N), .N = static_cast<int>(out_), .K = static_cast<int>(in_), .trans_b = true}, y, x,
         w(env), with_bias ? b(env) : Tensor());
}

void Linear::backward_weight(const StepEnv& env, int64_t N, const Tensor& d_y, const Tensor& x, bool with_bias) const {
  env.mm({.M = static_cast<int>(out_),
          .N = static_cast<int>(in_),
          .K = static_cast<int>(N),
          .trans_a = true,
          .beta = 1.0f},
         d_w(env), d_y, x, Tensor());
  if (with_bias && bias_) bias_grad({.M = static_cast<int>(N), .N = static_cast<int>(out_)}, d_b(env), d_y, *env.ctx);
}

void Linear::backward_input(const StepEnv& env, int64_t N, const Tensor& d_x, const Tensor& d_y,
                            bool accumulate) const {
  env.mm({.M = static_cast<int>(N),
          .N = static_cast<int>(in_),
          .K = static_cast<int>(out_),
          .beta = accumulate ? 1.0f : 0.0f},
         d_x, d_y, w(env), Tensor());
}

}  // namespace tessera
