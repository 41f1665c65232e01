#include "tessera/dist/ddp.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera {

DdpMode ddp_mode_from_name(const std::string& name) {
  if (name == "naive") return DdpMode::Naive;
  if (name == "flat") return DdpMode::Flat;
  if (name == "overlap") return DdpMode::Overlap;
  if (name == "bucket") return DdpMode::Bucket;
  TS_THROW("--ddp: unknown form '", name, "' (expected naive, flat, overlap or bucket)");
}

const char* ddp_mode_name(DdpMode mode) {
  switch (mode) {
    case DdpMode::Naive: return "naive";
    case DdpMode::Flat: return "flat";
    case DdpMode::Overlap: return "overlap";
    case DdpMode::Bucket: return "bucket";
  }
  return "?";
}

namespace {
std::vector<size_t> by_descending_offset(const ParamBuffer& params) {
  const auto& segs = params.segments();
  std::vector<size_t> order(segs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return segs[a].offset > segs[b].offset; });
  return order;
}
}  // namespace

std::vector<GradRange> plan_buckets(const ParamBuffer& params, size_t bucket_bytes) {
  const auto& segs = params.segments();
  const size_t esize = dtype_size(params.dtype());
  std::vector<GradRange> buckets;
  size_t hi = params.size(), bytes = 0;
  for (size_t i : by_descending_offset(params)) {
    bytes += segs[i].numel * esize;
    if (bytes >= bucket_bytes) {
      buckets.push_back({segs[i].offset, hi});
      hi = segs[i].offset;
      bytes = 0;
    }
  }
  // What is left below the last closed bucket (or everything, when no bucket filled) is the last bucket.
  if (hi > 0) buckets.push_back({0, hi});
  return buckets;
}

GradSync::GradSync(Communicator& comm, const ParamBuffer& params, DdpMode mode, double bucket_mb)
    : comm_(&comm), params_(&params), mode_(mode) {
  TS_CHECK(comm.device() == params.device(), "DDP: the gradients are on ", params.device().str(),
           " but the communicator works on ", comm.device().str());
  TS_CHECK(bucket_mb > 0, "--bucket-mb must be positive, got ", bucket_mb);
  if (mode == DdpMode::Bucket) buckets_ = plan_buckets(params, static_cast<size_t>(bucket_mb * 1e6));
  order_ = by_descending_offset(params);
}

void GradSync::begin_backward(Model& model, bool sync) {
  TS_CHECK(&model.params() == params_, "internal: DDP prepared for another model");
  TS_CHECK(pending_.empty(), "internal: DDP: the previous step's reductions were not waited for");
  frontier_ = params_->size();
  next_ = 0;
  if (sync && (mode_ == DdpMode::Overlap || mode_ == DdpMode::Bucket))
    model.set_grad_ready_hook([this](size_t begin, size_t end) { on_grad_ready(begin, end); });
  else model.set_grad_ready_hook(nullptr);
}

void GradSync::start(size_t begin, size_t end) {
  const Tensor grads = params_->grad().slice1d(static_cast<int64_t>(begin), static_cast<int64_t>(end - begin));
  pending_.push_back(comm_->all_reduce_async(grads, ReduceOp::Avg));
}

void GradSync::on_grad_ready(size_t begin, size_t end) {
  TS_CHECK(end == frontier_ && begin < end, "internal: backward reported gradients [", begin, ", ", end,
           ") out of order (final from ", frontier_, " up)");
  frontier_ = begin;
  if (mode_ == DdpMode::Bucket) {
    for (; next_ < buckets_.size() && buckets_[next_].begin >= frontier_; ++next_)
      start(buckets_[next_].begin, buckets_[next_].end);
  } else {
    const auto& segs = params_->segments();
    for (; next_ < order_.size() && segs[order_[next_]].offset >= frontier_; ++next_) {
      const ParamSegment& s = segs[order_[next_]];
      if (s.numel > 0) start(s.offset, s.offset + s.numel);
    }
  }
  // MPI moves a non-blocking collective forward only inside its calls: poke the ones in flight while backward
  // goes on (a no-op for the GPU's, which run on their own stream).
  for (CommHandle& h : pending_) h.test();
}

void GradSync::end_backward(Model& model, bool sync) {
  model.set_grad_ready_hook(nullptr);
  if (!sync) return;
  switch (mode_) {
    case DdpMode::Naive:
      for (const ParamSegment& s : params_->segments())
        if (s.numel > 0) comm_->all_reduce(params_->grad_at(s.offset, static_cast<int64_t>(s.numel)), ReduceOp::Avg);
      break;
    case DdpMode::Flat: comm_->all_reduce(params_->grad(), ReduceOp::Avg); break;
    case DdpMode::Overlap:
    case DdpMode::Bucket:
      TS_CHECK(frontier_ == 0, "internal: backward reported gradients final only from ", frontier_, " up");
      for (CommHandle& h : pending_) h.wait();
      pending_.clear();
      break;
  }
}

}  // namespace tessera
