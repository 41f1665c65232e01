#include "tessera/dist/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessera/core/error.h"
#include "tessera/ops/optim/adamw.h"

namespace tessera {

ZeroLayout zero_layout(size_t total, int world) {
  TS_CHECK(world >= 1, "ZeRO: world size must be positive, got ", world);
  ZeroLayout l;
  l.total = total;
  l.world = world;
  l.chunk = total / (kSegmentAlign * static_cast<size_t>(world)) * kSegmentAlign;
  return l;
}

int zero_max_world(size_t total) {
  return static_cast<int>(std::clamp<size_t>(total / kSegmentAlign, 1, static_cast<size_t>(INT32_MAX)));
}

void check_zero_world(size_t total, int world) {
  TS_CHECK(world <= zero_max_world(total), "ZeRO-1 over ", world, " ranks: the ", total, " parameters make ",
           total / kSegmentAlign, " blocks of ", kSegmentAlign,
           ", fewer than the ranks, so nothing would be sharded: "
           "use --ddp, or at most ",
           zero_max_world(total), " ranks");
}

std::vector<ParamSegment> segments_in_range(const std::vector<ParamSegment>& segments, size_t begin, size_t end) {
  std::vector<ParamSegment> out;
  for (const ParamSegment& s : segments) {
    const size_t lo = std::max(s.offset, begin), hi = std::min(s.offset + s.numel, end);
    if (lo < hi) out.push_back({.name = s.name, .offset = lo - begin, .numel = hi - lo, .decay = s.decay});
  }
  return out;
}

namespace {
Tensor range(const Tensor& flat, size_t begin, size_t n) {
  return flat.slice1d(static_cast<int64_t>(begin), static_cast<int64_t>(n));
}
}  // namespace

ZeroAdamW::ZeroAdamW(const ParamBuffer& params, const AdamWConfig& cfg, Communicator& grads, MpiCommunicator& host,
                     Context& ctx)
    : cfg_(cfg), grads_(&grads), host_(&host), ctx_(&ctx), layout_(zero_layout(params.size(), grads.size())),
      rank_(grads.rank()) {
  TS_CHECK(grads.device() == params.device() && ctx.device() == params.device(), "ZeRO: the parameters are on ",
           params.device().str(), ", the gradient communicator on ", grads.device().str(), ", the context on ",
           ctx.device().str());
  TS_CHECK(host.size() == grads.size() && host.rank() == grads.rank(),
           "internal: ZeRO's host and gradient communicators disagree on the ranks");
  check_zero_world(params.size(), grads.size());
  const size_t b = shard_begin(), n = layout_.count(rank_);
  table_ = std::make_unique<AdamWSegmentTable>(segments_in_range(params.segments(), b, b + n), ctx);
  m_ = Buffer(n * 4, ctx.device(), "ZeRO AdamW moment m (this rank's range)");
  v_ = Buffer(n * 4, ctx.device(), "ZeRO AdamW moment v (this rank's range)");
  norm_sq_ = Buffer(8, ctx.device(), "the squared gradient norm");
  norm_ = Buffer(4, ctx.device(), "the gradient norm");
  if (n > 0) {
    fill_bytes(m_.view(DType::F32, {static_cast<int64_t>(n)}), 0, ctx);
    fill_bytes(v_.view(DType::F32, {static_cast<int64_t>(n)}), 0, ctx);
  }
  fill_bytes(norm_.view(DType::F32, {1}), 0, ctx);
}

void ZeroAdamW::step(ParamBuffer& params, float lr, const GradScaling& scaling) {
  TS_CHECK(scaling.scale == 1.0f && !scaling.skip_nonfinite,
           "ZeRO-1 does not support loss scaling (f16 training): use --precision bf16, or --ddp");
  TS_CHECK(params.size() == layout_.total, "internal: ZeRO optimizer built for ", layout_.total,
           " parameters, stepped with ", params.size());
  const int N = layout_.world;
  const size_t c = layout_.chunk, tail = layout_.total - layout_.tail_begin();
  const size_t b = shard_begin(), n = layout_.count(rank_);
  const Tensor g = params.grad(), w = params.data();

  // 1. This rank's range of the averaged gradient: reduce-scatter of the blocks, all-reduce of the tail.
  {
    CommHandle blocks, rest;
    if (c > 0) blocks = grads_->reduce_scatter_async(range(g, 0, N * c), range(g, rank_ * c, c), ReduceOp::Avg);
    if (tail > 0) rest = grads_->all_reduce_async(range(g, layout_.tail_begin(), tail), ReduceOp::Avg);
    blocks.wait();
    rest.wait();
  }

  // 2. The global norm from every rank's Σ g² over its range, then clipping of this range.
  const Tensor sum_sq = norm_sq_.view(DType::F64, {1});
  if (ctx_->device().is_cpu()) {
    const float* gp = n > 0 ? range(g, b, n).as<float>() : nullptr;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += static_cast<double>(gp[i]) * gp[i];
    sum_sq.as<double>()[0] = s;
    grads_->all_reduce(sum_sq, ReduceOp::Sum);
    const double norm = std::sqrt(sum_sq.as<double>()[0]);
    norm_.as<float>()[0] = static_cast<float>(norm);
    // As clip_grad_norm_ref does it, so that ZeRO and DDP clip alike.
    const double coef = cfg_.grad_clip > 0 ? cfg_.grad_clip / (norm + 1e-6) : 1.0;
    if (coef < 1.0) {
      float* gw = range(g, b, n).as<float>();
      for (size_t i = 0; i < n; ++i) gw[i] = static_cast<float>(gw[i] * coef);
    }
  } else {
#ifdef TESSERA_WITH_CUDA
    zero_sum_squares_cuda(params.dtype(), n > 0 ? range(g, b, n).data() : nullptr, static_cast<int64_t>(n),
                          sum_sq.as<double>(), *ctx_);
    grads_->all_reduce(sum_sq, ReduceOp::Sum);
    zero_clip_cuda(params.dtype(), n > 0 ? range(g, b, n).data() : nullptr, static_cast<int64_t>(n),
                   sum_sq.as<double>(), cfg_.grad_clip, norm_.as<float>(), *ctx_);
#else
    TS_THROW("internal: a CUDA model in a build without CUDA");
#endif
  }

  // 3. AdamW over this rank's range (clipping is done: max_grad_norm 0).
  if (n > 0) {
    const AdamWParams p{.lr = lr,
                        .beta1 = cfg_.beta1,
                        .beta2 = cfg_.beta2,
                        .eps = cfg_.eps,
                        .weight_decay = cfg_.weight_decay,
                        .step = step_ + 1,
                        .max_grad_norm = 0.0f};
    const int64_t ni = static_cast<int64_t>(n);
    adamw_step(p, *table_, range(w, b, n), range(g, b, n),
               params.has_master() ? range(params.master(), b, n) : Tensor(), m_.view(DType::F32, {ni}),
               v_.view(DType::F32, {ni}), Tensor(), *ctx_);
  }

  // 4. Every rank's updated range to every rank.
  {
    CommHandle blocks, rest;
    if (c > 0) blocks = grads_->all_gather_async(range(w, rank_ * c, c), range(w, 0, N * c));
    if (tail > 0) rest = grads_->broadcast_async(range(w, layout_.tail_begin(), tail), N - 1);
    blocks.wait();
    rest.wait();
  }
  ++step_;
}

double ZeroAdamW::read_grad_norm() const {
  float v = 0;
  copy_bytes(&v, Device::cpu(), norm_.data(), norm_.device(), sizeof v, *ctx_);
  return v;
}

void ZeroAdamW::gather_f32_params(ParamBuffer& params) {
  // With master weights only this rank's range of them is current (step() all-gathers the compute-dtype copy);
  // an f32 model's params are their own master and are whole already.
  if (!params.has_master()) return;
  const int N = layout_.world;
  const size_t c = layout_.chunk, tail = layout_.total - layout_.tail_begin();
  const Tensor master = params.master();
  CommHandle blocks, rest;
  if (c > 0) blocks = grads_->all_gather_async(range(master, rank_ * c, c), range(master, 0, N * c));
  if (tail > 0) rest = grads_->broadcast_async(range(master, layout_.tail_begin(), tail), N - 1);
  blocks.wait();
  rest.wait();
}

void ZeroAdamW::read_state(ParamBuffer& params, std::vector<float>& m, std::vector<float>& v) {
  gather_f32_params(params);
  const size_t n = layout_.count(rank_);
  std::vector<size_t> counts(static_cast<size_t>(layout_.world));
  for (int r = 0; r < layout_.world; ++r) counts[r] = layout_.count(r);
  std::vector<float> mine(n);
  const bool root = rank_ == 0;
  for (auto [moment, out] : {std::pair{&m_, &m}, std::pair{&v_, &v}}) {
    if (n > 0) copy_bytes(mine.data(), Device::cpu(), moment->data(), moment->device(), n * 4, *ctx_);
    out->assign(root ? layout_.total : 0, 0.0f);
    host_->gather_to_root(mine.data(), counts, root ? out->data() : nullptr, /*root=*/0);
  }
}

void ZeroAdamW::load_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) {
  TS_CHECK(m.size() == layout_.total && v.size() == layout_.total, "optimizer state holds ", m.size(),
           " moments, the model ", layout_.total);
  TS_CHECK(step >= 0, "optimizer state: negative step ", step);
  const size_t b = shard_begin(), n = layout_.count(rank_);
  if (n > 0) {
    copy_bytes(m_.data(), m_.device(), m.data() + b, Device::cpu(), n * 4, *ctx_);
    copy_bytes(v_.data(), v_.device(), v.data() + b, Device::cpu(), n * 4, *ctx_);
  }
  ctx_->synchronize();
  step_ = step;
}

}  // namespace tessera
