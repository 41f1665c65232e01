#include "tessera/nn/norm.h"

namespace tessera {

void Norm::add_params(ParamBuffer& pb) {
  w_ = pb.add(name_ + ".w", {C_}, false);
  b_ = bias_ ? pb.add(name_ + ".b", {C_}, false) : kNoParam;
}

void Norm::declare(PlanBuilder& pb, DType dt, int birth, int out_death, int stats_death) {
  const DType st = stat_dtype(dt);
  pb.add(out_, name_, dt, {pb.N(), C_}, birth, out_death);
  if (layernorm()) pb.add(mean_, name_ + ".mean", st, {pb.N()}, birth, stats_death);
  pb.add(rstd_, name_ + ".rstd", st, {pb.N()}, birth, stats_death);
}

void Norm::forward(const StepEnv& env, const Tensor& x) const {
  const int N = env.N();
  if (layernorm())
    layernorm_forward(params(env), out(N), mean_.slice1d(0, N), rstd_.slice1d(0, N), x, w(env), b(env), *env.ctx);
  else rmsnorm_forward(params(env), out(N), rstd_.slice1d(0, N), x, w(env), *env.ctx);
}

void Norm::residual_forward(const StepEnv& env, uint64_t stream, const Tensor& mid, const Tensor& residual,
                            const Tensor& y, const Tensor& bias) const {
  const int N = env.N();
  norm_residual_forward(params(env), layernorm(),
                        {.N = N, .C = C_, .dropout = env.dropout, .seed = env.seed, .stream = stream}, mid, out(N),
                        layernorm() ? mean_.slice1d(0, N) : Tensor(), rstd_.slice1d(0, N), residual, y, bias, w(env),
                        layernorm() ? b(env) : Tensor(), *env.ctx);
}

void Norm::backward(const StepEnv& env, const Tensor& d_x, const Tensor& d_out, const Tensor& x,
                    const NormResidualBackward* res) const {
  const int N = env.N();
  const Tensor d_w = env.g(w_, C_), d_b = env.g(b_, C_);
  if (res)
    norm_residual_backward(params(env), layernorm(), d_x, d_w, layernorm() ? d_b : Tensor(), d_out, x, w(env),
                           layernorm() ? mean_.slice1d(0, N) : Tensor(), rstd_.slice1d(0, N), *res, *env.ctx);
  else if (layernorm())
    layernorm_backward(params(env), d_x, d_w, d_b, d_out, x, w(env), mean_.slice1d(0, N), rstd_.slice1d(0, N),
                       *env.ctx);
  else rmsnorm_backward(params(env), d_x, d_w, d_out, x, w(env), rstd_.slice1d(0, N), *env.ctx);
}

}  // namespace tessera
