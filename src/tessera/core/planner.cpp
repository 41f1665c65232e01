#include "tessera/core/planner.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera {

MemoryPlan::MemoryPlan(size_t align) : align_(align) {
  TS_CHECK(align > 0 && (align & (align - 1)) == 0 && align <= kMaxTotal,
           "memory plan: alignment must be a power of two up to ", kMaxTotal, ", got ", align);
}

int MemoryPlan::add(std::string name, size_t bytes, int first, int last) {
  TS_CHECK(first >= 0 && first <= last, "memory plan: buffer ", name, " has the life [", first, ", ", last,
           "]; a life runs from its first event to its last, both >= 0");
  // bytes <= kMaxTotal first, so that its rounding cannot wrap.
  TS_CHECK(bytes <= kMaxTotal && align_up(bytes) <= kMaxTotal - total_, "memory plan: buffer ", name, " (", bytes,
           " bytes) takes the plan past ", kMaxTotal, " bytes (1 EiB), more than any machine holds");
  PlanBuffer b;
  b.name = std::move(name);
  b.bytes = bytes;
  b.size = align_up(bytes);
  total_ += b.size;
  b.first = first;
  b.last = last;
  buffers_.push_back(std::move(b));
  num_events_ = std::max(num_events_, last + 1);
  assigned_ = false;
  peak_ = 0;
  return static_cast<int>(buffers_.size() - 1);
}

int MemoryPlan::add_fixed(std::string name, size_t bytes, int first, int last, size_t offset) {
  TS_CHECK(offset <= kMaxTotal && bytes <= kMaxTotal - offset, "memory plan: fixed buffer ", name, " at ", offset, " (",
           bytes, " bytes) ends past ", kMaxTotal, " bytes (1 EiB), more than any machine holds");
  const int id = add(std::move(name), bytes, first, last);
  PlanBuffer& b = buffers_.back();
  total_ -= b.size - bytes;  // a fixed buffer occupies its bytes exactly
  b.size = bytes;
  b.offset = offset;
  b.fixed = true;
  return id;
}

void MemoryPlan::assign(bool reuse) {
  peak_ = 0;
  std::vector<int> placed;  // ids already placed: the fixed ones first
  for (int i = 0; i < static_cast<int>(buffers_.size()); ++i) {
    const PlanBuffer& b = buffers_[i];
    if (!b.fixed) continue;
    for (int p : placed)
      TS_CHECK(!(b.lives_overlap(buffers_[p]) && b.memory_overlaps(buffers_[p])), "memory plan: the fixed buffers ",
               buffers_[p].name, " and ", b.name, " are live together in the same memory");
    placed.push_back(i);
    peak_ = std::max(peak_, b.offset + b.size);
  }
  if (!reuse) {
    peak_ = align_up(peak_);
    for (PlanBuffer& b : buffers_) {
      if (b.fixed) continue;
      b.offset = peak_;
      peak_ += b.size;
    }
    assigned_ = true;
    return;
  }
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(buffers_.size()); ++i)
    if (!buffers_[i].fixed) order.push_back(i);
  // Largest first; equal sizes in order of first use, which makes the placement optimal when all sizes are
  // equal (first fit by start time colours an interval graph with as many colours as its largest clique).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const PlanBuffer &x = buffers_[a], &y = buffers_[b];
    if (x.size != y.size) return x.size > y.size;
    return x.first < y.first;
  });
  peak_ = first_fit(order, placed, peak_);
  if (placed.empty()) {
    assigned_ = true;
    return;
  }
  // Around fixed buffers, largest first can fill the memory that only some buffers may use (a model's gradients
  // that are born late) with buffers that could have gone elsewhere, and push the ones with no other room above
  // everything. Those are the buffers that die last, so first fit in order of death, latest first, is tried too,
  // and the lower peak kept.
  std::vector<size_t> by_size(buffers_.size());
  for (size_t i = 0; i < buffers_.size(); ++i) by_size[i] = buffers_[i].offset;
  const size_t size_peak = peak_;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const PlanBuffer &x = buffers_[a], &y = buffers_[b];
    if (x.last != y.last) return x.last > y.last;
    return x.size > y.size;
  });
  size_t fixed_top = 0;
  for (int p : placed) fixed_top = std::max(fixed_top, buffers_[p].offset + buffers_[p].size);
  peak_ = first_fit(order, placed, fixed_top);
  if (peak_ > size_peak) {
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].offset = by_size[i];
    peak_ = size_peak;
  }
  assigned_ = true;
}

size_t MemoryPlan::first_fit(const std::vector<int>& order, std::vector<int> placed, size_t peak) {
  std::vector<int> colliders;  // of those placed, the ones whose lives overlap the buffer being placed
  for (int id : order) {
    PlanBuffer& b = buffers_[id];
    b.offset = 0;
    if (b.size == 0) continue;
    colliders.clear();
    for (int p : placed)
      if (buffers_[p].lives_overlap(b)) colliders.push_back(p);
    std::sort(colliders.begin(), colliders.end(),
              [&](int x, int y) { return buffers_[x].offset < buffers_[y].offset; });
    // First fit: walk the colliders in offset order; the candidate moves past each one it would overlap. The
    // colliders may overlap each other in memory (their own lives are disjoint), hence the max; a fixed one may
    // end off the alignment, hence the rounding.
    size_t at = 0;
    for (int p : colliders) {
      const PlanBuffer& c = buffers_[p];
      if (c.size == 0) continue;
      if (at + b.size <= c.offset) break;
      at = std::max(at, align_up(c.offset + c.size));
    }
    b.offset = at;
    peak = std::max(peak, at + b.size);
    placed.push_back(id);
  }
  return peak;
}

size_t MemoryPlan::peak() const {
  TS_CHECK(assigned_, "internal: memory plan read before assign()");
  return peak_;
}

size_t MemoryPlan::total() const { return total_; }

std::vector<size_t> MemoryPlan::live_bytes() const {
  // A difference array over the events: +size at first, -size after last.
  std::vector<long long> diff(static_cast<size_t>(num_events_) + 1, 0);
  for (const PlanBuffer& b : buffers_) {
    diff[b.first] += static_cast<long long>(b.size);
    diff[b.last + 1] -= static_cast<long long>(b.size);
  }
  std::vector<size_t> live(static_cast<size_t>(num_events_));
  long long run = 0;
  for (int e = 0; e < num_events_; ++e) {
    run += diff[e];
    live[e] = static_cast<size_t>(run);
  }
  return live;
}

LiveSet MemoryPlan::max_live() const {
  LiveSet m;
  const std::vector<size_t> live = live_bytes();
  for (int e = 0; e < static_cast<int>(live.size()); ++e) {
    if (m.event < 0 || live[e] > m.bytes) m = {live[e], e};
  }
  return m;
}

}  // namespace tessera
