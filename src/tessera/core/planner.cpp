#include "tessera/core/planner.h"

#include <algorithm>
#include <numeric>

#include "tessera/core/error.h"

namespace tessera {

MemoryPlan::MemoryPlan(size_t align) : align_(align) {
  TS_CHECK(align > 0 && (align & (align - 1)) == 0, "memory plan: alignment must be a power of two, got ", align);
}

int MemoryPlan::add(std::string name, size_t bytes, int first, int last) {
  TS_CHECK(first >= 0 && first <= last, "memory plan: buffer ", name, " has the life [", first, ", ", last,
           "]; a life runs from its first event to its last, both >= 0");
  PlanBuffer b;
  b.name = std::move(name);
  b.bytes = bytes;
  b.size = align_up(bytes);
  b.first = first;
  b.last = last;
  buffers_.push_back(std::move(b));
  num_events_ = std::max(num_events_, last + 1);
  assigned_ = false;
  peak_ = 0;
  return static_cast<int>(buffers_.size() - 1);
}

void MemoryPlan::assign(bool reuse) {
  peak_ = 0;
  if (!reuse) {
    for (PlanBuffer& b : buffers_) {
      b.offset = peak_;
      peak_ += b.size;
    }
    assigned_ = true;
    return;
  }
  std::vector<int> order(buffers_.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; equal sizes in order of first use, which makes the placement optimal when all sizes are
  // equal (first fit by start time colours an interval graph with as many colours as its largest clique).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const PlanBuffer &x = buffers_[a], &y = buffers_[b];
    if (x.size != y.size) return x.size > y.size;
    return x.first < y.first;
  });
  std::vector<int> placed;       // ids already placed
  std::vector<int> colliders;    // of those, the ones whose lives overlap the buffer being placed
  for (int id : order) {
    PlanBuffer& b = buffers_[id];
    b.offset = 0;
    if (b.size == 0) continue;
    colliders.clear();
    for (int p : placed)
      if (buffers_[p].lives_overlap(b)) colliders.push_back(p);
    std::sort(colliders.begin(), colliders.end(), [&](int x, int y) { return buffers_[x].offset < buffers_[y].offset; });
    // First fit: walk the colliders in offset order; the candidate moves past each one it would overlap. The
    // colliders may overlap each other in memory (their own lives are disjoint), hence the max.
    size_t at = 0;
    for (int p : colliders) {
      const PlanBuffer& c = buffers_[p];
      if (at + b.size <= c.offset) break;
      at = std::max(at, c.offset + c.size);
    }
    b.offset = at;
    peak_ = std::max(peak_, at + b.size);
    placed.push_back(id);
  }
  assigned_ = true;
}

size_t MemoryPlan::peak() const {
  TS_CHECK(assigned_, "internal: memory plan read before assign()");
  return peak_;
}

size_t MemoryPlan::total() const {
  size_t s = 0;
  for (const PlanBuffer& b : buffers_) s += b.size;
  return s;
}

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
