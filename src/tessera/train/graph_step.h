// tessera/train/graph_step.h — a training step replayed as CUDA graphs (issue 8: launch overhead).
//
// With static shapes the ~300 launches of a step (gpt2-124m: the forward, the backward, AdamW's two) are captured
// once and replayed: one graph launch a step instead of hundreds of kernel launches, with the host free as soon
// as it is queued. The step has one host sync, as the eager one: the trainer's read of the loss and the
// optimizer's report after it.
//
// The step graph, on the context's stream:
//   copy the staged scalars in (one H2D copy from pinned memory), then TrainStep's forward_backward (train_step.h:
//   zero_grad, and for each of the `accum` micro-steps its staged tokens and targets copied into the model's input
//   buffers, forward_device, its mean loss copied out, backward(S / accum)); then an event the host waits on before
//   it rewrites the staging; then the optimizer's device half (Optimizer::enqueue_graph_step: AdamW's norm and
//   update launches).
// With `host_between` (the trainer's test hooks that plant a gradient) the optimizer's half is a second graph,
// replayed after the host's `between`.
//
// What a graph would freeze, and how each is kept per step:
//   - lr, the bias corrections of t, the loss scale S in the optimizer: AdamWStepScalars in device memory, copied
//     from the staging at the start of each replay (Optimizer::stage_step writes them, with the step's
//     bookkeeping, on the host);
//   - dropout: the graph is captured with Philox streams relative to the step (0, 1, ...) and the kernels add a
//     base from device memory (Context::philox_stream_base), staged as the run's next stream, so a replay draws
//     exactly the eager step's masks; the seed is fixed for a run (a new one is captured anew);
//   - tokens and targets: staged in pinned memory by the host (which checks the ids there, Model::check_tokens) and
//     copied by the graph;
//   - S in the backward (the cross-entropy's scale): captured; when the loss scaler changes S (an overflow halves
//     it, 2000 good steps double it) the step graph is captured again;
//   - the context's scratch and the activation arena: their addresses are captured; a reallocation of either
//     (Context::scratch_generation, Model::plan_count) captures again.
// Grad clipping, weight decay, β, ε and label smoothing are fixed for a run.
//
// The first run() is eager (the same launches, with the scalars as kernel arguments): it grows the scratch, plans
// the activations and sets the kernels' attributes, none of which a capture may do. So results are bit-identical
// to the eager loop's, step for step (tests/cuda/test_graph_step_cuda.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "tessera/core/buffer.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/models/model.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/train_step.h"

namespace tessera {

struct GraphStepConfig {
  int B = 0, T = 0;
  int accum = 1;             // micro-steps per step, all inside the step graph
  bool backward = true;      // zero_grad + forward + backward; false: the forward alone (with targets, to the loss)
  bool optimizer = true;     // then the optimizer (needs backward)
  bool upload_batch = true;  // micro-step m reads tokens(m) / targets(m); false: the model's input buffers hold a
                             // batch already, the same every step (the benchmark)
  void* losses = nullptr;    // device: micro-step m's mean loss copied to losses + m * its bytes; null: none
  float label_smoothing = 0.0f;
  bool skip_nonfinite = false;  // the optimizer's GradScaling::skip_nonfinite (dynamic loss scaling)
  bool host_between = false;    // run()'s `between` is used: the optimizer as a graph of its own, after it
  // Test hook: called inside each capture of the step graph, before its first launch (a test makes the capture fail
  // here, with a synchronize, to watch train fall back to eager steps).
  std::function<void()> in_capture = {};
};

class GraphStep {
 public:
  // The model's context must be a CUDA one; optimizer may be null when cfg.optimizer is false.
  GraphStep(Model& model, Optimizer* optimizer, const GraphStepConfig& cfg);

  // Pinned staging of micro-step m's batch, B*T int32 each, for the host to fill (and check) before run(). Waits
  // until the previous step's copies have read it (no wait when the host synchronized since).
  int32_t* tokens(int micro);
  int32_t* targets(int micro);

  // One step at learning rate lr with loss scale S (1: none): backward(S / accum), the optimizer's GradScaling
  // {S, skip_nonfinite}. rng: the run's dropout state (null without dropout), advanced by the step's draws as
  // the eager step advances it. `between` (only with cfg.host_between) runs on the host after the forward and
  // backward are queued and before the optimizer. Captures first when there is no graph yet or what it captured
  // has changed (above). Queues the work and returns without waiting for it.
  void run(float lr, double loss_scale, RngState* rng, const std::function<void()>& between = {});

  int64_t eager_runs() const { return eager_runs_; }
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }
  size_t nodes() const { return step_graph_.nodes() + optimizer_graph_.nodes(); }
  // The graphs a replay launches, as captured: 1, 2 with host_between, 0 before the first capture.
  int graphs_per_step() const { return int{step_graph_.ready()} + int{optimizer_graph_.ready()}; }

 private:
  // The step's launches (above) on the context's stream, eager or under capture; rng: absolute streams (eager)
  // or relative ones (capture, with the Context's stream base set).
  void enqueue_step(double loss_scale, RngState* rng, bool from_device);
  void capture(double loss_scale, uint64_t seed);
  void capture_graphs(double loss_scale, RngState& relative);
  // The staging of micro-step m's batch, without waiting (inside a capture nothing may wait).
  int32_t* staged_tokens(int micro) const;
  int32_t* staged_targets(int micro) const;

  Model* model_;
  Optimizer* optimizer_;
  GraphStepConfig cfg_;
  Context* ctx_;
  TrainStep step_;  // the step's launches, the eager loop's (train_step.h)
  size_t optimizer_offset_ = 0, batch_offset_ = 0, header_bytes_ = 0;
  PinnedStaging staging_;  // [stream base u64 | optimizer scalars | tokens (accum·B·T) | targets (accum·B·T)]
  Buffer device_header_;   // [stream base | optimizer scalars], copied from the staging by the step graph
  CudaGraph step_graph_, optimizer_graph_;
  // What the graphs captured.
  double captured_scale_ = 0;
  uint64_t captured_seed_ = 0;
  int64_t captured_scratch_ = -1, captured_plans_ = -1;
  uint64_t draws_ = 0;  // Philox streams one step takes
  int64_t eager_runs_ = 0, replays_ = 0, captures_ = 0;
};

}  // namespace tessera
