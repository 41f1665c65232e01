// tessera/train/train_step.h — one training step, written once: zero_grad, `accum` micro-steps of forward and
// backward, loss scaling, and the optimizer.
//
// A step with loss scale S over `accum` micro-batches:
//   zero_grad
//   for m in 0 .. accum-1:
//     micro-batch m into the model's input buffers (from host memory, or already there)
//     forward with targets, also writing the loss gradient at S / accum over the logits (the fused cross-entropy)
//     micro-step m's mean loss copied to losses + m * loss_bytes() (device memory; the step's one read comes later)
//     backward(S / accum): the gradients accumulate as S * g
//   optimizer step at lr with GradScaling {S, skip_nonfinite}: it divides S out again and, with skip_nonfinite,
//   skips a step whose gradient overflowed.
// The eager training loop (train/trainer.cpp), the CUDA-graph step (train/graph_step.cpp: the same launches,
// captured) and `bench model` (bench/model.cpp) all run this, so their steps are the same ops in the same order and
// their losses agree bit for bit.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>

#include "tessera/core/philox.h"
#include "tessera/core/trace.h"
#include "tessera/models/model.h"
#include "tessera/train/optimizer.h"

namespace tessera {

struct TrainStepConfig {
  int B = 0, T = 0;
  int accum = 1;  // micro-steps per step
  float label_smoothing = 0.0f;
  bool backward = true;         // zero_grad + forward + backward; false: the forward alone (with targets, to the loss)
  bool skip_nonfinite = false;  // the optimizer's GradScaling::skip_nonfinite (dynamic loss scaling)
  void* losses = nullptr;       // device: micro-step m's mean loss copied to losses + m * loss_bytes(); null: none
};

// A micro-step's batch in host memory (B*T int32 each), copied into the model's input buffers; the caller has
// checked its ids (Model::check_tokens).
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
};

// What the caller does between the step's ops; every one is optional. `last`: the last micro-step of the step, the
// one whose backward completes the gradient.
struct TrainStepHooks {
  // Micro-step m's batch; nullopt abandons the step before micro-step m (nothing of it applied yet, the optimizer
  // not run). Empty: the model's input buffers already hold the batch.
  std::function<std::optional<MicroBatch>(int micro)> batch = {};
  std::function<void(int micro)> after_forward = {};
  std::function<void(bool last)> before_backward = {};
  std::function<void(bool last)> after_backward = {};
  std::function<void()> before_optimizer = {};  // after the last backward (run()'s alone)
};

class TrainStep {
 public:
  // optimizer may be null for a step without one (forward_backward alone).
  TrainStep(Model& model, Optimizer* optimizer, const TrainStepConfig& cfg);

  // The whole step at learning rate lr and loss scale S (1: none). rng: the dropout state (null without dropout),
  // advanced by the step's draws. The optimizer's work runs in an OPTIM_STEP range of `tracer` (null: none).
  // Returns false when hooks.batch abandoned the step (then no optimizer step).
  bool run(float lr, double loss_scale, RngState* rng, const TrainStepHooks& hooks = {}, Tracer* tracer = nullptr);
  // Its parts: zero_grad and the micro-steps (false: abandoned), and the optimizer.
  bool forward_backward(double loss_scale, RngState* rng, const TrainStepHooks& hooks = {});
  void optimizer_step(float lr, double loss_scale, Tracer* tracer = nullptr);
  // The optimizer step in its two CUDA-graph halves (Optimizer::stage_step / enqueue_graph_step).
  void stage_optimizer(float lr, double loss_scale, void* host);
  void enqueue_graph_optimizer(const void* device);

  GradScaling grad_scaling(double loss_scale) const {
    return {.scale = static_cast<float>(loss_scale), .skip_nonfinite = cfg_.skip_nonfinite};
  }
  // The bytes of one micro-step's loss (the stat dtype: f32, f64 for an f64 model).
  size_t loss_bytes() const { return model_->dtype() == DType::F64 ? sizeof(double) : sizeof(float); }
  const TrainStepConfig& config() const { return cfg_; }

 private:
  Model* model_;
  Optimizer* optimizer_;
  TrainStepConfig cfg_;
};

}  // namespace tessera
