// The activation plan of Gpt: the events of a step, every buffer's life over them, the arena laid out by the
// lifetime planner, and the debug mode that poisons dead buffers (see gpt_plan.h).
#include "tessera/models/gpt_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/models/gpt.h"

namespace tessera {

namespace {

constexpr int op_index(StepOp op) { return static_cast<int>(op); }
constexpr int kFwdLayerOps = op_index(StepOp::Res2) - op_index(StepOp::Ln1) + 1;
constexpr int kBwdLayerOps = op_index(StepOp::Ln1Bwd) - op_index(StepOp::FcpW) + 1;
constexpr int kHeadOps = op_index(StepOp::LnFBwd) - op_index(StepOp::LnF) + 1;  // LnF .. LnFBwd, between the layers
constexpr int kNumOps = op_index(StepOp::End) + 1;

bool in(StepOp op, StepOp lo, StepOp hi) { return op_index(op) >= op_index(lo) && op_index(op) <= op_index(hi); }

const char* op_name(StepOp op) {
  static const char* const names[kNumOps] = {
      "embedding", "ln1", "qkv", "attention", "attn proj", "attn residual + ln2", "fc", "activation", "fc proj",
      "mlp residual + next norm", "ln_f", "logits", "cross-entropy",
      "cross-entropy", "lm_head dW", "lm_head dx", "ln_f + residual",
      "fc proj dW", "fc proj dx", "activation", "fc dW", "fc dx", "ln2 + residual",
      "attn proj dW", "attn proj dx", "attention", "qkv dW", "qkv dx", "ln1 + residual",
      "embedding", "end of step"};
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
  const int head = 1 + L * kFwdLayerOps;  // the event of LnF
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

PlanDebug plan_debug_from_env() {
  auto on = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
  };
  PlanDebug d;
  d.poison_dead = on("TESSERA_POISON_DEAD");
  d.no_reuse = on("TESSERA_PLAN_NO_REUSE");
  return d;
}

// Every activation buffer of a step, with its life. The lives follow the code in gpt.cpp op by op: a buffer is
// born at the op that first writes it and dies at the op that last reads it. The debug mode (PlanDebug) checks
// both ends at run time, and tests/models/test_gpt.cpp checks that each declared life is tight.
std::vector<Gpt::GradRegion> Gpt::grad_regions(const ModelConfig& cfg) {
  ParamBuffer pb;  // the layout alone: nothing is allocated
  const ParamLayout lay = add_params(cfg, pb);
  const int L = cfg.n_layers;
  auto ev = [&](StepOp op, int l = 0) { return step_event(L, op, l); };
  auto layer_begin = [&](int l) { return l < L ? lay.layers[l].ln1_w : lay.lnf_w; };
  std::vector<GradRegion> r;
  // The final norm's gradients (and an untied head's, whose dW GEMM comes first).
  r.push_back({"grad.head", lay.lnf_w, pb.size(), ev(cfg.tied ? StepOp::LnFBwd : StepOp::LmHeadW)});
  // A layer's from the first op that writes one: with biases, the norm backward just before the layer's (the next
  // layer's ln1, or ln_f), which sums the fc proj bias with the residual's backward; without, the fc proj dW.
  for (int l = L - 1; l >= 0; --l)
    r.push_back({"grad.h." + std::to_string(l), layer_begin(l), layer_begin(l + 1),
                 cfg.bias ? ev(StepOp::FcpW, l) - 1 : ev(StepOp::FcpW, l)});
  // The embeddings' in the embedding's backward, or from the lm_head's dW when wte is the head too.
  r.push_back({"grad.embedding", 0, layer_begin(0), ev(cfg.tied ? StepOp::LmHeadW : StepOp::EmbeddingBwd)});
  std::stable_sort(r.begin(), r.end(), [](const GradRegion& a, const GradRegion& b) { return a.birth < b.birth; });
  return r;
}

void Gpt::declare_plan(const ModelConfig& cfg, DType dt, int B, int T, const PlanDebug& dbg, GradMemory grads,
                       MemoryPlan& mp, Acts& acts, std::vector<Slot>& slots) {
  const int L = cfg.n_layers;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg.d_model;
  const int64_t F = cfg.d_ff, Fin = cfg.d_ff_in(), H = cfg.n_heads;
  const DType st = dt == DType::F64 ? DType::F64 : DType::F32;  // statistics and the loss
  const bool layernorm = cfg.norm == NormKind::LayerNorm;        // RMSNorm keeps no mean
  auto ev = [&](StepOp op, int l = 0) { return step_event(L, op, l); };
  bool planted_death = dbg.plant_early_death.empty(), planted_birth = dbg.plant_late_birth.empty();
  auto plant = [&](const std::string& name, int& first, int& last) {
    if (name == dbg.plant_early_death) {
      TS_CHECK(last > first, "plan debug: ", name, " lives one event only; it cannot die earlier");
      --last;
      planted_death = true;
    }
    if (name == dbg.plant_late_birth) {
      last = std::max(last, ++first);
      planted_birth = true;
    }
  };
  // A batch and sequence whose buffers pass MemoryPlan::kMaxTotal (1 EiB) are refused here, in the caller's terms,
  // before any size can wrap around 2^64 (info printed wrapped sizes, and train's memory check read them). The
  // planned gradients, added last as fixed buffers, are counted from the start, so that they cannot be the ones to
  // pass it (with MemoryPlan's own, less helpful, message).
  size_t grad_bytes = 0;
  if (grads == GradMemory::Planned)
    for (const GradRegion& r : grad_regions(cfg)) grad_bytes += (r.end - r.begin) * dtype_size(dt);
  auto add = [&](Tensor& t, const std::string& name, DType d, std::vector<int64_t> shape, int first, int last) {
    plant(name, first, last);
    size_t bytes = dtype_size(d);
    bool fits = true;
    for (int64_t s : shape) fits = fits && s >= 0 && !__builtin_mul_overflow(bytes, static_cast<size_t>(s), &bytes);
    const size_t used = mp.total() + grad_bytes + mp.align();  // the alignment: bytes' rounding
    fits = fits && used <= MemoryPlan::kMaxTotal && bytes <= MemoryPlan::kMaxTotal - used;
    TS_CHECK(fits, "batch ", B, " x seq ", T, ": the activations need more than 1 EiB (2^60 bytes) at ", name,
             "; give a smaller batch or sequence");
    mp.add(name, bytes, first, last);
    slots.push_back({&t, d, std::move(shape)});
  };
  acts.res.assign(L + 1, Tensor());
  acts.layers.assign(L, LayerActs{});

  // The inputs and the loss outlive the step: the caller writes the inputs before it, reads the loss after it.
  const int end = ev(StepOp::End);
  add(acts.tokens, "tokens", DType::I32, {N}, 0, end);
  add(acts.targets, "targets", DType::I32, {N}, 0, end);
  add(acts.loss, "loss", st, {2}, 0, end);  // {Σ losses, mean}
  add(acts.count, "count", DType::I32, {1}, 0, end);

  add(acts.res[0], "res.0", dt, {N, C}, ev(StepOp::Embedding), ev(StepOp::Ln1Bwd, 0));
  // The projection outputs before their residual add: one buffer for the whole forward.
  add(acts.tmp, "tmp", dt, {N, C}, ev(StepOp::Proj, 0), ev(StepOp::Res2, L - 1));
  for (int l = 0; l < L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    LayerActs& A = acts.layers[l];
    auto life = [&](StepOp a, StepOp b) { return std::pair{ev(a, l), ev(b, l)}; };
    auto add_l = [&](Tensor& t, const char* name, DType d, std::vector<int64_t> shape, std::pair<int, int> lf) {
      add(t, p + name, d, std::move(shape), lf.first, lf.second);
    };
    // Saved for the backward: each dies at the last op of this layer's backward that reads it.
    // ln1 and its statistics: from layer 0's ln1 op, or from the layer below's mlp residual op above it.
    const int ln1_birth = l == 0 ? ev(StepOp::Ln1, 0) : ev(StepOp::Res2, l - 1);
    add_l(A.ln1, "ln1", dt, {N, C}, {ln1_birth, ev(StepOp::QkvW, l)});
    if (layernorm) add_l(A.ln1_mean, "ln1.mean", st, {N}, {ln1_birth, ev(StepOp::Ln1Bwd, l)});
    add_l(A.ln1_rstd, "ln1.rstd", st, {N}, {ln1_birth, ev(StepOp::Ln1Bwd, l)});
    add_l(A.qkv, "qkv", dt, {N, 3 * C}, life(StepOp::Qkv, StepOp::AttnBwd));
    add_l(A.att, "att", dt, {N, C}, life(StepOp::Attn, StepOp::AttnBwd));
    add_l(A.lse, "lse", st, {N * H}, life(StepOp::Attn, StepOp::AttnBwd));
    add_l(A.mid, "mid", dt, {N, C}, life(StepOp::Res1, StepOp::Ln2Bwd));
    // ln2 and its statistics come out of the attention residual's op (norm_residual_forward).
    add_l(A.ln2, "ln2", dt, {N, C}, life(StepOp::Res1, StepOp::FcW));
    if (layernorm) add_l(A.ln2_mean, "ln2.mean", st, {N}, life(StepOp::Res1, StepOp::Ln2Bwd));
    add_l(A.ln2_rstd, "ln2.rstd", st, {N}, life(StepOp::Res1, StepOp::Ln2Bwd));
    // With the GELU fused into the fc GEMM (fuses_gelu) the Act op is gone: the fc GEMM writes fc_pre (with the
    // bias) and fc_act; the fc proj dx GEMM writes d_fc_pre, which ActBwd turns in place into the GELU's gradient,
    // so there is no d_fc_act.
    const bool fused = fuses_gelu(cfg, dt);
    add_l(A.fc_pre, "fc_pre", dt, {N, Fin}, life(StepOp::Fc, StepOp::ActBwd));
    add_l(A.fc_act, "fc_act", dt, {N, F}, life(fused ? StepOp::Fc : StepOp::Act, StepOp::FcpW));
    // The layer's output: read as the next layer's input until that layer's backward (or by the final norm's).
    add(acts.res[l + 1], "res." + std::to_string(l + 1), dt, {N, C}, ev(StepOp::Res2, l),
        l + 1 < L ? ev(StepOp::Ln1Bwd, l + 1) : ev(StepOp::LnFBwd));
    // Gradient temporaries: born and dead inside this layer's backward.
    // d_tmp: born in the norm backward before this layer's (the residual's backward comes along), the event
    // before fc proj dW.
    add_l(A.d_tmp, "d_tmp", dt, {N, C}, {ev(StepOp::FcpW, l) - 1, ev(StepOp::ProjX, l)});
    if (!fused) add_l(A.d_fc_act, "d_fc_act", dt, {N, F}, life(StepOp::FcpX, StepOp::ActBwd));
    add_l(A.d_fc_pre, "d_fc_pre", dt, {N, Fin}, life(fused ? StepOp::FcpX : StepOp::ActBwd, StepOp::FcX));
    add_l(A.d_ln, "d_ln", dt, {N, C}, life(StepOp::FcX, StepOp::Ln1Bwd));
    add_l(A.d_att, "d_att", dt, {N, C}, life(StepOp::ProjX, StepOp::AttnBwd));
    add_l(A.d_qkv, "d_qkv", dt, {N, 3 * C}, life(StepOp::AttnBwd, StepOp::QkvX));
  }
  // ln_f's output and statistics: from the last layer's mlp residual op (the LnF event itself is empty).
  const int lnf_birth = ev(StepOp::Res2, L - 1);
  add(acts.lnf, "lnf", dt, {N, C}, lnf_birth, ev(StepOp::LmHeadW));
  if (layernorm) add(acts.lnf_mean, "lnf.mean", st, {N}, lnf_birth, ev(StepOp::LnFBwd));
  add(acts.lnf_rstd, "lnf.rstd", st, {N}, lnf_birth, ev(StepOp::LnFBwd));
  // The cross-entropy backward overwrites the logits with d_logits, in place.
  add(acts.logits, "logits", dt, {N, logits_stride(cfg, dt)}, ev(StepOp::Logits), ev(StepOp::LmHeadX));
  add(acts.losses, "losses", st, {N}, ev(StepOp::Loss), ev(StepOp::Loss));
  add(acts.ce_lse, "ce_lse", st, {N}, ev(StepOp::Loss), ev(StepOp::LossBwd));
  add(acts.d_lnf, "d_lnf", dt, {N, C}, ev(StepOp::LmHeadX), ev(StepOp::LnFBwd));
  // d of the residual stream, accumulated in place from the final norm down to the embedding.
  add(acts.d_res, "d_res", dt, {N, C}, ev(StepOp::LnFBwd), ev(StepOp::EmbeddingBwd));
  // Planned gradients: fixed buffers at their offsets in the flat layout, from the first op that writes each
  // range to the end of the step (the optimizer and the all-reduce read them after it).
  if (grads == GradMemory::Planned)
    for (const GradRegion& r : grad_regions(cfg)) {
      int first = r.birth, last = end;
      plant(r.name, first, last);
      mp.add_fixed(r.name, (r.end - r.begin) * dtype_size(dt), first, last, r.begin * dtype_size(dt));
    }
  TS_CHECK(planted_death && planted_birth, "plan debug: no activation is named ", dbg.plant_early_death, " ",
           dbg.plant_late_birth);
}

MemoryPlan Gpt::activation_plan(const ModelConfig& cfg, int B, int T, DType dtype, const PlanDebug& debug,
                                GradMemory grads) {
  MemoryPlan mp(Arena::kAlign);
  Acts acts;
  std::vector<Slot> slots;
  declare_plan(cfg, dtype, B, T, debug, grads, mp, acts, slots);
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
  std::vector<Slot> slots;
  acts_ = Acts{};
  declare_plan(cfg_, dtype_, B, T, debug_, grad_memory_, mp, acts_, slots);
  mp.assign(/*reuse=*/!debug_.no_reuse);
  arena_ = Arena(mp.peak(), ctx_->device());
  for (size_t i = 0; i < slots.size(); ++i)
    *slots[i].tensor = arena_.tensor_at(mp[static_cast<int>(i)].offset, slots[i].dtype, slots[i].shape);
  grad_regions_.clear();
  grad_ids_.clear();
  if (grad_memory_ == GradMemory::Planned) {
    grad_regions_ = grad_regions(cfg_);  // plan buffers slots.size() on, in this order
    for (size_t i = 0; i < grad_regions_.size(); ++i) {
      grad_ids_.push_back(static_cast<int>(slots.size() + i));
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
  const int end = step_event(cfg_.n_layers, StepOp::End);
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
  ranges_to(StepOp::End, 0);  // a step that threw left some open
  event_ = -1;
  next_death_ = next_birth_ = next_grad_zero_ = 0;
  if (tracer_) tracer_->counter("activation arena (allocated)", static_cast<double>(arena_.capacity()));
  if (!debug_.poison_dead) return;
  for (int id : by_death_) poison(id);
  for (int id : grad_ids_) poison(id);
}

void Gpt::at(StepOp op, int layer) {
  const int L = cfg_.n_layers, e = step_event(L, op, layer);
  TS_CHECK(e > event_, "internal: the step reached ", step_event_name(L, e), " after ",
           event_ < 0 ? std::string("its start") : step_event_name(L, event_),
           ", against the order of the activation plan");
  event_ = e;
  ranges_to(op, layer);
  if (tracer_ && op != StepOp::End)
    tracer_->counter("activations live (planned)", static_cast<double>(live_bytes_[e]));
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
  fill_bytes(Tensor::from_shape(arena_.at(b.offset, b.bytes), DType::U8, std::vector<int64_t>{static_cast<int64_t>(b.bytes)},
                                arena_.device()),
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
           step_event_name(cfg_.n_layers, b.first), "), over memory that may belong to a live buffer");
}

void Gpt::set_tracer(Tracer* tracer) {
  ranges_to(StepOp::End, 0);
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

void Gpt::ranges_to(StepOp op, int layer) {
  const int phase = in(op, StepOp::Embedding, StepOp::Loss) ? 1 : in(op, StepOp::LossBwd, StepOp::EmbeddingBwd) ? 2 : 0;
  const bool per_layer = in(op, StepOp::Ln1, StepOp::Res2) || in(op, StepOp::FcpW, StepOp::Ln1Bwd);
  const int l = per_layer ? layer : -1;
  if (range_op_open_) {
    range_pop();
    range_op_open_ = false;
  }
  if (range_layer_ >= 0 && (l != range_layer_ || phase != range_phase_)) {
    range_pop();
    range_layer_ = -1;
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
  if (l >= 0 && range_layer_ < 0) {
    if (layer_range_names_.empty())
      for (int i = 0; i < cfg_.n_layers; ++i) layer_range_names_.push_back("layer " + std::to_string(i));
    range_push(layer_range_names_[l].c_str());
    range_layer_ = l;
  }
  range_push(range_name(op));
  range_op_open_ = true;
}

}  // namespace tessera
