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
//
// A fixed buffer (add_fixed) comes with its offset: memory laid out by someone else inside the arena, such as a
// model's flat gradient buffer, whose tensors must stay contiguous for one optimizer launch and one all-reduce.
// It occupies exactly [offset, offset + bytes) (no rounding: its neighbours are fixed too), is placed before
// everything else, and the others fit around it: into its memory outside its life, and above or below it during
// it. Fixed buffers whose lives overlap must not overlap in memory; assign() checks that. With fixed buffers the
// greedy also runs in a second order, latest death first, and keeps whichever peak is lower (planner.cpp).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

struct PlanBuffer {
  std::string name;
  size_t bytes = 0;    // as declared
  size_t size = 0;     // rounded up to the plan's alignment: the memory it occupies
  int first = 0;       // first event that uses it
  int last = 0;        // last event that uses it (inclusive)
  size_t offset = 0;   // from assign(), or given (fixed)
  bool fixed = false;  // placed by the caller (MemoryPlan::add_fixed)

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
  // The most the buffers of one plan may add up to (1 EiB, 2^60 bytes): no machine holds more, and below it no
  // offset, end or sum of the plan can overflow a size_t. add() refuses a buffer that would pass it.
  static constexpr size_t kMaxTotal = size_t{1} << 60;

  explicit MemoryPlan(size_t align = kDefaultAlign);

  // Declares a buffer living from event `first` to event `last` (inclusive); returns its id (0, 1, ...). Throws
  // when the buffers would add up to more than kMaxTotal.
  int add(std::string name, size_t bytes, int first, int last);
  // Declares a buffer at a given offset (fixed: assign() keeps it there); returns its id.
  int add_fixed(std::string name, size_t bytes, int first, int last, size_t offset);

  // Places every buffer (greedy by size, above). With reuse = false each buffer gets a range of its own, in the
  // order they were added, above the fixed ones (peak() == total() when there are none): the reference a debug
  // run compares the shared plan against.
  void assign(bool reuse = true);

  size_t align() const { return align_; }
  size_t size() const { return buffers_.size(); }
  const PlanBuffer& operator[](int id) const { return buffers_.at(static_cast<size_t>(id)); }
  const std::vector<PlanBuffer>& buffers() const { return buffers_; }
  int num_events() const { return num_events_; }  // 1 + the largest event declared

  size_t peak() const;   // bytes the arena needs: the end of the highest buffer (after assign)
  size_t total() const;  // Σ aligned sizes
  LiveSet max_live() const;
  // Bytes live at each event 0 .. num_events()-1 (the memory timeline of a step).
  std::vector<size_t> live_bytes() const;

  size_t align_up(size_t n) const { return (n + align_ - 1) / align_ * align_; }

 private:
  // Places the buffers of `order` one by one at the lowest offset clear of the `placed` ones live with it (and of
  // those placed before it); returns the highest end, at least `peak`.
  size_t first_fit(const std::vector<int>& order, std::vector<int> placed, size_t peak);

  size_t align_;
  std::vector<PlanBuffer> buffers_;
  int num_events_ = 0;
  size_t total_ = 0;  // Σ sizes so far, at most kMaxTotal
  size_t peak_ = 0;
  bool assigned_ = false;
};

}  // namespace tessera
