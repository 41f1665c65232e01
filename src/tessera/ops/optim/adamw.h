// tessera/ops/optim — AdamW over the flat parameter buffer, global gradient norm and clipping.
//
// Parameters, gradients and the moments m, v each live in one contiguous buffer; a segment table gives each
// tensor its [offset, offset + numel) range and whether weight decay applies to it. One call updates every
// parameter (LightSeq's "continuous space"): for step t (1-based),
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g²
//   w = w - lr * wd * w      (decoupled decay, segments with decay only)
//   w = w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// which is torch.optim.AdamW's update.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct ParamSegment {
  std::string name;
  size_t offset = 0, numel = 0;
  bool decay = true;
};

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  int64_t step = 1;
};

// params, grads: numel of the whole table; m, v: f32 moments of the same length.
void adamw_update_ref(const AdamWParams& p, const std::vector<ParamSegment>& segments, float* params,
                      const float* grads, float* m, float* v);

// sqrt(Σ g²) over n elements, accumulated in double.
double grad_norm_ref(const float* grads, size_t n);
// Scales grads by max_norm / (norm + 1e-6) when that is below 1 (torch.nn.utils.clip_grad_norm_);
// returns the norm before clipping. max_norm <= 0 disables clipping.
double clip_grad_norm_ref(float* grads, size_t n, double max_norm);

}  // namespace tessera
