// Tensor-level AdamW step and the device segment table: checks, then the reference (CPU) or the CUDA kernels.
#include <algorithm>
#include <cmath>

#include "tessera/ops/dispatch.h"
#include "tessera/ops/optim/adamw.h"

namespace tessera {

std::vector<int32_t> adamw_tile_first_segments(const std::vector<ParamSegment>& sorted) {
  if (sorted.empty()) return {};
  const size_t end = sorted.back().offset + sorted.back().numel;
  const size_t tile = static_cast<size_t>(kAdamWTileElems), tiles = (end + tile - 1) / tile;
  std::vector<int32_t> first(tiles);
  size_t s = 0;
  for (size_t t = 0; t < tiles; ++t) {
    // Tile t starts below end, so a segment ending after its start exists: s stays in range.
    while (sorted[s].offset + sorted[s].numel <= t * tile) ++s;
    first[t] = static_cast<int32_t>(s);
  }
  return first;
}

AdamWSegmentTable::AdamWSegmentTable(const std::vector<ParamSegment>& segments, Context& ctx)
    : device_kind_(ctx.device()) {
  for (const ParamSegment& s : segments)
    if (s.numel > 0) segments_.push_back(s);
  std::sort(segments_.begin(), segments_.end(),
            [](const ParamSegment& a, const ParamSegment& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < segments_.size(); ++i)
    TS_CHECK(segments_[i - 1].offset + segments_[i - 1].numel <= segments_[i].offset, "adamw: segment '",
             segments_[i - 1].name, "' [", segments_[i - 1].offset, ", ",
             segments_[i - 1].offset + segments_[i - 1].numel, ") overlaps '", segments_[i].name, "' at ",
             segments_[i].offset);
  end_ = segments_.empty() ? 0 : segments_.back().offset + segments_.back().numel;
  if (ctx.is_cuda() && !segments_.empty()) {
    std::vector<AdamWSegmentRecord> records;
    records.reserve(segments_.size());
    for (const ParamSegment& s : segments_)
      records.push_back({.begin = static_cast<int64_t>(s.offset),
                         .end = static_cast<int64_t>(s.offset + s.numel),
                         .decay = s.decay ? 1 : 0});
    const size_t bytes = records.size() * sizeof(AdamWSegmentRecord);
    device_ = Buffer(bytes, ctx.device(), "the AdamW segment table");
    copy_bytes(device_.data(), ctx.device(), records.data(), Device::cpu(), bytes, ctx);
    const std::vector<int32_t> first = adamw_tile_first_segments(segments_);
    const size_t index_bytes = first.size() * sizeof(int32_t);
    tile_segments_ = Buffer(index_bytes, ctx.device(), "the AdamW tile index");
    copy_bytes(tile_segments_.data(), ctx.device(), first.data(), Device::cpu(), index_bytes, ctx);
    ctx.synchronize();  // the host vectors go away; the copies may be staged asynchronously
  }
}

bool adamw_supports(DType dtype, bool master, Device device, std::string* why) {
  if (device.is_cpu()) {
    if (dtype != DType::F32 || master) {
      if (why) *why = "the CPU reference updates f32 parameters in place, without separate master weights";
      return false;
    }
    return true;
  }
  // 16-bit parameters with or without f32 master weights: without, the update runs in f32 registers from the
  // 16-bit value and rounds the result back (LightSeq's master-less mode).
  return supports_dtype(dtype, device, why);
}

AdamWStepScalars adamw_step_scalars(const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  return {.beta1 = p.beta1,
          .one_minus_beta1 = 1.0f - p.beta1,
          .beta2 = p.beta2,
          .one_minus_beta2 = 1.0f - p.beta2,
          .eps = p.eps,
          .step_size = static_cast<float>(p.lr / bc1),
          .inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2)),
          .keep = 1.0f - p.lr * p.weight_decay,
          .max_norm = p.max_grad_norm,
          .skip_nonfinite = p.skip_nonfinite ? 1 : 0,
          .grad_scale = static_cast<double>(p.grad_scale)};
}

size_t adamw_scratch_bytes(const Context& ctx) {
  return ctx.is_cuda() ? 8 * static_cast<size_t>(ctx.gpu().sm_count) * sizeof(float) : 0;
}

void adamw_step(const AdamWParams& p, const AdamWSegmentTable& table, const Tensor& params, const Tensor& grads,
                const Tensor& master, const Tensor& m, const Tensor& v, const Tensor& grad_norm, Context& ctx,
                const AdamWStepScalars* device_scalars) {
  constexpr const char* op = "adamw_step";
  TS_CHECK(!device_scalars || ctx.is_cuda(), op, ": scalars in device memory need a CUDA context");
  const DType dt = params.dtype();
  std::string why;
  require_supported(adamw_supports(dt, master.defined(), ctx.device(), &why), op, why);
  TS_CHECK(p.step >= 1, op, ": step must start at 1, got ", p.step);
  TS_CHECK(p.grad_scale > 0 && std::isfinite(p.grad_scale), op, ": the gradient scale must be a positive number, got ",
           p.grad_scale);
  TS_CHECK(!p.skip_nonfinite || grad_norm.defined(), op,
           ": skipping non-finite steps needs the grad_norm output (it is how a skip is reported)");
  TS_CHECK(table.device() == ctx.device(), op, ": the segment table was built for ", table.device().str(),
           " but the context is ", ctx.device().str());
  const int64_t n = params.numel();
  TS_CHECK(static_cast<size_t>(n) >= table.end(), op, ": the buffers hold ", n,
           " elements but the segment table reaches ", table.end());
  expect(params, op, "params", dt, n, ctx);
  expect(grads, op, "grads", dt, n, ctx);
  expect(master, op, "master", DType::F32, n, ctx, /*optional=*/true);
  expect(m, op, "m", DType::F32, n, ctx);
  expect(v, op, "v", DType::F32, n, ctx);
  expect(grad_norm, op, "grad_norm", DType::F32, 1, ctx, /*optional=*/true);
  if (on_cuda(ctx, [&] {
        adamw_step_cuda(p, table, dt, params.data(), grads.data(), master.as<float>(), m.as<float>(), v.as<float>(),
                        grad_norm.as<float>(), ctx, device_scalars);
      }))
    return;
  // The reference clips over the whole buffer; gaps between segments are zero in a CPU model (no padding there).
  float* g = grads.as<float>();
  const double norm = grad_norm_ref(g, static_cast<size_t>(n)) / p.grad_scale;
  if (grad_norm.defined()) grad_norm.as<float>()[0] = static_cast<float>(norm);
  if (p.skip_nonfinite && !std::isfinite(norm)) return;  // the skip: nothing else changes
  unscale_clip_grads_ref(g, static_cast<size_t>(n), norm, p.max_grad_norm, p.grad_scale);
  adamw_update_ref(p, table.segments(), params.as<float>(), g, m.as<float>(), v.as<float>());
}

}  // namespace tessera
