#include "tessera/nn/cross_kv.h"

namespace tessera {

void CrossKvProjection::add_params(ParamBuffer& pb) {
  w_ = pb.add(name_ + ".w", {width(), C_}, true);
  b_ = bias_ ? pb.add(name_ + ".b", {width()}, false) : kNoParam;
}

void CrossKvProjection::declare(PlanBuilder& pb, DType dt, int kv_death, int d_kv_birth) {
  planned_Nk_ = pb.N();
  const int64_t slices = 2 * int64_t{L_} * planned_Nk_ * KV_;
  pb.add(kv_, name_, dt, {slices}, fwd_, kv_death);
  pb.add(proj_, name_ + ".proj", dt, {planned_Nk_, width()}, fwd_, fwd_);
  pb.add(d_kv_, name_ + ".d_kv", dt, {slices}, d_kv_birth, bwd_);
  pb.add(d_proj_, name_ + ".d_proj", dt, {planned_Nk_, width()}, bwd_, bwd_);
}

CrossKvParams CrossKvProjection::params(const StepEnv& env) const {
  // Exact f32 GEMMs where the model is f32, as StepEnv::mm runs every other projection.
  return {.Nk = env.N(), .C = C_, .L = L_, .KV = KV_, .slice_stride = planned_Nk_ * KV_, .allow_tf32 = false};
}

Tensor CrossKvProjection::slice(const Tensor& t, int i, int64_t Nk) const {
  char* base = static_cast<char*>(t.data()) + i * planned_Nk_ * KV_ * static_cast<int64_t>(dtype_size(t.dtype()));
  return Tensor::from_shape(base, t.dtype(), std::initializer_list<int64_t>{Nk, KV_}, t.device());
}

void CrossKvProjection::forward(const StepEnv& env, const Tensor& memory) const {
  const CrossKvParams p = params(env);
  env.at(fwd_);
  cross_kv_forward(p, kv_, rows(proj_, p.Nk, width()), rows(memory, p.Nk, C_), env.p(w_, width() * C_),
                   bias_ ? env.p(b_, width()) : Tensor(), *env.ctx);
}

void CrossKvProjection::backward(const StepEnv& env, const Tensor& d_memory, const Tensor& memory) const {
  const CrossKvParams p = params(env);
  env.at(bwd_);
  cross_kv_backward(p, env.g(w_, width() * C_), bias_ ? env.g(b_, width()) : Tensor(), rows(d_memory, p.Nk, C_),
                    rows(d_proj_, p.Nk, width()), d_kv_, rows(memory, p.Nk, C_), env.p(w_, width() * C_),
                    /*accumulate=*/false, *env.ctx);
}

}  // namespace tessera
