// tessera/train/loss_scaler.h — dynamic loss scaling for f16 training, as torch.cuda.amp.GradScaler does it.
//
// f16 holds magnitudes from 6e-8 (subnormal) to 65504: small gradients underflow to zero unless the loss is first
// multiplied by a scale S, and the backward then carries S·g. The optimizer divides by S again (AdamWParams::
// grad_scale) and skips a step whose gradient norm is not finite (an overflow somewhere). After each step:
//   overflow (the step was skipped):  S ← max(min_scale, S · backoff), the run of good steps restarts
//   a good step:                      good_steps + 1; at growth_interval, S ← min(max_scale, S · growth), restart
// S stays a power of 2 when init_scale is one (the default 2^16), so the unscaling is exact.
#pragma once
#include <cstdint>

namespace tessera {

struct LossScalerConfig {
  double init_scale = 65536.0;  // 2^16, GradScaler's default
  int64_t growth_interval = 2000;
  double growth = 2.0, backoff = 0.5;
  double min_scale = 1.0;            // an overflow at this scale is divergence (LossScaler::update says so)
  double max_scale = 16777216.0;     // 2^24: f32 loss scales above it only overflow f16 gradients sooner
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

}  // namespace tessera
