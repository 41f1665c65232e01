#include "tessera/train/optimizer.h"

#include <cmath>
#include <cstring>

namespace tessera {

void Optimizer::stage_step(ParamBuffer&, float, const GradScaling&, void*) {
  TS_THROW("internal: this optimizer has no CUDA graph form");
}
void Optimizer::enqueue_graph_step(ParamBuffer&, const GradScaling&, const void*) {
  TS_THROW("internal: this optimizer has no CUDA graph form");
}

AdamW::AdamW(const ParamBuffer& params, const AdamWConfig& cfg, Context& ctx)
    : cfg_(cfg), ctx_(&ctx), n_(params.size()), table_(params.segments(), ctx),
      m_(params.size() * 4, ctx.device(), "AdamW moment m"), v_(params.size() * 4, ctx.device(), "AdamW moment v"),
      norm_(4, ctx.device(), "the gradient norm") {
  const int64_t n = static_cast<int64_t>(n_);
  fill_bytes(m_.view(DType::F32, {n}), 0, ctx);
  fill_bytes(v_.view(DType::F32, {n}), 0, ctx);
  fill_bytes(norm_.view(DType::F32, {1}), 0, ctx);
}

AdamWParams AdamW::begin_step(ParamBuffer& params, float lr, const GradScaling& scaling) {
  TS_CHECK(params.size() == n_, "internal: optimizer built for ", n_, " parameters, stepped with ", params.size());
  TS_CHECK(!unresolved_skip_, "internal: an optimizer step that may have been skipped was not read (read_step)");
  const AdamWParams p{.lr = lr,
                      .beta1 = cfg_.beta1,
                      .beta2 = cfg_.beta2,
                      .eps = cfg_.eps,
                      .weight_decay = cfg_.weight_decay,
                      .step = step_ + 1,
                      .max_grad_norm = cfg_.grad_clip,
                      .grad_scale = scaling.scale,
                      .skip_nonfinite = scaling.skip_nonfinite};
  norm_written_ = tracks_norm() || scaling.skip_nonfinite;
  ++step_;
  unresolved_skip_ = scaling.skip_nonfinite;
  return p;
}

void AdamW::enqueue(ParamBuffer& params, const AdamWParams& p, const AdamWStepScalars* device_scalars) {
  const int64_t n = static_cast<int64_t>(n_);
  const bool norm = tracks_norm() || p.skip_nonfinite;
  adamw_step(p, table_, params.data(), params.grad(), params.master(), m_.view(DType::F32, {n}),
             v_.view(DType::F32, {n}), norm ? norm_.view(DType::F32, {1}) : Tensor(), *ctx_, device_scalars);
}

void AdamW::step(ParamBuffer& params, float lr, const GradScaling& scaling) {
  const AdamWParams p = begin_step(params, lr, scaling);
  try {
    enqueue(params, p, nullptr);
  } catch (...) {
    --step_;  // nothing was queued
    unresolved_skip_ = false;
    throw;
  }
}

size_t AdamW::graph_scalar_bytes() const { return ctx_->is_cuda() ? sizeof(AdamWStepScalars) : 0; }

void AdamW::stage_step(ParamBuffer& params, float lr, const GradScaling& scaling, void* host) {
  TS_CHECK(graph_scalar_bytes() > 0, "internal: AdamW::stage_step on a CPU context");
  const AdamWStepScalars s = adamw_step_scalars(begin_step(params, lr, scaling));
  std::memcpy(host, &s, sizeof s);
}

void AdamW::enqueue_graph_step(ParamBuffer& params, const GradScaling& scaling, const void* device) {
  TS_CHECK(graph_scalar_bytes() > 0, "internal: AdamW::enqueue_graph_step on a CPU context");
  // The host values here only shape the launches (which exist, what they check); the kernels read the step's own
  // scalars from `device`. step 1 and scale 1 pass adamw_step's checks whatever step the graph later replays.
  const AdamWParams p{.lr = 0.0f,
                      .beta1 = cfg_.beta1,
                      .beta2 = cfg_.beta2,
                      .eps = cfg_.eps,
                      .weight_decay = cfg_.weight_decay,
                      .step = 1,
                      .max_grad_norm = cfg_.grad_clip,
                      .grad_scale = 1.0f,
                      .skip_nonfinite = scaling.skip_nonfinite};
  enqueue(params, p, static_cast<const AdamWStepScalars*>(device));
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
