// tessera/train/loss_scaler.h — dynamic loss scaling for f16 training, as torch.cuda.amp.GradScaler does it.
//
// f16 holds magnitudes from 6e-8 (subnormal) to 65504: small gradients underflow to zero unless the loss is first
// multiplied by a scale S, and the backward then carries S·g. The optimizer divides by S again (AdamWParams::
// grad_scale) and skips a step whose gradient norm is not finite (an overflow somewhere). After each step:
//   overflow (the step was skipped):  S ← max(min_scale, S · backoff), the run of good steps restarts
//   a good step:                      good_steps + 1; at growth_interval, S ← min(max_scale, S · growth), restart
// S stays a power of 2 when init_scale is one (the default 2^16), so the unscaling is exact.
//
// StepLossScaling (below) is how a step takes it, one rule for `train` and `bench model`'s fwd-bwd and step.
#pragma once
#include <cstdint>

#include "tessera/train/optimizer.h"

namespace tessera {

struct LossScalerConfig {
  double init_scale = 65536.0;  // 2^16, GradScaler's default
  int64_t growth_interval = 2000;
  double growth = 2.0, backoff = 0.5;
  double min_scale = 1.0;         // an overflow at this scale is divergence (LossScaler::update says so)
  double max_scale = 16777216.0;  // 2^24: f32 loss scales above it only overflow f16 gradients sooner
};

class LossScaler {
 public:
  // Checks the config: 1 <= min_scale <= init_scale <= max_scale, growth > 1, 0 < backoff < 1, interval >= 1.
  explicit LossScaler(const LossScalerConfig& cfg = {});

  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }  // good steps since the scale last changed
  const LossScalerConfig& config() const { return cfg_; }

  // After a step: `overflow` when it was skipped. Throws when an overflow happens at min_scale already
  // (lowering the scale further cannot help: the run has diverged), naming `step`.
  void update(bool overflow, int64_t step);
  // The state of a resumed run; checked against the config's bounds.
  void set_state(double scale, int64_t good_steps);

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t good_steps_ = 0;
};

// The loss scaling of a run's steps: off (scale 1, nothing skipped), or on with a LossScaler. A step runs
//   forward with ForwardOptions::loss_grad_scale = scale() (/ accum), backward(scale()) (GraphStep::run's loss_scale
//   under CUDA graphs, with GraphStepConfig::skip_nonfinite = on()),
//   the optimizer with grad_scaling(): it unscales by 1/S and, when on, skips a step whose gradient norm overflowed,
//   update(optimizer.read_step(), step): the scale halves after a skipped step and grows after growth_interval good
//   ones. When on, read_step must come before the next step: only it says whether the step was skipped.
class StepLossScaling {
 public:
  StepLossScaling() = default;  // off
  explicit StepLossScaling(const LossScalerConfig& cfg) : on_(true), scaler_(cfg) {}

  bool on() const { return on_; }
  // S for the next step's backward; 1 when off.
  double scale() const { return on_ ? scaler_.scale() : 1.0; }
  // The optimizer's side of the same step: {S, skip_nonfinite = on()}.
  GradScaling grad_scaling() const { return {.scale = static_cast<float>(scale()), .skip_nonfinite = on_}; }
  // After the step's report; nothing when off. Throws as LossScaler::update does (an overflow at the minimum).
  void update(const StepReport& report, int64_t step) {
    if (on_) scaler_.update(report.skipped, step);
  }
  // The scaler's state (a checkpoint's, a resumed run's); its scale is not used when off.
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }

 private:
  bool on_ = false;
  LossScaler scaler_;
};

}  // namespace tessera
