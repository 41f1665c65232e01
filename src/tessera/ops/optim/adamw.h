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

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/core/tensor.h"

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
  // Clip the gradients to this global L2 norm first (torch.nn.utils.clip_grad_norm_); <= 0: no clipping. Read by
  // the Tensor-level adamw_step only; adamw_update_ref ignores it (call clip_grad_norm_ref before it).
  float max_grad_norm = 0.0f;
  // Dynamic loss scaling (f16 training): the gradients hold grad_scale * g. adamw_step unscales them (g / S, in
  // registers on a GPU) and clips and reports the norm of the unscaled gradient (norm of the buffer / S). A power
  // of 2 keeps the unscaling exact. 1: no scaling.
  float grad_scale = 1.0f;
  // When the global gradient norm is not finite (an inf or NaN anywhere in the segments), adamw_step leaves
  // params, master, m and v untouched and grad_norm (then required) receives that non-finite norm: the caller
  // learns of the skip from the norm it reads anyway. false: a non-finite gradient is applied as it is.
  bool skip_nonfinite = false;
};

// params, grads: numel of the whole table; m, v: f32 moments of the same length.
void adamw_update_ref(const AdamWParams& p, const std::vector<ParamSegment>& segments, float* params,
                      const float* grads, float* m, float* v);

// sqrt(Σ g²) over n elements, accumulated in double.
double grad_norm_ref(const float* grads, size_t n);
// grads hold grad_scale * g. norm = grad_norm_ref(grads) / grad_scale, the norm of the unscaled gradient; then
// grads *= (1 / grad_scale) * c, c = max_norm / (norm + 1e-6) when that is below 1 and max_norm > 0, else 1
// (torch.nn.utils.clip_grad_norm_ after GradScaler.unscale_). Returns norm (before clipping).
double clip_grad_norm_ref(float* grads, size_t n, double max_norm, double grad_scale = 1.0);
// The same with the (unscaled) norm already known: grads *= (1 / grad_scale) * c.
void unscale_clip_grads_ref(float* grads, size_t n, double norm, double max_norm, double grad_scale);

}  // namespace tessera

// ---- Tensor-level optimizer step (adamw.cpp) and its CUDA launchers (adamw.cu). ----
namespace tessera {

// One segment as the CUDA kernels read it: elements [begin, end) of the flat buffers, decay 1 or 0.
struct AdamWSegmentRecord {
  int64_t begin = 0, end = 0;
  int32_t decay = 0, unused = 0;
};

// The CUDA kernels' unit of work: 256 threads x 8 consecutive elements.
constexpr int64_t kAdamWTileElems = 2048;

// Per kAdamWTileElems-element tile t of [0, end of the last segment): the first s with sorted[s].offset +
// sorted[s].numel > t * kAdamWTileElems. `sorted`: non-empty segments by offset, disjoint.
std::vector<int32_t> adamw_tile_first_segments(const std::vector<ParamSegment>& sorted);

// The segment table, checked, sorted by offset (empty segments dropped), and on the CUDA context's device a copy
// in device memory that the kernels read, with, per kAdamWTileElems-element tile, the first segment ending after the
// tile's start (so that no kernel searches the table per tile). Build it once per model (the table does not change
// between steps): no per-step upload, nothing to break CUDA graph capture. Segments must not overlap; gaps between
// them (alignment padding) are neither read into the norm nor updated.
class AdamWSegmentTable {
 public:
  AdamWSegmentTable(const std::vector<ParamSegment>& segments, Context& ctx);
  const std::vector<ParamSegment>& segments() const { return segments_; }                        // sorted by offset
  const AdamWSegmentRecord* device_records() const { return device_.as<AdamWSegmentRecord>(); }  // CUDA only
  // (ceil(end / kAdamWTileElems)) int32: tile t's first segment s with segs[s].end > t * kAdamWTileElems. CUDA only.
  const int32_t* device_tile_segments() const { return tile_segments_.as<int32_t>(); }
  int count() const { return static_cast<int>(segments_.size()); }
  size_t end() const { return end_; }  // one past the last updated element: the buffers need at least this many
  Device device() const { return device_kind_; }

 private:
  std::vector<ParamSegment> segments_;
  Buffer device_, tile_segments_;
  size_t end_ = 0;
  Device device_kind_;
};

// The scalars of one step as the CUDA update kernel reads them: computed on the host in f64 as adamw_update_ref
// does, then rounded to f32. Those that change from step to step (lr, the bias corrections of t, the loss scale)
// are why a CUDA graph cannot take them as kernel arguments: with `device_scalars` the kernels read them from
// device memory instead (train/graph_step.h copies them there before each replay). Plain data, 48 bytes.
struct AdamWStepScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float step_size;         // lr / (1 - beta1^t)
  float inv_sqrt_bc2;      // 1 / sqrt(1 - beta2^t)
  float keep;              // 1 - lr * weight_decay (segments with decay)
  float max_norm;          // <= 0: no clipping
  int32_t skip_nonfinite;  // a non-finite norm: update nothing
  double grad_scale;       // S: the gradients hold S * g (loss scaling); 1: none
};
AdamWStepScalars adamw_step_scalars(const AdamWParams& p);

// dtype: the params / grads (compute) dtype; master: whether f32 master weights are separate from the params.
// CPU: f32 params, no master. CUDA: f32, bf16, f16, each with or without a master (a 16-bit param without one is
// updated in f32 registers and rounded back: LightSeq's master-less mode).
bool adamw_supports(DType dtype, bool master, Device device, std::string* why = nullptr);

// One optimizer step over the flat buffers, whose gradients hold S * g (S = p.grad_scale, 1 without loss scaling):
//   norm = sqrt(Σ (S g)²) / S over the segments;  c = min(1, max_grad_norm / (norm + 1e-6)) when max_grad_norm > 0,
//   else 1; with p.skip_nonfinite and norm not finite: nothing changes but grad_norm (= norm), and the step is over;
//   else AdamW (adamw.h, top) with (S g) * (c / S) on every segment, decay per segment.
// params, grads: (numel) compute dtype; master: (numel) f32 or undefined (the params are their own master: f32, or
// 16-bit ones updated through f32 registers, w = round(update(f32(w))));
// m, v: (numel) f32; numel >= table.end(). grad_norm: (1) f32 or undefined; receives the norm before clipping (on
// the device: the host copies it when it wants the metric). p.step counts from 1.
// CUDA: the master, m and v are updated in f32 registers and the params get round(master) in the compute dtype;
// the grads are NOT modified (the unscale and clip factor is applied in registers). CPU: clip_grad_norm_ref (scales
// the grads in place) then adamw_update_ref.
// Launches (CUDA): one norm-partials kernel when grad_norm is given, max_grad_norm > 0 or skip_nonfinite (skipped
// otherwise), and
// one AdamW kernel for every parameter, which reduces the partials itself in a fixed order (no host round trip,
// deterministic). Uses ctx.scratch(adamw_scratch_bytes(ctx)).
// device_scalars (CUDA only; null: from p): device memory holding one AdamWStepScalars, which the kernels read
// when they run, in place of p's lr, step and grad_scale (p still decides which launches there are: its
// max_grad_norm, skip_nonfinite and grad_norm must match what the scalars hold). A CUDA graph captures this call
// once and replays it with new scalars copied in before each replay.
void adamw_step(const AdamWParams& p, const AdamWSegmentTable& table, const Tensor& params, const Tensor& grads,
                const Tensor& master, const Tensor& m, const Tensor& v, const Tensor& grad_norm, Context& ctx,
                const AdamWStepScalars* device_scalars = nullptr);

// The scratch adamw_step takes on this context (reserve it before capturing a CUDA graph).
size_t adamw_scratch_bytes(const Context& ctx);

// CUDA launcher: params / grads in `dtype`; master may be null (then the params are the master: f32, or 16-bit
// read into f32 registers and rounded back);
// grad_norm may be null. Pointers are device memory.
// Norm partials: a fixed grid of blocks strides over 2048-element tiles, sums g² of the in-segment elements in f32
// and writes one partial per block to scratch. AdamW: 2048-element tiles (256 threads x 8 consecutive elements);
// each block first sums the partials in f64 in a fixed order (every block gets the same bits; block 0 stores the
// norm, and with skip_nonfinite every block returns at once when it is not finite, all alike). In both kernels a
// tile reads its first segment from the table's per-tile index (a binary search per tile and thread would make the
// norm partials issue-bound, far from the memory bandwidth); a thread whose 8 elements lie
// inside that segment takes the vector path (16-byte accesses, one decay for all), and only a thread straddling a
// segment boundary or a gap goes element by element.
void adamw_step_cuda(const AdamWParams& p, const AdamWSegmentTable& table, DType dtype, void* params, const void* grads,
                     float* master, float* m, float* v, float* grad_norm, Context& ctx,
                     const AdamWStepScalars* device_scalars = nullptr);

}  // namespace tessera
