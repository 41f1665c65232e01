// The activation plan of Gpt: the names of a step's events, the model's buffers and its layers' with their lives
// (the layers declare their own), the arena laid out by the lifetime planner, and the debug mode that poisons
// dead buffers (nn/step.h's PlanDebug).
#include "tessera/models/gpt_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/models/gpt.h"
#include "tessera/models/gpt_layers.h"

namespace tessera {

namespace {

constexpr int op_index(StepOp op) { return static_cast<int>(op); }
constexpr int kFwdLayerOps = op_index(StepOp::Res2) - op_index(StepOp::Ln1) + 1;
constexpr int kBwdLayerOps = op_index(StepOp::Ln1Bwd) - op_index(StepOp::FcpW) + 1;
constexpr int kHeadOps = op_index(StepOp::LnFBwd) - op_index(StepOp::LnF) + 1;  // LnF .. LnFBwd, between the layers
constexpr int kNumOps = op_index(StepOp::End) + 1;

bool in(StepOp op, StepOp lo, StepOp hi) { return op_index(op) >= op_index(lo) && op_index(op) <= op_index(hi); }

const char* op_name(StepOp op) {
  static const char* const names[kNumOps] = {"embedding",
                                             "ln1",
                                             "qkv",
                                             "attention",
                                             "attn proj",
                                             "attn residual + ln2",
                                             "fc",
                                             "activation",
                                             "fc proj",
                                             "mlp residual + next norm",
                                             "ln_f",
                                             "logits",
                                             "cross-entropy",
                                             "cross-entropy",
                                             "lm_head dW",
                                             "lm_head dx",
                                             "ln_f + residual",
                                             "fc proj dW",
                                             "fc proj dx",
                                             "activation",
                                             "fc dW",
                                             "fc dx",
                                             "ln2 + residual",
                                             "attn proj dW",
                                             "attn proj dx",
                                             "attention",
                                             "qkv dW",
                                             "qkv dx",
                                             "ln1 + residual",
                                             "embedding",
                                             "end of step"};
  return names[op_index(op)];
}

// Backward ops that share a name with a forward op get " bwd"; the dW / dx ops are unique already.
const char* range_name(StepOp op) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (int i = 0; i < kNumOps; ++i) {
      const auto op = static_cast<StepOp>(i);
      std::string s = op_name(op);
      const bool backward = in(op, StepOp::LossBwd, StepOp::EmbeddingBwd);
      if (backward && !s.ends_with(" dW") && !s.ends_with(" dx")) s += " bwd";
      n.push_back(s);
    }
    return n;
  }();
  return names[op_index(op)].c_str();
}

}  // namespace

const char* step_op_range_name(StepOp op) { return range_name(op); }

int step_event(int L, StepOp op, int layer) {
  const bool per_layer = in(op, StepOp::Ln1, StepOp::Res2) || in(op, StepOp::FcpW, StepOp::Ln1Bwd);
  TS_CHECK(!per_layer || (layer >= 0 && layer < L), "internal: step event for layer ", layer, " of ", L);
  const int head = 1 + L * kFwdLayerOps;   // the event of LnF
  const int bwd_layers = head + kHeadOps;  // the first backward event of the last layer
  if (op == StepOp::Embedding) return 0;
  if (in(op, StepOp::Ln1, StepOp::Res2)) return 1 + layer * kFwdLayerOps + (op_index(op) - op_index(StepOp::Ln1));
  if (in(op, StepOp::LnF, StepOp::LnFBwd)) return head + (op_index(op) - op_index(StepOp::LnF));
  if (in(op, StepOp::FcpW, StepOp::Ln1Bwd))
    return bwd_layers + (L - 1 - layer) * kBwdLayerOps + (op_index(op) - op_index(StepOp::FcpW));
  if (op == StepOp::EmbeddingBwd) return bwd_layers + L * kBwdLayerOps;
  return bwd_layers + L * kBwdLayerOps + 1;  // End
}

int step_num_events(int L) { return step_event(L, StepOp::End) + 1; }

std::string step_event_name(int L, int e) {
  TS_CHECK(e >= 0 && e < step_num_events(L), "internal: step event ", e, " of ", step_num_events(L));
  const int head = step_event(L, StepOp::LnF), bwd_layers = head + kHeadOps;
  if (e == 0) return "forward embedding";
  if (e < head) {
    const int l = (e - 1) / kFwdLayerOps;
    const auto op = static_cast<StepOp>(op_index(StepOp::Ln1) + (e - 1) % kFwdLayerOps);
    return "forward layer " + std::to_string(l) + " " + op_name(op);
  }
  if (e < bwd_layers) {
    const auto op = static_cast<StepOp>(op_index(StepOp::LnF) + (e - head));
    return std::string(in(op, StepOp::LnF, StepOp::Loss) ? "forward " : "backward ") + op_name(op);
  }
  if (e < step_event(L, StepOp::EmbeddingBwd)) {
    const int l = L - 1 - (e - bwd_layers) / kBwdLayerOps;
    const auto op = static_cast<StepOp>(op_index(StepOp::FcpW) + (e - bwd_layers) % kBwdLayerOps);
    return "backward layer " + std::to_string(l) + " " + op_name(op);
  }
  return e == step_event(L, StepOp::EmbeddingBwd) ? "backward embedding" : "end of step";
}

std::vector<Gpt::GradRegion> Gpt::grad_regions(const Layers& lay, size_t total) {
  const int L = static_cast<int>(lay.blocks.size());
  auto block_begin = [&](int l) { return l < L ? lay.blocks[l].param_begin() : lay.head.param_begin(); };
  std::vector<GradRegion> r;
  // The final norm's gradients (and an untied head's, whose dW GEMM comes first).
  r.push_back({"grad.head", lay.head.param_begin(), total, lay.head.first_grad_event()});
  // A block's from the first op that writes one: with biases, the norm backward just before the block's (the
  // next block's first norm, or the final norm), which sums the last projection's bias with the residual's
  // backward; without, the fc proj dW.
  for (int l = L - 1; l >= 0; --l)
    r.push_back({"grad.h." + std::to_string(l), block_begin(l), block_begin(l + 1), lay.blocks[l].first_grad_event()});
  // The embeddings' in the embedding's backward, or from the lm_head's dW when wte is the head too.
  const bool tied = lay.head.weight_offset() == lay.emb.wte_offset();
  r.push_back({"grad.embedding", 0, block_begin(0), tied ? lay.head.lm_head_dw_event() : lay.emb.backward_event()});
  std::stable_sort(r.begin(), r.end(), [](const GradRegion& a, const GradRegion& b) { return a.birth < b.birth; });
  return r;
}

// Every activation buffer of a step, with its life: the model's own here, each layer's by the layer. A buffer is
// born at the op that first writes it and dies at the op that last reads it. The debug mode (PlanDebug) checks
// both ends at run time, and tests/models/test_gpt.cpp checks that each declared life is tight.
void Gpt::declare_plan(Layers& lay, int64_t C, DType dt, GradMemory grads, size_t total, Acts& acts, PlanBuilder& pb) {
  const int L = static_cast<int>(lay.blocks.size());
  const int64_t N = pb.N();
  const DType st = stat_dtype(dt);  // statistics and the loss
  // The inputs and the loss outlive the step: the caller writes the inputs before it, reads the loss after it.
  const int end = lay.sched.end();
  pb.add(acts.tokens, "tokens", DType::I32, {N}, 0, end);
  pb.add(acts.targets, "targets", DType::I32, {N}, 0, end);
  pb.add(acts.loss, "loss", st, {2}, 0, end);  // {Σ losses, mean}
  pb.add(acts.count, "count", DType::I32, {1}, 0, end);
  lay.emb.declare(pb, dt, lay.blocks[0].input_last_use());
  // The sublayers' outputs before their residual add: one buffer for the whole forward.
  pb.add(acts.tmp, "tmp", dt, {N, C}, lay.blocks[0].sublayer_output_event(), lay.blocks.back().output_event());
  for (int l = 0; l < L; ++l)
    lay.blocks[l].declare(pb, dt, "res." + std::to_string(l + 1),
                          l + 1 < L ? lay.blocks[l + 1].input_last_use() : lay.head.input_last_use());
  lay.head.declare(pb, dt);
  pb.add(acts.d_res, "d_res", dt, {N, C}, lay.head.backward_end(), lay.emb.backward_event());
  // Planned gradients: fixed buffers at their offsets in the flat layout, from the first op that writes each
  // range to the end of the step (the optimizer and the all-reduce read them after it).
  if (grads == GradMemory::Planned)
    for (const GradRegion& r : grad_regions(lay, total))
      pb.add_fixed(r.name, (r.end - r.begin) * dtype_size(dt), r.birth, end, r.begin * dtype_size(dt));
  pb.check_planted();
}

// The bytes of the planned gradients of `lay` (total: the flat buffer's elements).
static size_t planned_grad_bytes(GradMemory grads, size_t total, DType dt) {
  return grads == GradMemory::Planned ? total * dtype_size(dt) : 0;
}

MemoryPlan Gpt::activation_plan(const ModelConfig& cfg, int B, int T, DType dtype, const PlanDebug& debug,
                                GradMemory grads) {
  cfg.validate();
  ParamBuffer pb;  // the layout alone: nothing is allocated
  const std::unique_ptr<Layers> lay = make_layers(cfg, dtype, pb);
  MemoryPlan mp(Arena::kAlign);
  Acts acts;
  PlanBuilder plan(mp, debug, B, T, planned_grad_bytes(grads, pb.size(), dtype));
  declare_plan(*lay, cfg.d_model, dtype, grads, pb.size(), acts, plan);
  mp.assign(/*reuse=*/!debug.no_reuse);
  return mp;
}

size_t Gpt::activation_bytes(const ModelConfig& cfg, int B, int T, DType dtype, GradMemory grads) {
  return activation_plan(cfg, B, T, dtype, {}, grads).peak();
}

void Gpt::reserve(int B, int T) {
  TS_CHECK(B > 0 && T > 0, "batch and sequence must be positive, got B=", B, " T=", T);
  TS_CHECK(T <= cfg_.max_seq, "sequence length ", T, " exceeds max_seq ", cfg_.max_seq);
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N <= planned_N_) return;
  arena_ = Arena();  // free the old plan before allocating the new one
  MemoryPlan mp(Arena::kAlign);
  acts_ = Acts{};
  PlanBuilder pb(mp, debug_, B, T, planned_grad_bytes(grad_memory_, params_.size(), dtype_));
  declare_plan(*layers_, cfg_.d_model, dtype_, grad_memory_, params_.size(), acts_, pb);
  mp.assign(/*reuse=*/!debug_.no_reuse);
  arena_ = Arena(mp.peak(), ctx_->device());
  pb.bind(arena_);
  grad_regions_.clear();
  grad_ids_.clear();
  if (grad_memory_ == GradMemory::Planned) {
    grad_regions_ = grad_regions(*layers_, params_.size());  // plan buffers pb.num_slots() on, in this order
    for (size_t i = 0; i < grad_regions_.size(); ++i) {
      grad_ids_.push_back(static_cast<int>(pb.num_slots() + i));
      // Zeroed at the birth the plan declares (a planted one included), so that a declared life that misses the
      // first write loses that write's gradient: tests/models/test_gpt.cpp sees it.
      grad_regions_[i].birth = mp[grad_ids_.back()].first;
    }
    std::vector<size_t> order(grad_regions_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return grad_regions_[a].birth < grad_regions_[b].birth; });
    std::vector<GradRegion> regions;
    std::vector<int> ids;
    for (size_t i : order) {
      regions.push_back(grad_regions_[i]);
      ids.push_back(grad_ids_[i]);
    }
    grad_regions_ = std::move(regions);
    grad_ids_ = std::move(ids);
    params_.bind_grad(arena_.at(0, params_.grad_bytes()));
  }
  plan_ = std::move(mp);
  live_bytes_ = plan_.live_bytes();
  // The debug mode's order of deaths and births. The buffers that outlive the step are never poisoned; planned
  // gradients are (every forward overwrites them), and their births are checked.
  const int end = end_event();
  by_death_.clear();
  for (int i = 0; i < static_cast<int>(plan_.size()); ++i)
    if (plan_[i].last < end) by_death_.push_back(i);
  by_birth_ = by_death_;
  by_birth_.insert(by_birth_.end(), grad_ids_.begin(), grad_ids_.end());
  std::stable_sort(by_death_.begin(), by_death_.end(), [&](int a, int b) { return plan_[a].last < plan_[b].last; });
  std::stable_sort(by_birth_.begin(), by_birth_.end(), [&](int a, int b) { return plan_[a].first < plan_[b].first; });
  event_ = -1;
  planned_N_ = N;
  loss_ = acts_.loss.slice1d(1, 1);
  ++plans_made_;
}

void Gpt::set_plan_debug(const PlanDebug& debug) {
  debug_ = debug;
  planned_N_ = 0;  // the next reserve (or forward) plans again under the new settings
}

void Gpt::begin_step() {
  ranges_to(end_event());  // a step that threw left some open
  event_ = -1;
  next_death_ = next_birth_ = next_grad_zero_ = 0;
  if (tracer_) tracer_->counter("activation arena (allocated)", static_cast<double>(arena_.capacity()));
  if (!debug_.poison_dead) return;
  for (int id : by_death_) poison(id);
  for (int id : grad_ids_) poison(id);
}

void Gpt::at(int e) {
  const StepSchedule& sched = layers_->sched;
  TS_CHECK(e > event_, "internal: the step reached ", sched.name(e), " after ",
           event_ < 0 ? std::string("its start") : sched.name(event_), ", against the order of the activation plan");
  event_ = e;
  ranges_to(e);
  if (tracer_ && e != sched.end()) tracer_->counter("activations live (planned)", static_cast<double>(live_bytes_[e]));
  if (debug_.poison_dead) {
    while (next_death_ < by_death_.size() && plan_[by_death_[next_death_]].last < e) poison(by_death_[next_death_++]);
    while (next_birth_ < by_birth_.size() && plan_[by_birth_[next_birth_]].first <= e)
      check_unborn(by_birth_[next_birth_++]);
  }
  // Planned gradients start from zero at their birth (after its check), when a zero_grad() asked for it.
  for (; zero_pending_ && next_grad_zero_ < grad_regions_.size() && grad_regions_[next_grad_zero_].birth <= e;
       ++next_grad_zero_) {
    const GradRegion& r = grad_regions_[next_grad_zero_];
    fill_bytes(params_.grad().slice1d(static_cast<int64_t>(r.begin), static_cast<int64_t>(r.end - r.begin)), 0, *ctx_);
  }
}

void Gpt::poison(int id) {
  const PlanBuffer& b = plan_[id];
  fill_bytes(Tensor::from_shape(arena_.at(b.offset, b.bytes), DType::U8,
                                std::vector<int64_t>{static_cast<int64_t>(b.bytes)}, arena_.device()),
             0xff, *ctx_);
}

void Gpt::check_unborn(int id) {
  const PlanBuffer& b = plan_[id];
  const unsigned char* bytes = static_cast<const unsigned char*>(arena_.at(b.offset, b.bytes));
  std::vector<unsigned char> host;
  if (!arena_.device().is_cpu()) {
    host.resize(b.bytes);
    copy_bytes(host.data(), Device::cpu(), bytes, arena_.device(), b.bytes, *ctx_);
    bytes = host.data();
  }
  const bool untouched = std::all_of(bytes, bytes + b.bytes, [](unsigned char c) { return c == 0xff; });
  TS_CHECK(untouched, "activation plan: ", b.name, " was written before its first declared use (",
           layers_->sched.name(b.first), "), over memory that may belong to a live buffer");
}

void Gpt::set_tracer(Tracer* tracer) {
  ranges_to(end_event());
  tracer_ = tracer;
}

void Gpt::range_push(const char* name) {
  nvtx_push(name);
  if (tracer_) tracer_->begin(name);
}

void Gpt::range_pop() {
  if (tracer_) tracer_->end();
  nvtx_pop();
}

void Gpt::ranges_to(int e) {
  const StepSchedule& sched = layers_->sched;
  const StepEvent* ev = e < sched.end() ? &sched.events()[static_cast<size_t>(e)] : nullptr;
  const int phase = !ev ? 0 : ev->phase == Phase::Forward ? 1 : 2;
  const std::string group = ev ? ev->group : std::string();
  if (range_op_open_) {
    range_pop();
    range_op_open_ = false;
  }
  if (!range_group_.empty() && (group != range_group_ || phase != range_phase_)) {
    range_pop();
    range_group_.clear();
  }
  if (range_phase_ != 0 && phase != range_phase_) {
    range_pop();
    range_phase_ = 0;
  }
  if (phase == 0) return;
  if (range_phase_ == 0) {
    range_push(phase == 1 ? "FWD_STEP" : "BWD_STEP");
    range_phase_ = phase;
  }
  if (!group.empty() && range_group_.empty()) {
    range_push(ev->group.c_str());
    range_group_ = group;
  }
  range_push(ev->range.c_str());
  range_op_open_ = true;
}

}  // namespace tessera
