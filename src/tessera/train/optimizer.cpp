#include "tessera/train/optimizer.h"

#include <cmath>

namespace tessera {

AdamW::AdamW(const ParamBuffer& params, const AdamWConfig& cfg, Context& ctx)
    : cfg_(cfg), ctx_(&ctx), n_(params.size()), table_(params.segments(), ctx),
      m_(params.size() * 4, ctx.device(), "AdamW moment m"), v_(params.size() * 4, ctx.device(), "AdamW moment v"),
      norm_(4, ctx.device(), "the gradient norm") {
  const int64_t n = static_cast<int64_t>(n_);
  fill_bytes(m_.view(DType::F32, {n}), 0, ctx);
  fill_bytes(v_.view(DType::F32, {n}), 0, ctx);
  fill_bytes(norm_.view(DType::F32, {1}), 0, ctx);
}

void AdamW::step(ParamBuffer& params, float lr, const GradScaling& scaling) {
  TS_CHECK(params.size() == n_, "internal: optimizer built for ", n_, " parameters, stepped with ", params.size());
  TS_CHECK(!unresolved_skip_, "internal: an optimizer step that may have been skipped was not read (read_step)");
  const AdamWParams p{.lr = lr, .beta1 = cfg_.beta1, .beta2 = cfg_.beta2, .eps = cfg_.eps,
                      .weight_decay = cfg_.weight_decay, .step = step_ + 1, .max_grad_norm = cfg_.grad_clip,
                      .grad_scale = scaling.scale, .skip_nonfinite = scaling.skip_nonfinite};
  const int64_t n = static_cast<int64_t>(n_);
  norm_written_ = tracks_norm() || scaling.skip_nonfinite;
  adamw_step(p, table_, params.data(), params.grad(), params.master(), m_.view(DType::F32, {n}),
             v_.view(DType::F32, {n}), norm_written_ ? norm_.view(DType::F32, {1}) : Tensor(), *ctx_);
  ++step_;
  unresolved_skip_ = scaling.skip_nonfinite;
}

double AdamW::read_grad_norm() const {
  TS_CHECK(tracks_norm(), "internal: read_grad_norm on an optimizer that neither clips nor tracks the norm");
  float v = 0;
  copy_bytes(&v, Device::cpu(), norm_.data(), norm_.device(), sizeof v, *ctx_);
  return v;
}

StepReport AdamW::read_step() {
  TS_CHECK(norm_written_, "internal: read_step after a step that computed no gradient norm");
  float v = 0;
  copy_bytes(&v, Device::cpu(), norm_.data(), norm_.device(), sizeof v, *ctx_);
  StepReport r{.grad_norm = v, .skipped = unresolved_skip_ && !std::isfinite(v)};
  if (r.skipped) --step_;  // adamw_step changed nothing: the next step takes this one's number again
  unresolved_skip_ = false;
  return r;
}

std::vector<float> AdamW::read_m() const {
  std::vector<float> out(n_);
  copy_bytes(out.data(), Device::cpu(), m_.data(), m_.device(), n_ * 4, *ctx_);
  return out;
}

std::vector<float> AdamW::read_v() const {
  std::vector<float> out(n_);
  copy_bytes(out.data(), Device::cpu(), v_.data(), v_.device(), n_ * 4, *ctx_);
  return out;
}

void AdamW::load_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) {
  TS_CHECK(m.size() == n_ && v.size() == n_, "optimizer state holds ", m.size(), " moments, the model ", n_);
  TS_CHECK(step >= 0, "optimizer state: negative step ", step);
  copy_bytes(m_.data(), m_.device(), m.data(), Device::cpu(), n_ * 4, *ctx_);
  copy_bytes(v_.data(), v_.device(), v.data(), Device::cpu(), n_ * 4, *ctx_);
  ctx_->synchronize();
  step_ = step;
  unresolved_skip_ = false;
}

}  // namespace tessera
