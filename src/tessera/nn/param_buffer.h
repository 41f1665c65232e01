// tessera/nn/param_buffer.h — every parameter of a model in one contiguous buffer, gradients in a second.
//
// A segment table gives each tensor its name, shape, offset and whether weight decay applies. One contiguous
// space is what lets one optimizer call update every parameter, lets data-parallel training all-reduce the
// gradients in place, and lets ZeRO-1 shard by ranges.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/ops/optim/adamw.h"

namespace tessera {

constexpr size_t kNoParam = static_cast<size_t>(-1);

template <typename Real>
class ParamBuffer {
 public:
  // Reserves a segment; returns its offset. Call finalize() once all are added.
  size_t add(const std::string& name, std::vector<int64_t> shape, bool decay) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    ParamSegment seg{name, total_, static_cast<size_t>(n), decay};
    segments_.push_back(seg);
    shapes_.push_back(std::move(shape));
    total_ += static_cast<size_t>(n);
    return seg.offset;
  }
  void finalize() {
    data_.assign(total_, Real(0));
    grad_.assign(total_, Real(0));
  }

  size_t size() const { return total_; }
  Real* data() { return data_.data(); }
  const Real* data() const { return data_.data(); }
  Real* grad() { return grad_.data(); }
  const Real* grad() const { return grad_.data(); }
  Real* data_at(size_t off) { return off == kNoParam ? nullptr : data_.data() + off; }
  Real* grad_at(size_t off) { return off == kNoParam ? nullptr : grad_.data() + off; }
  void zero_grad() { std::fill(grad_.begin(), grad_.end(), Real(0)); }

  const std::vector<ParamSegment>& segments() const { return segments_; }
  const std::vector<int64_t>& shape(size_t i) const { return shapes_[i]; }
  // Index of the segment called `name`, or -1.
  int find(const std::string& name) const {
    for (size_t i = 0; i < segments_.size(); ++i)
      if (segments_[i].name == name) return static_cast<int>(i);
    return -1;
  }

 private:
  std::vector<ParamSegment> segments_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<Real> data_, grad_;
  size_t total_ = 0;
};

}  // namespace tessera
