#include "tessera/train/train_step.h"

#include "tessera/core/error.h"

namespace tessera {

TrainStep::TrainStep(Model& model, Optimizer* optimizer, const TrainStepConfig& cfg)
    : model_(&model), optimizer_(optimizer), cfg_(cfg) {
  TS_CHECK(cfg.B > 0 && cfg.T > 0 && cfg.accum >= 1, "internal: training step of batch ", cfg.B, " x ", cfg.T,
           ", accum ", cfg.accum);
}

bool TrainStep::forward_backward(double loss_scale, RngState* rng, const TrainStepHooks& hooks) {
  Model& model = *model_;
  Context& ctx = model.context();
  const int B = cfg_.B, T = cfg_.T;
  const size_t n = static_cast<size_t>(B) * T;
  if (cfg_.backward) model.zero_grad();
  // With a backward, the forward also writes the loss gradient (one pass over the logits fewer); backward continues
  // from it. The scale is divided once, here, so forward and backward see the same S / accum.
  ForwardOptions fo{.training = true, .label_smoothing = cfg_.label_smoothing, .rng = rng};
  if (cfg_.backward) fo.loss_grad_scale = loss_scale / cfg_.accum;
  for (int micro = 0; micro < cfg_.accum; ++micro) {
    if (hooks.batch) {
      const std::optional<MicroBatch> mb = hooks.batch(micro);
      if (!mb) return false;
      copy_bytes(model.tokens_buffer(B, T).data(), ctx.device(), mb->tokens, Device::cpu(), n * sizeof(int32_t), ctx);
      copy_bytes(model.targets_buffer(B, T).data(), ctx.device(), mb->targets, Device::cpu(), n * sizeof(int32_t), ctx);
    }
    model.forward_device(B, T, /*with_targets=*/true, fo);
    if (hooks.after_forward) hooks.after_forward(micro);
    // Each micro-step's mean loss stays on the device until the step's one read, after the optimizer.
    if (cfg_.losses)
      copy_bytes(static_cast<char*>(cfg_.losses) + micro * loss_bytes(), ctx.device(), model.loss().data(),
                 ctx.device(), loss_bytes(), ctx);
    if (!cfg_.backward) continue;
    const bool last = micro == cfg_.accum - 1;
    if (hooks.before_backward) hooks.before_backward(last);
    model.backward(loss_scale / cfg_.accum);
    if (hooks.after_backward) hooks.after_backward(last);
  }
  return true;
}

void TrainStep::optimizer_step(float lr, double loss_scale, Tracer* tracer) {
  TS_CHECK(optimizer_ && cfg_.backward, "internal: an optimizer step without an optimizer or a backward");
  const TraceScope optim(tracer, "OPTIM_STEP");
  optimizer_->step(model_->params(), lr, grad_scaling(loss_scale));
}

bool TrainStep::run(float lr, double loss_scale, RngState* rng, const TrainStepHooks& hooks, Tracer* tracer) {
  if (!forward_backward(loss_scale, rng, hooks)) return false;
  if (hooks.before_optimizer) hooks.before_optimizer();
  optimizer_step(lr, loss_scale, tracer);
  return true;
}

void TrainStep::stage_optimizer(float lr, double loss_scale, void* host) {
  optimizer_->stage_step(model_->params(), lr, grad_scaling(loss_scale), host);
}

void TrainStep::enqueue_graph_optimizer(const void* device) {
  // The scale and the learning rate come from the staged scalars in device memory, not from these arguments.
  optimizer_->enqueue_graph_step(model_->params(), grad_scaling(1.0), device);
}

}  // namespace tessera
