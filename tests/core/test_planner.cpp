// The lifetime planner and the arena it is laid over: placements that never overlap two buffers live at the same event,
// the bounds max_live <= peak <= total, the first-fit rule itself, and the awkward cases.
#include <algorithm>
#include <random>

#include "tessera/core/arena.h"
#include "tessera/core/error.h"
#include "tessera/core/planner.h"
#include "test_util.h"

namespace tessera {
namespace {

// "prefix<i>" (std::string(prefix).append(...) rather than "lit" + std::string, on which GCC 12 warns falsely).
std::string name(const char* prefix, int i) { return std::string(prefix).append(std::to_string(i)); }

// Random buffers: sizes from 0 to a few KiB (unaligned, some zero, some equal), lives within `events` events.
MemoryPlan random_plan(std::mt19937_64& rng, int n, int events, size_t align) {
  MemoryPlan plan(align);
  std::uniform_int_distribution<int> ev(0, events - 1), kind(0, 9);
  std::uniform_int_distribution<size_t> bytes(1, 5000);
  for (int i = 0; i < n; ++i) {
    int a = ev(rng), b = ev(rng);
    if (a > b) std::swap(a, b);
    const int k = kind(rng);
    const size_t sz = k == 0 ? 0 : k == 1 ? 1024 : bytes(rng);  // zero-size and repeated sizes on purpose
    plan.add(name("b", i), sz, a, b);
  }
  return plan;
}

// No two buffers live at the same event share a byte; returns the highest end of any buffer.
size_t expect_live_buffers_apart(const MemoryPlan& plan) {
  const auto& bufs = plan.buffers();
  size_t top = 0;
  for (size_t i = 0; i < bufs.size(); ++i) {
    const PlanBuffer& b = bufs[i];
    top = std::max(top, b.offset + b.size);
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      if (b.lives_overlap(bufs[j])) {
        EXPECT_FALSE(b.memory_overlaps(bufs[j])) << b.name << " and " << bufs[j].name << " are live together";
      }
    }
  }
  return top;
}

// Checks everything a valid placement must satisfy, and that each buffer sits at the lowest offset the greedy
// rule allows: every lower candidate (0, or the end of some buffer) collides with a buffer placed before it.
void expect_valid_first_fit(const MemoryPlan& plan) {
  const auto& bufs = plan.buffers();
  for (const PlanBuffer& b : bufs) {
    EXPECT_EQ(b.offset % plan.align(), 0u) << b.name;
    EXPECT_EQ(b.size % plan.align(), 0u) << b.name;
    EXPECT_GE(b.size, b.bytes) << b.name;
  }
  EXPECT_EQ(plan.peak(), expect_live_buffers_apart(plan));
  EXPECT_GE(plan.peak(), plan.max_live().bytes);
  EXPECT_LE(plan.peak(), plan.total());

  auto placed_before = [&](size_t p, size_t q) {  // is p placed before q in the greedy order?
    const PlanBuffer &x = bufs[p], &y = bufs[q];
    if (x.size != y.size) return x.size > y.size;
    if (x.first != y.first) return x.first < y.first;
    return p < q;
  };
  for (size_t i = 0; i < bufs.size(); ++i) {
    const PlanBuffer& b = bufs[i];
    if (b.size == 0) {
      EXPECT_EQ(b.offset, 0u);
      continue;
    }
    std::vector<size_t> candidates{0};
    for (const PlanBuffer& o : bufs) candidates.push_back(o.offset + o.size);
    for (size_t c : candidates) {
      if (c >= b.offset) continue;
      PlanBuffer moved = b;
      moved.offset = c;
      bool blocked = false;
      for (size_t j = 0; j < bufs.size() && !blocked; ++j)
        blocked = j != i && placed_before(j, i) && bufs[j].lives_overlap(b) && moved.memory_overlaps(bufs[j]);
      EXPECT_TRUE(blocked) << b.name << " at " << b.offset << " would have fitted lower, at " << c;
    }
  }
}

TEST(MemoryPlan, RandomLivesNeverShareMemoryWhileLive) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 60), events = 1 + static_cast<int>(rng() % 40);
    MemoryPlan plan = random_plan(rng, n, events, trial % 2 ? 256 : 16);
    plan.assign();
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_valid_first_fit(plan);
  }
}

// With equal sizes, greedy placement is interval-graph colouring by start time, which is optimal: the arena is
// exactly the largest live set.
TEST(MemoryPlan, EqualSizesPackToTheLargestLiveSet) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 100; ++trial) {
    MemoryPlan plan(16);
    const int n = 1 + static_cast<int>(rng() % 80), events = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      int a = static_cast<int>(rng() % events), b = static_cast<int>(rng() % events);
      if (a > b) std::swap(a, b);
      plan.add(name("b", i), 48, a, b);  // 48 bytes: rounded up to 48, a multiple of 16
    }
    plan.assign();
    EXPECT_EQ(plan.peak(), plan.max_live().bytes) << "trial " << trial;
  }
}

// Random sets with a wide spread of sizes: how far greedy lands above the lower bound. Not a theorem (first fit
// has bad worst cases; single sets reach 1.24), so the mean over many sets is what must hold.
TEST(MemoryPlan, RandomPlansStayNearTheLowerBound) {
  std::mt19937_64 rng(test::test_seed());
  double sum_ratio = 0;
  const int trials = 300;
  for (int trial = 0; trial < trials; ++trial) {
    MemoryPlan plan = random_plan(rng, 40, 30, 16);
    plan.assign();
    sum_ratio += static_cast<double>(plan.peak()) / static_cast<double>(std::max<size_t>(plan.max_live().bytes, 1));
  }
  EXPECT_LT(sum_ratio / trials, 1.10);  // about 1.03 measured over many seeds
}

TEST(MemoryPlan, HandPlacedExample) {
  // Events 0..3. `big` lives [0, 1]; `late` [2, 3] reuses its memory; `mid` [1, 2] overlaps both in time and
  // goes above them; `small` [3, 3] fits in the space `big` left beyond `late`.
  MemoryPlan plan(16);
  const int big = plan.add("big", 100, 0, 1);     // 112 bytes
  const int late = plan.add("late", 64, 2, 3);    // 64
  const int mid = plan.add("mid", 32, 1, 2);      // 32
  const int small = plan.add("small", 16, 3, 3);  // 16
  plan.assign();
  EXPECT_EQ(plan[big].offset, 0u);
  EXPECT_EQ(plan[mid].offset, 112u);
  EXPECT_EQ(plan[late].offset, 0u);
  EXPECT_EQ(plan[small].offset, 64u);
  EXPECT_EQ(plan.peak(), 144u);
  EXPECT_EQ(plan.total(), 224u);
  EXPECT_EQ(plan.max_live().bytes, 144u);  // event 1: big + mid
  EXPECT_EQ(plan.max_live().event, 1);
  EXPECT_EQ(plan.live_bytes(), (std::vector<size_t>{112, 144, 96, 80}));
}

TEST(MemoryPlan, AwkwardCases) {
  {  // identical lives: nothing can share, the buffers stack
    MemoryPlan plan(256);
    for (int i = 0; i < 5; ++i) plan.add(name("same", i), 300, 2, 4);
    plan.assign();
    EXPECT_EQ(plan.peak(), plan.total());
    EXPECT_EQ(plan.peak(), 5u * 512u);
    expect_valid_first_fit(plan);
  }
  {  // a chain of disjoint lives: all share the largest one's memory
    MemoryPlan plan(16);
    for (int i = 0; i < 6; ++i) plan.add(name("c", i), 16 * (i + 1), i, i);
    plan.assign();
    EXPECT_EQ(plan.peak(), 96u);
    for (const PlanBuffer& b : plan.buffers()) EXPECT_EQ(b.offset, 0u);
  }
  {  // zero-size buffers take no memory, wherever they live
    MemoryPlan plan(16);
    plan.add("empty", 0, 0, 9);
    plan.add("x", 20, 3, 5);
    plan.add("empty2", 0, 3, 5);
    plan.assign();
    EXPECT_EQ(plan.peak(), 32u);
    EXPECT_EQ(plan.total(), 32u);
    expect_valid_first_fit(plan);
  }
  {  // only zero-size buffers, and no buffers at all
    MemoryPlan plan(16), none(16);
    plan.add("empty", 0, 0, 0);
    plan.assign();
    none.assign();
    EXPECT_EQ(plan.peak(), 0u);
    EXPECT_EQ(none.peak(), 0u);
    EXPECT_EQ(none.max_live().event, -1);
  }
  {  // no reuse: every buffer has its own range, in order
    MemoryPlan plan(16);
    plan.add("a", 10, 0, 0);
    plan.add("b", 10, 1, 1);
    plan.assign(/*reuse=*/false);
    EXPECT_EQ(plan[1].offset, 16u);
    EXPECT_EQ(plan.peak(), 32u);
  }
  {  // bad input
    MemoryPlan plan(16);
    EXPECT_THROW(plan.add("backwards", 8, 3, 2), Error);
    EXPECT_THROW(plan.add("negative", 8, -1, 2), Error);
    EXPECT_THROW(MemoryPlan(24), Error);
    EXPECT_THROW(plan.peak(), Error);  // before assign()
  }
}

// Sizes near 2^64 wrapped: a buffer of SIZE_MAX bytes rounded up to 0, and info printed sums below the peak. A plan
// holds at most kMaxTotal (1 EiB); what would pass it is refused, and the plan keeps what it had.
TEST(MemoryPlan, RefusesToGrowPastOneExbibyte) {
  constexpr size_t kMax = MemoryPlan::kMaxTotal;
  MemoryPlan plan(256);
  EXPECT_THROW(plan.add("wraps", SIZE_MAX, 0, 1), Error);
  EXPECT_THROW(plan.add("just past", kMax + 1, 0, 1), Error);
  plan.add("half", kMax / 2, 0, 1);
  plan.add("a byte", 1, 1, 2);
  EXPECT_THROW(plan.add("the other half", kMax / 2, 2, 3), Error);  // 256 more than fit
  plan.add("the rest", kMax / 2 - 256, 2, 3);
  EXPECT_EQ(plan.total(), kMax);
  EXPECT_THROW(plan.add("one more", 1, 0, 0), Error);
  EXPECT_THROW(plan.add_fixed("high", 16, 0, 0, kMax - 8), Error);
  EXPECT_THROW(plan.add_fixed("wrapping", 16, 0, 0, SIZE_MAX - 8), Error);
  EXPECT_EQ(plan.size(), 3u);
  plan.assign();
  EXPECT_EQ(plan.peak(), kMax / 2 + 256);  // "the rest" shares "half"'s memory, after "a byte"'s life
  expect_valid_first_fit(plan);
  MemoryPlan fixed(256);
  fixed.add_fixed("grads", 1000, 0, 3, kMax - 1000);  // ends exactly at the limit, unrounded
  EXPECT_EQ(fixed.total(), 1000u);
  EXPECT_THROW(fixed.add("next", kMax - 1000, 0, 0), Error);  // rounded, it would pass
  fixed.add("next", kMax - 1024, 0, 0);
  EXPECT_EQ(fixed.total(), kMax - 24);
}

// Fixed buffers (a model's flat gradients) keep their offsets, unaligned ones included; the others use their
// memory outside their lives and go around them during them.
TEST(MemoryPlan, FixedBuffersStayAndOthersFitAround) {
  {
    MemoryPlan plan(256);
    const int grad = plan.add_fixed("grad", 1000, 5, 9, 0);
    const int early = plan.add("early", 512, 0, 4);  // dead before grad is born: inside its memory
    const int late = plan.add("late", 300, 6, 8);    // live with grad: above it, at the aligned end of 1000
    const int span = plan.add("span", 256, 3, 6);    // live with all three
    plan.assign();
    EXPECT_EQ(plan[grad].offset, 0u);
    EXPECT_EQ(plan[early].offset, 0u);
    EXPECT_EQ(plan[late].offset, 1024u);
    EXPECT_EQ(plan[span].offset, 1536u);
    EXPECT_EQ(plan.peak(), 1792u);
    plan.assign(/*reuse=*/false);
    EXPECT_EQ(plan[grad].offset, 0u);
    EXPECT_EQ(plan[early].offset, 1024u);  // without reuse: above the fixed buffers, in order
    EXPECT_EQ(plan[span].offset, 2048u);
    EXPECT_EQ(plan.peak(), 2304u);
  }
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int events = 2 + static_cast<int>(rng() % 30);
    MemoryPlan plan = random_plan(rng, 1 + static_cast<int>(rng() % 40), events, 16);
    // Fixed buffers side by side from an unaligned start, each with a random life ending at the last event.
    std::vector<size_t> at;
    size_t next = rng() % 100;
    for (int i = 0; i < 1 + static_cast<int>(rng() % 6); ++i) {
      const size_t bytes = 1 + rng() % 3000;
      at.push_back(next);
      plan.add_fixed(name("fixed", i), bytes, static_cast<int>(rng() % events), events - 1, next);
      next += bytes;
    }
    plan.assign();
    size_t fixed_seen = 0;
    for (const PlanBuffer& b : plan.buffers()) {
      if (b.fixed) {
        EXPECT_EQ(b.offset, at[fixed_seen++]) << b.name;
      } else {
        EXPECT_EQ(b.offset % plan.align(), 0u) << b.name;
      }
    }
    EXPECT_EQ(plan.peak(), expect_live_buffers_apart(plan));
    EXPECT_GE(plan.peak(), plan.max_live().bytes);
  }
  {  // fixed buffers live together in the same memory: refused
    MemoryPlan plan(16);
    plan.add_fixed("a", 100, 0, 5, 0);
    plan.add_fixed("b", 100, 5, 6, 50);
    EXPECT_THROW(plan.assign(), Error);
  }
}

// The arena hands out views at planned offsets, aligned, and refuses any block that does not lie inside it.
TEST(Arena, ViewsAtPlannedOffsets) {
  MemoryPlan plan(Arena::kAlign);
  const int a = plan.add("a", 10 * sizeof(float), 0, 1), b = plan.add("b", 300, 1, 2), c = plan.add("c", 40, 2, 2);
  plan.assign();
  Arena arena(plan.peak());
  EXPECT_EQ(arena.capacity(), plan.peak());
  const Tensor ta = arena.tensor_at(plan[a].offset, DType::F32, {2, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta.data()) % Arena::kAlign, 0u);
  EXPECT_EQ(ta.numel(), 10);
  // c reuses a's memory (their lives are disjoint); b, live with both, does not.
  EXPECT_EQ(arena.at(plan[c].offset, 40), ta.data());
  EXPECT_NE(arena.at(plan[b].offset, 300), ta.data());
  EXPECT_THROW(arena.at(plan.peak() - 16, 32), Error);
  EXPECT_THROW(arena.at(plan.peak() + 1, 0), Error);
  EXPECT_THROW(arena.at(static_cast<size_t>(-1), 2), Error);  // no wrap-around
  EXPECT_THROW(arena.tensor_at(0, DType::F32, {int64_t(plan.peak())}), Error);
}

}  // namespace
}  // namespace tessera
