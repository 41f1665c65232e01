// tessera/core/planner.h — memory planned by lifetime: buffers whose lives do not overlap share memory.
//
// Each buffer of a step declares its size and its life: the first and the last event that use it, inclusive, in
// a step-ordered index of events (for a model: one event per op of the forward and of the backward). Two buffers
// live at the same event must not share a byte; two whose lives are disjoint may. `MemoryPlan::assign` places
// every buffer in one arena, greedy by size as TFLite's arena planner and ggml-alloc do:
//
//   sort the buffers by aligned size, largest first (equal sizes: earlier first event first, then the order
//   they were added); place each at the lowest aligned offset where it overlaps in memory no buffer already
//   placed whose life overlaps its own.
//
// Two bounds frame the result:  max_live() <= peak() <= total().  max_live() is the most bytes live at one
// event; no placement can use less, because those buffers are pairwise live together. total() is the sum of all
// buffers: what an arena without reuse needs. Sizes are rounded up to `align` so that every offset stays aligned
// (the kernels' 16-byte vector accesses need 16; the arena uses 256, the cudaMalloc alignment). A zero-size
// buffer takes no memory: it sits at offset 0 and collides with nothing.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

struct PlanBuffer {
  std::string name;
  size_t bytes = 0;   // as declared
  size_t size = 0;    // rounded up to the plan's alignment: the memory it occupies
  int first = 0;      // first event that uses it
  int last = 0;       // last event that uses it (inclusive)
  size_t offset = 0;  // from assign()

  bool live_at(int event) const { return first <= event && event <= last; }
  bool lives_overlap(const PlanBuffer& o) const { return first <= o.last && o.first <= last; }
  bool memory_overlaps(const PlanBuffer& o) const {
    return size > 0 && o.size > 0 && offset < o.offset + o.size && o.offset < offset + size;
  }
};

// The most memory live at one event, and the first event where it is reached (-1 for an empty plan).
struct LiveSet {
  size_t bytes = 0;
  int event = -1;
};

class MemoryPlan {
 public:
  static constexpr size_t kDefaultAlign = 256;

  explicit MemoryPlan(size_t align = kDefaultAlign);

  // Declares a buffer living from event `first` to event `last` (inclusive); returns its id (0, 1, ...).
  int add(std::string name, size_t bytes, int first, int last);

  // Places every buffer (greedy by size, above). With reuse = false each buffer gets a range of its own, in the
  // order they were added (peak() == total()): the reference a debug run compares the shared plan against.
  void assign(bool reuse = true);

  size_t align() const { return align_; }
  size_t size() const { return buffers_.size(); }
  const PlanBuffer& operator[](int id) const { return buffers_.at(static_cast<size_t>(id)); }
  const std::vector<PlanBuffer>& buffers() const { return buffers_; }
  int num_events() const { return num_events_; }  // 1 + the largest event declared

  size_t peak() const;   // bytes the arena needs: the end of the highest buffer (after assign)
  size_t total() const;                  // Σ aligned sizes
  LiveSet max_live() const;
  // Bytes live at each event 0 .. num_events()-1 (the memory timeline of a step).
  std::vector<size_t> live_bytes() const;

  size_t align_up(size_t n) const { return (n + align_ - 1) / align_ * align_; }

 private:
  size_t align_;
  std::vector<PlanBuffer> buffers_;
  int num_events_ = 0;
  size_t peak_ = 0;
  bool assigned_ = false;
};

}  // namespace tessera
