#include "tessera/train/graph_step.h"

#include <cstring>

#include "tessera/core/error.h"

namespace tessera {

namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Sets the context's Philox stream base for a scope (a capture), and clears it however the scope ends.
struct StreamBaseScope {
  Context& ctx;
  StreamBaseScope(Context& c, const uint64_t* base) : ctx(c) { ctx.set_philox_stream_base(base); }
  ~StreamBaseScope() { ctx.set_philox_stream_base(nullptr); }
};

}  // namespace

GraphStep::GraphStep(Model& model, Optimizer* optimizer, const GraphStepConfig& cfg)
    : model_(&model), optimizer_(optimizer), cfg_(cfg), ctx_(&model.context()),
      step_(model, optimizer,
            {.B = cfg.B,
             .T = cfg.T,
             .accum = cfg.accum,
             .label_smoothing = cfg.label_smoothing,
             .backward = cfg.backward,
             .skip_nonfinite = cfg.skip_nonfinite,
             .losses = cfg.losses}) {
  TS_CHECK(ctx_->is_cuda(), "internal: a CUDA graph step on a CPU model");
  TS_CHECK(cfg.B > 0 && cfg.T > 0 && cfg.accum >= 1, "internal: graph step of batch ", cfg.B, " x ", cfg.T, ", accum ",
           cfg.accum);
  TS_CHECK(cfg.backward || !cfg.optimizer, "internal: a graph step with the optimizer needs the backward");
  TS_CHECK(!cfg.optimizer || (optimizer && optimizer->graph_scalar_bytes() > 0),
           "internal: the graph step's optimizer has no CUDA graph form");
  TS_CHECK(cfg.upload_batch || cfg.accum == 1, "internal: accumulation over one batch held in the model");
  TS_CHECK(cfg.optimizer || !cfg.host_between, "internal: a host hook before an optimizer the graph step lacks");
  const size_t opt_bytes = cfg.optimizer ? optimizer->graph_scalar_bytes() : 0;
  optimizer_offset_ = 16;  // after the stream base, 16-byte aligned for the scalars' double
  header_bytes_ = round_up(optimizer_offset_ + opt_bytes, 256);
  batch_offset_ = header_bytes_;
  const size_t batch = cfg.upload_batch ? static_cast<size_t>(cfg.accum) * cfg.B * cfg.T * sizeof(int32_t) : 0;
  staging_ = PinnedStaging(batch_offset_ + 2 * batch, *ctx_);
  device_header_ = Buffer(header_bytes_, ctx_->device(), "the graph step's scalars");
  model.reserve(cfg.B, cfg.T);
}

int32_t* GraphStep::staged_tokens(int micro) const {
  TS_CHECK(cfg_.upload_batch && micro >= 0 && micro < cfg_.accum, "internal: graph step batch of micro-step ", micro);
  const size_t n = static_cast<size_t>(cfg_.B) * cfg_.T;
  return reinterpret_cast<int32_t*>(static_cast<char*>(staging_.data()) + batch_offset_) + micro * n;
}

int32_t* GraphStep::staged_targets(int micro) const {
  return staged_tokens(micro) + static_cast<size_t>(cfg_.accum) * cfg_.B * cfg_.T;
}

int32_t* GraphStep::tokens(int micro) {
  staging_.wait_until_read();
  return staged_tokens(micro);
}

int32_t* GraphStep::targets(int micro) {
  staging_.wait_until_read();
  return staged_targets(micro);
}

void GraphStep::enqueue_step(double loss_scale, RngState* rng, bool from_device) {
  Context& ctx = *ctx_;
  if (from_device && cfg_.in_capture) cfg_.in_capture();
  // The scalars of this step (its stream base, the optimizer's), read by the kernels of both graphs.
  if (from_device) copy_bytes(device_header_.data(), ctx.device(), staging_.data(), Device::cpu(), header_bytes_, ctx);
  TrainStepHooks hooks;
  if (cfg_.upload_batch)
    hooks.batch = [this](int micro) -> std::optional<MicroBatch> {
      return MicroBatch{.tokens = staged_tokens(micro), .targets = staged_targets(micro)};
    };
  step_.forward_backward(loss_scale, rng, hooks);
  staging_.mark_read(ctx);
}

void GraphStep::capture(double loss_scale, uint64_t seed) {
  Context& ctx = *ctx_;
  RngState relative{seed, 0};  // streams relative to the step; the kernels add the staged base
  try {
    capture_graphs(loss_scale, relative);
  } catch (...) {
    step_graph_.reset();  // neither graph is used unless both were captured
    optimizer_graph_.reset();
    throw;
  }
  draws_ = relative.next_stream;
  captured_scale_ = loss_scale;
  captured_seed_ = seed;
  captured_scratch_ = ctx.scratch_generation();
  captured_plans_ = model_->plan_count();
  captures_++;
}

void GraphStep::capture_graphs(double loss_scale, RngState& relative) {
  Context& ctx = *ctx_;
  const void* scalars = static_cast<const char*>(device_header_.data()) + optimizer_offset_;
  auto enqueue_optimizer = [&] { step_.enqueue_graph_optimizer(scalars); };
  const bool one_graph = cfg_.optimizer && !cfg_.host_between;
  {
    const StreamBaseScope base(ctx, static_cast<const uint64_t*>(device_header_.data()));
    step_graph_.capture(ctx,
                        one_graph ? "the training step (forward, backward and optimizer)"
                                  : "the training step (forward and backward)",
                        [&] {
                          enqueue_step(loss_scale, &relative, /*from_device=*/true);
                          if (one_graph) enqueue_optimizer();
                        });
  }
  if (cfg_.optimizer && cfg_.host_between) optimizer_graph_.capture(ctx, "the optimizer step", enqueue_optimizer);
}

void GraphStep::run(float lr, double loss_scale, RngState* rng, const std::function<void()>& between) {
  Context& ctx = *ctx_;
  TS_CHECK(!between || cfg_.host_between, "internal: a host hook inside a one-graph step (set host_between)");
  staging_.wait_until_read();
  if (eager_runs_ == 0) {
    // The first step eagerly: what it allocates and sets up once, a capture may not.
    enqueue_step(loss_scale, rng, /*from_device=*/false);
    if (between) between();
    if (cfg_.optimizer) step_.optimizer_step(lr, loss_scale);
    eager_runs_++;
    return;
  }
  const uint64_t seed = rng ? rng->seed : 0;
  if (!step_graph_.ready() || loss_scale != captured_scale_ || seed != captured_seed_ ||
      ctx.scratch_generation() != captured_scratch_ || model_->plan_count() != captured_plans_)
    capture(loss_scale, seed);
  char* staged = static_cast<char*>(staging_.data());
  const uint64_t base = rng ? rng->next_stream : 0;
  std::memcpy(staged, &base, sizeof base);
  if (cfg_.optimizer) step_.stage_optimizer(lr, loss_scale, staged + optimizer_offset_);
  step_graph_.launch(ctx);
  if (rng) rng->next_stream += draws_;
  if (between) between();
  if (cfg_.optimizer && cfg_.host_between) optimizer_graph_.launch(ctx);
  replays_++;
}

}  // namespace tessera
