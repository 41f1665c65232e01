#include "tessera/train/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "tessera/core/error.h"

namespace tessera {

LossScaler::LossScaler(const LossScalerConfig& cfg) : cfg_(cfg), scale_(cfg.init_scale) {
  TS_CHECK(std::isfinite(cfg.min_scale) && cfg.min_scale >= 1.0, "loss scaler: the minimum scale must be >= 1, got ",
           cfg.min_scale);
  TS_CHECK(std::isfinite(cfg.max_scale) && cfg.max_scale >= cfg.min_scale,
           "loss scaler: the maximum scale must be >= the minimum, got ", cfg.max_scale);
  TS_CHECK(std::isfinite(cfg.init_scale) && cfg.init_scale >= cfg.min_scale && cfg.init_scale <= cfg.max_scale,
           "--loss-scale-init must be in [", cfg.min_scale, ", ", cfg.max_scale, "], got ", cfg.init_scale);
  TS_CHECK(cfg.growth_interval >= 1, "--loss-scale-interval must be >= 1, got ", cfg.growth_interval);
  TS_CHECK(std::isfinite(cfg.growth) && cfg.growth > 1.0, "loss scaler: the growth factor must be > 1, got ",
           cfg.growth);
  TS_CHECK(cfg.backoff > 0.0 && cfg.backoff < 1.0, "loss scaler: the backoff factor must be in (0, 1), got ",
           cfg.backoff);
}

void LossScaler::update(bool overflow, int64_t step) {
  if (overflow) {
    TS_CHECK(scale_ > cfg_.min_scale, "training diverged: the f16 gradients overflow even at loss scale ", scale_,
             " (step ", step, "); try --precision bf16 or a lower --lr");
    scale_ = std::max(cfg_.min_scale, scale_ * cfg_.backoff);
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ >= cfg_.growth_interval) {
    scale_ = std::min(cfg_.max_scale, scale_ * cfg_.growth);
    good_steps_ = 0;
  }
}

void LossScaler::set_state(double scale, int64_t good_steps) {
  TS_CHECK(std::isfinite(scale) && scale >= cfg_.min_scale && scale <= cfg_.max_scale, "checkpoint: loss scale ", scale,
           " is outside [", cfg_.min_scale, ", ", cfg_.max_scale, "]");
  // Not bounded by growth_interval: a run resumed with a shorter --loss-scale-interval grows at its next good step.
  TS_CHECK(good_steps >= 0, "checkpoint: negative count of good steps since the loss scale changed: ", good_steps);
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace tessera
