// train(): the loop over the steps of a run. The step itself is TrainStep's (train_step.h) or, replayed, GraphStep's
// (graph_step.h); the run's directory (metrics, checkpoint/, best/) is RunDir's (run_dir.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "tessera/core/cuda_graph.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/trace.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/train/graph_step.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/memory_record.h"
#include "tessera/train/progress.h"
#include "tessera/train/run_dir.h"
#include "tessera/train/train_step.h"
#include "tessera/train/trainer.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// What one step left for its record.
struct StepOutcome {
  bool abandoned = false;  // a stop between micro-steps: nothing of the step was applied
  double loss = 0, grad_norm = 0, scale = 1, tokens_per_s = 0;
  float lr = 0;
  bool skipped = false;
  Clock::time_point end;
};

// The run: the model on its device, the optimizer, the loss scaling, the run directory and the step, made from a
// TrainSetup before the first step; then one step at a time.
class TrainLoop {
 public:
  TrainLoop(TrainSetup& setup, const TrainControl& control);
  int64_t first_step() const { return state_.step + 1; }
  int64_t last_step() const { return o_.steps; }
  StepOutcome step(int64_t step);
  // The step's record, validation and checkpoints; true when the run stops after it.
  bool finish_step(int64_t step, const StepOutcome& s);
  // An abandoned step: the checkpoint of the last whole one.
  void stop_abandoned();
  TrainResult result();

 private:
  void make_model();
  void make_optimizer();
  // The step's forward, backward and optimizer, as a graph replay (false: it could not be) or eagerly.
  bool replay(int64_t step, float lr, double scale);
  bool eager(int64_t step, float lr, double scale, Tracer* tracer, bool measure);
  void sample(bool measure);
  void write_recordings(int64_t step, Tracer* tracer);
  double read_losses(int64_t step);
  void validate_and_save(int64_t step, bool last, bool time_due, nlohmann::ordered_json& rec);
  void show_progress(int64_t step, const StepOutcome& s);

  TrainSetup& setup_;
  const TrainControl& control_;
  TrainOptions& o_;
  TrainState& state_;
  DataParallel* dp_;
  int rank_ = 0, world_ = 1;
  bool lead_ = true, resuming_ = false;
  Context* ctx_ = nullptr;
  size_t memory_baseline_ = 0;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  StepLossScaling scaling_;
  std::unique_ptr<RunDir> dir_;
  TrainResult result_;
  std::unique_ptr<ProgressBar> bar_;
  Clock::time_point t_start_, last_ckpt_;
  RngState rank_rng_;
  size_t loss_bytes_ = 4;
  std::unique_ptr<Buffer> step_losses_;
  std::unique_ptr<TrainStep> train_step_;
  std::unique_ptr<GraphStep> graph_;
  bool host_hooks_ = false;
  std::vector<int32_t> x_, y_;
  std::vector<int32_t> fallback_x_, fallback_y_;  // a failed capture's batches, which that step then runs eagerly
  std::vector<size_t> measured_;                  // --memory-timeline's device memory at the phase ends
};

TrainLoop::TrainLoop(TrainSetup& setup, const TrainControl& control)
    : setup_(setup), control_(control), o_(setup.options), state_(setup.state), dp_(setup.parallel) {
  rank_ = dp_ ? dp_->rank() : 0;
  world_ = dp_ ? dp_->world_size() : 1;
  lead_ = rank_ == 0;  // the one rank that writes files and prints
  TS_CHECK(o_.world_size == world_, "internal: options for ", o_.world_size, " ranks, run on ", world_);
  TS_CHECK(o_.memory_timeline.empty() || control.on_memory_timeline,
           "internal: --memory-timeline without TrainControl::on_memory_timeline to draw it");
  resuming_ = setup.model != nullptr;
  if (!setup.train_data) train_open_data(setup);
  // Before anything is written: every rank must be training the same run.
  if (dp_) dp_->check_consistent(run_fingerprint(o_), "the training options, the data and the world size");
  if (lead_) ensure_writable_dir(o_.out);
  if (!setup.context) setup.context = std::make_unique<Context>(Device::cpu());
  ctx_ = setup.context.get();
  // What the device holds before the model: --memory-timeline's measured series is the memory in use above it.
  memory_baseline_ = ctx_->is_cuda() ? ctx_->device_memory_used() : 0;
  make_model();
  make_optimizer();
  if (control.on_start) control.on_start(optimizer_->state_bytes(), 8 * model_->params().size());
  dir_ = std::make_unique<RunDir>(o_, state_, resuming_, lead_, dp_);
  if (dir_->seeds_best()) dir_->start_best(*model_, *optimizer_, state_);  // on every rank (ZeRO-1 gathers)
  result_.best_val_loss = dir_->best_val_loss();
  result_.best_step = dir_->best_step();
  if (result_.best_step > 0) result_.best_checkpoint = dir_->best_dir();

  x_.resize(static_cast<size_t>(o_.batch) * o_.seq);
  y_.resize(x_.size());
  bar_ = std::make_unique<ProgressBar>(o_.steps, state_.step, o_.progress && lead_);
  t_start_ = last_ckpt_ = Clock::now();
  // Each rank draws its own dropout masks: rank r's Philox seed is offset by r (rank 0 keeps the run's seed, so a
  // single process is unchanged), while the stream counter advances alike on every rank and is what is saved.
  rank_rng_ = state_.rng;
  rank_rng_.seed += static_cast<uint64_t>(rank_) * 0x9E3779B97F4A7C15ull;
  // The micro-steps' mean losses of one step, on the device (the loss's stat dtype: f32, or f64 for an f64 model).
  loss_bytes_ = model_->dtype() == DType::F64 ? sizeof(double) : sizeof(float);
  step_losses_ = std::make_unique<Buffer>(static_cast<size_t>(o_.accum) * loss_bytes_, ctx_->device(),
                                          "the step's micro-batch losses");
  // The step, eager; or as CUDA graphs where it can be: the same launches, replayed, so the same bits.
  train_step_ = std::make_unique<TrainStep>(*model_, optimizer_.get(),
                                            TrainStepConfig{.B = o_.batch,
                                                            .T = o_.seq,
                                                            .accum = o_.accum,
                                                            .label_smoothing = o_.label_smoothing,
                                                            .skip_nonfinite = scaling_.on(),
                                                            .losses = step_losses_->data()});
  // The test hooks that run on the host before the optimizer; without them the step is one graph.
  host_hooks_ = control.before_grad_sync || control.before_optimizer_step;
  if (train_cuda_graph_refusal(o_, *ctx_).empty() && !model_->plan_debug().poison_dead)
    graph_ = std::make_unique<GraphStep>(*model_, optimizer_.get(),
                                         GraphStepConfig{.B = o_.batch,
                                                         .T = o_.seq,
                                                         .accum = o_.accum,
                                                         .losses = step_losses_->data(),
                                                         .label_smoothing = o_.label_smoothing,
                                                         .skip_nonfinite = scaling_.on(),
                                                         .host_between = host_hooks_,
                                                         .in_capture = control.in_graph_capture});
}

void TrainLoop::make_model() {
  // The model on the run's device: a resumed or --init-from model (loaded on the CPU) moves there through its f32
  // values.
  model_ = std::move(setup_.model ? setup_.model : setup_.init_model);
  const bool loaded = model_ != nullptr;  // resumed, or --init-from: the weights are the checkpoint's
  if (!model_ || !ctx_->device().is_cpu() || setup_.dtype != DType::F32) {
    auto on_device =
        tessera::make_model(o_.model, *ctx_, setup_.dtype, o_.master_weights ? MasterWeights::On : MasterWeights::Off);
    if (model_) on_device->params().write_f32(model_->params().read_f32(model_->context()), *ctx_);
    model_ = std::move(on_device);
  }
  if (!resuming_) {
    if (!loaded) model_->init_weights(o_.seed);
    state_.rng = RngState{o_.seed * 0x9E3779B97F4A7C15ull + 1, 0};
  }
  // Without accumulation the gradients share the memory of activations that die before them (models/model.h).
  model_->set_grad_memory(train_grad_memory(o_.accum));
  if (dp_) dp_->attach(*model_);
}

void TrainLoop::make_optimizer() {
  const AdamWConfig adam{.beta1 = o_.beta1,
                         .beta2 = o_.beta2,
                         .eps = o_.adam_eps,
                         .weight_decay = o_.weight_decay,
                         .grad_clip = o_.grad_clip};
  optimizer_ = dp_ ? dp_->make_optimizer(*model_, adam) : std::make_unique<AdamW>(model_->params(), adam, *ctx_);
  if (!resuming_) state_.optimizer_step = 0;
  if (state_.optimizer_step < 0) state_.optimizer_step = state_.step;
  if (resuming_) {
    setup_.train_data->set_position(state_.data_pos);
    optimizer_->load_state(state_.adam_m, state_.adam_v, state_.optimizer_step);
  }
  // Loss scaling: the scale of a resumed scaled run, else the initial one.
  scaling_ = o_.loss_scaling ? StepLossScaling(train_loss_scaler_config(o_)) : StepLossScaling();
  if (o_.loss_scaling && resuming_ && state_.loss_scale > 0)
    scaling_.scaler().set_state(state_.loss_scale, state_.loss_scale_good_steps);
  if (!o_.loss_scaling) state_.loss_scale = 0;
  if (scaling_.on()) {  // a checkpoint before the first step (an abandoned one) carries the scale it starts from
    state_.loss_scale = scaling_.scale();
    state_.loss_scale_good_steps = scaling_.scaler().good_steps();
  }
}

void TrainLoop::sample(bool measure) {
  if (!measure) return;
  ctx_->synchronize();
  const size_t used = ctx_->device_memory_used();
  measured_.push_back(used > memory_baseline_ ? used - memory_baseline_ : 0);
}

bool TrainLoop::replay(int64_t step, float lr, double scale) {
  TokenStream& data = *setup_.train_data;
  // The batches go straight into the graph's pinned staging, checked there; the graph copies them in.
  for (int micro = 0; micro < o_.accum; ++micro) {
    next_batch_share(data, o_.batch, o_.seq, rank_, world_, graph_->tokens(micro), graph_->targets(micro));
    model_->check_tokens(graph_->tokens(micro), o_.batch, o_.seq);
  }
  rank_rng_.next_stream = state_.rng.next_stream;
  try {
    std::function<void()> between;
    if (host_hooks_)
      between = [&] {
        // World size 1: the last micro-step's backward is done and there is no reduction.
        if (control_.before_grad_sync) control_.before_grad_sync(step, *model_);
        if (control_.before_optimizer_step) control_.before_optimizer_step(step, *model_);
      };
    graph_->run(lr, scale, &rank_rng_, between);
    state_.rng.next_stream = rank_rng_.next_stream;
    return true;
  } catch (const CudaGraphCaptureError& e) {
    // A capture fails before anything of the step is queued, so the step can still run eagerly, on the batches
    // already drawn. With --cuda-graph on the graph was asked for: stop with the error instead.
    if (o_.cuda_graph == CudaGraphMode::On) throw;
    if (lead_)
      std::fprintf(stderr, "tessera: warning: %s; stepping eagerly from step %lld\n", e.what(),
                   static_cast<long long>(step));
    const size_t n = x_.size();
    fallback_x_.resize(n * o_.accum);
    fallback_y_.resize(n * o_.accum);
    for (int micro = 0; micro < o_.accum; ++micro) {
      std::memcpy(fallback_x_.data() + micro * n, graph_->tokens(micro), n * sizeof(int32_t));
      std::memcpy(fallback_y_.data() + micro * n, graph_->targets(micro), n * sizeof(int32_t));
    }
    result_.graph_steps = graph_->replays();
    result_.graph_captures = graph_->captures();
    result_.graphs_per_step = graph_->graphs_per_step();
    graph_.reset();
    return false;
  }
}

bool TrainLoop::eager(int64_t step, float lr, double scale, Tracer* tracer, bool measure) {
  TrainStepHooks hooks{.batch = [&](int micro) -> std::optional<MicroBatch> {
                         // A stop asked for between the micro-batches of a step (a long one: --accum) abandons it, so
                         // that an interrupt is prompt: nothing of it has been applied, and the checkpoint is the last
                         // whole step's. A data-parallel step runs to its end (its ranks must issue the same
                         // collectives).
                         if (micro > 0 && !dp_ && control_.stop && *control_.stop != 0) return std::nullopt;
                         if (fallback_x_.empty()) {
                           next_batch_share(*setup_.train_data, o_.batch, o_.seq, rank_, world_, x_.data(), y_.data());
                         } else {
                           std::memcpy(x_.data(), fallback_x_.data() + micro * x_.size(), x_.size() * sizeof(int32_t));
                           std::memcpy(y_.data(), fallback_y_.data() + micro * y_.size(), y_.size() * sizeof(int32_t));
                         }
                         model_->check_tokens(x_.data(), o_.batch, o_.seq);
                         return MicroBatch{.tokens = x_.data(), .targets = y_.data()};
                       },
                       .after_forward =
                           [&](int micro) {
                             if (micro == 0) sample(measure);  // after the forward
                           },
                       // Only the last micro-step of a step communicates: the accumulated gradient is reduced once.
                       .before_backward =
                           [&](bool last) {
                             if (dp_) dp_->begin_backward(*model_, last);
                           },
                       .after_backward =
                           [&](bool last) {
                             if (last && control_.before_grad_sync) control_.before_grad_sync(step, *model_);
                             if (dp_) dp_->end_backward(*model_, last);
                           },
                       .before_optimizer =
                           [&] {
                             sample(measure);  // after the backward (and the gradients' reduction)
                             if (control_.before_optimizer_step) control_.before_optimizer_step(step, *model_);
                           }};
  rank_rng_.next_stream = state_.rng.next_stream;
  const bool done = train_step_->run(lr, scale, &rank_rng_, hooks, tracer);
  fallback_x_.clear();  // later steps draw their batches again
  if (!done) return false;
  state_.rng.next_stream = rank_rng_.next_stream;
  sample(measure);  // after the optimizer
  return true;
}

StepOutcome TrainLoop::step(int64_t step) {
  StepOutcome s;
  const auto t0 = Clock::now();
  s.lr = lr_at(step, o_.steps, o_);
  s.scale = scaling_.scale();
  const bool recorded = step == o_.trace_step && lead_;
  // --trace: this step's ranges and counters into a Chrome trace (rank 0's; written after the step).
  std::unique_ptr<Tracer> tracer;
  if (!o_.trace.empty() && recorded) {
    tracer = std::make_unique<Tracer>(*ctx_);
    model_->set_tracer(tracer.get());
  }
  // --memory-timeline on a GPU also measures the device memory at the end of the step's forward, backward and
  // optimizer (a synchronize each, in this one step, which runs eagerly for it).
  measured_.clear();
  const bool measure = !o_.memory_timeline.empty() && recorded && ctx_->is_cuda();
  TS_CHECK(optimizer_->step_count() == state_.optimizer_step, "internal: optimizer at step ", optimizer_->step_count(),
           ", the run's count of applied steps ", state_.optimizer_step);
  const bool stepped = graph_ && !tracer && !measure && replay(step, s.lr, s.scale);
  if (!stepped && !eager(step, s.lr, s.scale, tracer.get(), measure)) {
    if (tracer) model_->set_tracer(nullptr);
    s.abandoned = true;
    return s;
  }
  write_recordings(step, tracer.get());
  // The one read of the step: its norm, and with it whether an overflow made the optimizer skip it.
  const StepReport report = optimizer_->read_step();
  s.grad_norm = report.grad_norm;
  s.skipped = report.skipped;
  // A non-finite gradient that was not skipped (no loss scaling) has been applied: the parameters are NaN now.
  // Stop before anything is saved over the last good checkpoint.
  TS_CHECK(report.skipped || std::isfinite(s.grad_norm), "training diverged: the gradient norm is ", s.grad_norm,
           " at step ", step, " (try a lower --lr", dir_->failure_note(state_.step));
  s.loss = read_losses(step);
  scaling_.update(report, step);
  if (scaling_.on()) {
    state_.loss_scale = scaling_.scale();
    state_.loss_scale_good_steps = scaling_.scaler().good_steps();
  }
  if (report.skipped) result_.skipped_steps++;
  state_.optimizer_step = optimizer_->step_count();
  state_.step = step;
  state_.data_pos = setup_.train_data->position();
  result_.peak_device_bytes = std::max(result_.peak_device_bytes, ctx_->device_memory_used());
  s.end = Clock::now();
  const double dt = std::chrono::duration<double>(s.end - t0).count();
  s.tokens_per_s = static_cast<double>(o_.batch) * world_ * o_.seq * o_.accum / std::max(dt, 1e-9);
  return s;
}

void TrainLoop::write_recordings(int64_t step, Tracer* tracer) {
  if (tracer) {
    model_->set_tracer(nullptr);
    ctx_->synchronize();
    tracer->write_chrome_json(o_.trace, step);
    if (lead_) result_.traced.push_back(o_.trace);
  }
  if (!o_.memory_timeline.empty() && step == o_.trace_step && lead_) {
    // The plan's memory per op: the same for a graph step as for an eager one (the plan fixes every address); on a
    // GPU with the measured memory at the end of each phase.
    const std::string csv = trace_outputs(o_)[2].second;
    control_.on_memory_timeline(memory_timeline_points(*model_, optimizer_->state_bytes(), measured_),
                                o_.model.preset + ", B " + std::to_string(o_.batch) + " x T " + std::to_string(o_.seq) +
                                    ", step " + std::to_string(step) +
                                    (measured_.empty() ? " (planned)" : " (planned; measured at the phase ends)"));
    result_.traced.push_back(o_.memory_timeline);
    result_.traced.push_back(csv);
  }
}

double TrainLoop::read_losses(int64_t step) {
  // The micro-steps' losses: the stream is idle after read_step, so this copy waits for nothing.
  double loss = 0;
  std::vector<unsigned char> raw(static_cast<size_t>(o_.accum) * loss_bytes_);
  copy_bytes(raw.data(), Device::cpu(), step_losses_->data(), ctx_->device(), raw.size(), *ctx_);
  for (int micro = 0; micro < o_.accum; ++micro) {
    double each = 0;
    if (loss_bytes_ == sizeof(double)) {
      std::memcpy(&each, raw.data() + micro * sizeof(double), sizeof(double));
    } else {
      float f = 0;
      std::memcpy(&f, raw.data() + micro * sizeof(float), sizeof(float));
      each = f;
    }
    TS_CHECK(std::isfinite(each), "training diverged: loss is ", each, " at step ", step, " (try a lower --lr",
             dir_->failure_note(state_.step));
    loss += each / o_.accum;
  }
  return loss;
}

bool TrainLoop::finish_step(int64_t step, const StepOutcome& s) {
  double loss = s.loss;
  bool stop = control_.stop && *control_.stop != 0;
  // Rank 0's clock decides the wall-time checkpoints, so that every rank takes part in the same ones.
  bool time_due = o_.ckpt_every < 0 &&
                  std::chrono::duration<double>(s.end - last_ckpt_).count() >= o_.ckpt_minutes * 60;
  if (dp_) {  // the global mean loss, and a stop or checkpoint that any rank asks for holds for all
    std::vector<double> agree{loss, stop ? 1.0 : 0.0, lead_ && time_due ? 1.0 : 0.0};
    dp_->sum_host(agree);
    loss = agree[0] / world_;
    stop = agree[1] > 0;
    time_due = agree[2] > 0;
  }
  nlohmann::ordered_json rec = {{"step", step}, {"loss", loss}, {"lr", s.lr}};
  if (std::isfinite(s.grad_norm)) rec["grad_norm"] = s.grad_norm;
  else rec["grad_norm"] = nullptr;  // an overflow (JSON has no inf)
  if (o_.loss_scaling) {
    rec["loss_scale"] = s.scale;  // the scale this step's backward used
    rec["skipped"] = s.skipped;
  }
  rec["tokens_per_s"] = s.tokens_per_s;
  // --stop-after stops as an interrupt does: a checkpoint, and no validation of its own (one at its step put a
  // val_loss into metrics.jsonl, and maybe a best/, that the uninterrupted run does not have).
  validate_and_save(step, /*last=*/step == o_.steps || stop || step == o_.stop_after, time_due, rec);
  if (result_.steps == 0) result_.first_loss = loss;
  result_.steps++;
  result_.last_step = step;
  result_.last_loss = loss;
  StepOutcome shown = s;
  shown.loss = loss;
  show_progress(step, shown);
  if (stop) result_.interrupted = true;
  return stop || step == o_.stop_after;
}

void TrainLoop::validate_and_save(int64_t step, bool last, bool time_due, nlohmann::ordered_json& rec) {
  const bool end = step == o_.steps;  // an interrupt skips the end-of-run validation
  std::optional<double> val_loss;
  if (setup_.val_data && ((o_.val_every > 0 && step % o_.val_every == 0) || end)) {
    std::vector<double> v(2);
    std::tie(v[0], v[1]) =
        validation_loss_share(*model_, *setup_.val_data, o_.batch, o_.seq, o_.val_batches, rank_, world_);
    if (dp_) dp_->sum_host(v);
    result_.last_val_loss = v[0] / v[1];
    rec["val_loss"] = result_.last_val_loss;
    val_loss = result_.last_val_loss;
  }
  const bool periodic = (o_.ckpt_every > 0 && step % o_.ckpt_every == 0) || time_due;
  const StepEnd e =
      dir_->end_step(rec, val_loss, step, periodic || last, RunDir::gpt_source(*model_, *optimizer_), state_);
  // Without checkpoints a run keeps no best/, and reports none.
  if (e.new_best && o_.checkpoints) {
    result_.best_val_loss = result_.last_val_loss;
    result_.best_step = step;
    result_.best_checkpoint = dir_->best_dir();
  }
  if (e.saved) {
    last_ckpt_ = Clock::now();
    if (control_.on_checkpoint) control_.on_checkpoint(step);
  }
}

void TrainLoop::show_progress(int64_t step, const StepOutcome& s) {
  char fields[160];
  // Below 100 tokens a second (a big model on the CPU) "0.0k" would say nothing: those are shown whole.
  const double tps = s.tokens_per_s;
  const int len =
      tps < 100 ? std::snprintf(fields, sizeof fields, "loss %.4f | lr %.2e | %.3g tok/s", s.loss, s.lr, tps)
                : std::snprintf(fields, sizeof fields, "loss %.4f | lr %.2e | %.1fk tok/s", s.loss, s.lr, tps / 1000);
  if (o_.loss_scaling && len > 0 && static_cast<size_t>(len) < sizeof fields)
    std::snprintf(fields + len, sizeof fields - len, " | scale %g | %lld skipped", scaling_.scale(),
                  static_cast<long long>(result_.skipped_steps));
  bar_->update(step, fields);
}

void TrainLoop::stop_abandoned() {
  // Not when <out>/checkpoint already holds that step.
  if (o_.checkpoints && dir_->saved_step() != state_.step) {
    dir_->save(*model_, *optimizer_, state_);
    if (control_.on_checkpoint) control_.on_checkpoint(state_.step);
  }
  result_.interrupted = true;
  result_.last_step = state_.step;
}

TrainResult TrainLoop::result() {
  bar_->finish();
  result_.loss_scale = scaling_.on() ? scaling_.scale() : 0.0;
  if (graph_) {
    result_.graph_steps = graph_->replays();
    result_.graph_captures = graph_->captures();
    result_.graphs_per_step = graph_->graphs_per_step();
  }
  result_.seconds = std::chrono::duration<double>(Clock::now() - t_start_).count();
  result_.checkpoint = o_.checkpoints ? dir_->checkpoint_dir() : "";
  graph_.reset();
  train_step_.reset();
  dir_.reset();  // closes the metrics
  result_.model = std::move(model_);
  result_.context = std::move(setup_.context);
  return std::move(result_);
}

}  // namespace

TrainResult train(TrainOptions o) { return train(train_setup(std::move(o))); }

TrainResult train(TrainSetup setup, const TrainControl& control) {
  TrainLoop loop(setup, control);
  for (int64_t step = loop.first_step(); step <= loop.last_step(); ++step) {
    const StepOutcome s = loop.step(step);
    if (s.abandoned) {
      loop.stop_abandoned();
      break;
    }
    if (loop.finish_step(step, s)) break;
  }
  return loop.result();
}

}  // namespace tessera
