// tessera/train/optimizer.h — the AdamW optimizer object: it owns its state (moments m and v in f32, the device
// copy of the segment table, the gradient-norm scalar) on the model's device, and one step() clips by global norm
// and updates every parameter over the flat buffers (one launch on a GPU, after one launch for the norm).
#pragma once
#include <cstdint>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/nn/param_buffer.h"
#include "tessera/ops/optim/adamw.h"

namespace tessera {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // global-norm clipping; 0: off
  // Compute the global gradient norm every step for read_grad_norm() (the trainer logs it). Clipping computes it
  // anyway; with grad_clip 0 and this off, a GPU step is the update launch alone.
  bool track_grad_norm = true;
};

// Loss scaling for one step (f16 training, train/loss_scaler.h): the gradients hold scale * g.
struct GradScaling {
  float scale = 1.0f;           // the optimizer unscales by it (a power of 2 keeps that exact)
  bool skip_nonfinite = false;  // a step whose gradient norm is not finite changes nothing (read_step says so)
};

// What read_step reports of the last step.
struct StepReport {
  double grad_norm = 0;  // of the unscaled gradient, before clipping; inf or NaN when the step was skipped
  bool skipped = false;
};

// What the training loop needs from an optimizer: AdamW below over the whole flat buffer, or ZeRO-1's AdamW
// over one rank's range of it (dist/zero.h), which communicates inside step() and read_state().
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Optimizer step number step_count() + 1 at learning rate lr, from the gradients in params.grad().
  void step(ParamBuffer& params, float lr) { step(params, lr, GradScaling{}); }
  // The same from gradients that hold scaling.scale * g. With scaling.skip_nonfinite the host does not know
  // whether the step happened until read_step(), which must come before the next step: step_count() counts
  // the step until read_step() finds it skipped (so a skipped step does not advance the bias correction).
  virtual void step(ParamBuffer& params, float lr, const GradScaling& scaling) = 0;
  // The global gradient norm (before clipping) of the last step: one explicit device-to-host copy.
  virtual double read_grad_norm() const = 0;
  // The last step's norm and whether it was skipped: the same one copy as read_grad_norm.
  virtual StepReport read_step() = 0;
  // Steps applied (skipped ones do not count): the bias correction's t of the last step.
  virtual int64_t step_count() const = 0;
  // The whole moments m and v as host vectors of params.size() (a checkpoint), and params' f32 values made
  // whole. A sharded optimizer gathers them: every rank calls it, and only rank 0's vectors are filled.
  virtual void read_state(ParamBuffer& params, std::vector<float>& m, std::vector<float>& v) = 0;
  // The inverse, from whole vectors (resume); a sharded optimizer keeps its own range.
  virtual void load_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) = 0;
  // Bytes of optimizer state on this rank's device (m, v), for reports.
  virtual size_t state_bytes() const = 0;

  // CUDA graphs (train/graph_step.h): step() in its two halves, so that a captured graph replays the device half
  // with each step's own scalars. stage_step is step()'s host half: its checks and bookkeeping (step_count() counts
  // the step from here, and read_step() must follow as after step()), and the step's scalars written to `host`
  // (graph_scalar_bytes() of pinned memory, which the caller copies to `device` before the device half runs).
  // enqueue_graph_step queues the device half, whose kernels read the scalars from `device` when they run: a graph
  // captures it once. Its `scaling` gives the structure only (skip_nonfinite); the scale comes from the scalars.
  // graph_scalar_bytes() 0: this optimizer has no graph form (ZeRO-1 communicates inside its step), and the other
  // two throw.
  virtual size_t graph_scalar_bytes() const { return 0; }
  virtual void stage_step(ParamBuffer& params, float lr, const GradScaling& scaling, void* host);
  virtual void enqueue_graph_step(ParamBuffer& params, const GradScaling& scaling, const void* device);
};

class AdamW final : public Optimizer {
 public:
  AdamW(const ParamBuffer& params, const AdamWConfig& cfg, Context& ctx);

  using Optimizer::step;
  // The gradients are read, not changed, on a GPU (unscaling and clipping happen in registers) and unscaled and
  // clipped in place on the CPU.
  void step(ParamBuffer& params, float lr, const GradScaling& scaling) override;
  // Needs track_grad_norm or clipping.
  double read_grad_norm() const override;
  // Needs track_grad_norm, clipping or a step with skip_nonfinite.
  StepReport read_step() override;
  int64_t step_count() const override { return step_; }

  // The moments as host vectors (checkpoints), and back (resume); n = params.size() each.
  std::vector<float> read_m() const;
  std::vector<float> read_v() const;
  void read_state(ParamBuffer& params, std::vector<float>& m, std::vector<float>& v) override {
    m = read_m();
    v = read_v();
  }
  void load_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) override;
  size_t state_bytes() const override { return m_.bytes() + v_.bytes(); }

  // CUDA only (0 on the CPU, which has no graphs): one AdamWStepScalars.
  size_t graph_scalar_bytes() const override;
  void stage_step(ParamBuffer& params, float lr, const GradScaling& scaling, void* host) override;
  void enqueue_graph_step(ParamBuffer& params, const GradScaling& scaling, const void* device) override;

 private:
  bool tracks_norm() const { return cfg_.track_grad_norm || cfg_.grad_clip > 0.0f; }
  // The kernel parameters of step t = step_ + 1 at lr, and the host bookkeeping of that step (shared by step()
  // and stage_step).
  AdamWParams begin_step(ParamBuffer& params, float lr, const GradScaling& scaling);
  void enqueue(ParamBuffer& params, const AdamWParams& p, const AdamWStepScalars* device_scalars);

  AdamWConfig cfg_;
  Context* ctx_;
  size_t n_;
  AdamWSegmentTable table_;
  Buffer m_, v_, norm_;
  int64_t step_ = 0;
  bool unresolved_skip_ = false;  // the last step may have been skipped; read_step() decides
  bool norm_written_ = false;     // the last step wrote norm_
};

}  // namespace tessera
