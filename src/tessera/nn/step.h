// tessera/nn/step.h — what the layers of a model share to run a training step: its events, the declaration of
// its activations, and the per-step values every layer's forward and backward reads.
//
// A step is a sequence of events, one per op. Each layer appends its forward ops to the schedule in forward order
// and its backward ops in backward order (the model calls schedule_forward on its layers first to last, then
// schedule_backward last to first), and keeps the event of its first op of each. Every activation buffer is then
// declared with the first and last event that use it (PlanBuilder), and the lifetime planner (core/planner.h)
// lays them out in one arena, so that buffers whose lives are disjoint share memory. As the step runs, each layer
// marks its ops (StepEnv::at), which is where a model checks the order and runs its plan's debug mode.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tessera/core/arena.h"
#include "tessera/core/context.h"
#include "tessera/core/planner.h"
#include "tessera/nn/param_buffer.h"
#include "tessera/ops/dispatch.h"  // stat_dtype
#include "tessera/ops/gemm/gemm.h"

namespace tessera {

enum class Phase { Forward, Backward };

// One op of a step: "forward layer 3 qkv" (name), its profiler range "qkv" (unique across forward and backward:
// backward ops that share a forward op's name get " bwd", the dW / dx ops are unique already), and the group it
// runs in ("layer 3"; empty for the ops outside the layers).
struct StepEvent {
  std::string name, range, group;
  Phase phase = Phase::Forward;
};

class StepSchedule {
 public:
  // Appends `ops` of `phase` within `group` (empty: none); returns the event of the first.
  int add(Phase phase, const std::string& group, std::initializer_list<const char*> ops);
  // The moment after the step (buffers that outlive it live until here): one past the ops added.
  int end() const { return static_cast<int>(events_.size()); }
  int num_events() const { return end() + 1; }
  // "end of step" for end().
  std::string name(int event) const;
  const std::vector<StepEvent>& events() const { return events_; }

 private:
  std::vector<StepEvent> events_;
};

// Debug and test settings of an activation plan. A model reads the first two from the environment when it is
// made (TESSERA_POISON_DEAD=1, TESSERA_PLAN_NO_REUSE=1), so that any run, `tessera train` included, can turn them
// on.
struct PlanDebug {
  // Fills every buffer with NaN (all bytes 0xff: NaN in f32, bf16, f16 and f64) at the end of its life, and
  // checks at the start of its life that it is still all NaN. A buffer read after its declared last use then
  // reads NaN, which reaches the loss or the gradients; a buffer written before its declared first use (over
  // memory that may belong to a live buffer) fails the check with an Error that names it. Every buffer but the
  // inputs and the loss is also filled before each step, so a read before the first write shows as well.
  bool poison_dead = false;
  // Gives every buffer memory of its own (peak = sum of all buffers): the reference a shared plan must match
  // bit for bit.
  bool no_reuse = false;
  // Test hooks that plant a bug in the declared lives, so that a test can show the debug mode catches it: the
  // buffer with this name is declared to die one event early, or to be born one event late.
  std::string plant_early_death = {};
  std::string plant_late_birth = {};
};
PlanDebug plan_debug_from_env();

// Collects the activation buffers of a step into a MemoryPlan, each with the Tensor it becomes once the plan has
// an offset for it (bind). Applies PlanDebug's planted bugs, and refuses, in the caller's terms, a batch whose
// buffers pass MemoryPlan::kMaxTotal before any size can wrap around 2^64. `reserved`: bytes to count from the
// start (a model's planned gradients, added last as fixed buffers, so that they cannot be the ones to pass it).
class PlanBuilder {
 public:
  PlanBuilder(MemoryPlan& mp, const PlanDebug& debug, int B, int T, size_t reserved = 0)
      : mp_(mp), debug_(debug), B_(B), T_(T), reserved_(reserved) {}
  // Declares `t`: `shape` of `dtype`, living from event `first` to `last` (inclusive).
  void add(Tensor& t, const std::string& name, DType dtype, std::vector<int64_t> shape, int first, int last);
  // A fixed buffer (MemoryPlan::add_fixed), with the planted bugs applied; returns its id.
  int add_fixed(const std::string& name, size_t bytes, int first, int last, size_t offset);
  // Checks that a planted bug named an existing buffer (call after the last add).
  void check_planted() const;
  int64_t B() const { return B_; }
  int64_t T() const { return T_; }
  int64_t N() const { return static_cast<int64_t>(B_) * T_; }
  size_t num_slots() const { return slots_.size(); }
  // Points every declared Tensor at its place in `arena` (after mp.assign()).
  void bind(const Arena& arena) const;

 private:
  struct Slot {
    Tensor* tensor;
    DType dtype;
    std::vector<int64_t> shape;
    int id;  // the buffer's id in the plan (several builders may add to one plan: an encoder-decoder's two sides)
  };
  void plant(const std::string& name, int& first, int& last);
  MemoryPlan& mp_;
  const PlanDebug& debug_;
  int B_, T_;
  size_t reserved_;
  std::vector<Slot> slots_;
  bool planted_death_ = false, planted_birth_ = false;
};

// Marks the events of a step as they run (a model: its order check, debug mode and profiler ranges).
class StepClock {
 public:
  virtual ~StepClock() = default;
  virtual void at(int event) = 0;
};

// The values of one forward or backward that every layer reads: where it runs, the parameters, and the step's
// dropout (probabilities 0 when off).
struct StepEnv {
  Context* ctx = nullptr;
  const ParamBuffer* params = nullptr;
  DType dtype = DType::F32;
  StepClock* clock = nullptr;  // null: events are not marked
  int B = 0, T = 0;            // this step's batch and sequence
  float dropout = 0.0f;        // embedding and residual dropout
  float attn_dropout = 0.0f;   // on the attention probabilities
  float act_dropout = 0.0f;    // on an MLP's activation (an encoder-decoder's)
  uint64_t seed = 0;

  int N() const { return B * T; }
  void at(int event) const {
    if (clock) clock->at(event);
  }
  Tensor p(size_t offset, int64_t numel) const { return params->data_at(offset, numel); }
  Tensor g(size_t offset, int64_t numel) const { return params->grad_at(offset, numel); }
  // A GEMM in exact f32 where the model is f32 (not TF32), so that a GPU run follows the CPU reference.
  void mm(GemmParams gp, const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias) const;
};

// The first n rows of an (N_planned, cols) activation.
Tensor rows(const Tensor& t, int64_t n, int64_t cols);
// t's memory from element `col` on, flat: the start of column `col` of a row-major matrix, for a GEMM with a
// row stride.
Tensor columns_from(const Tensor& t, int64_t col);

}  // namespace tessera
