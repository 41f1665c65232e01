#include "tessera/nn/step.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tessera/core/error.h"

namespace tessera {

int StepSchedule::add(Phase phase, const std::string& group, std::initializer_list<const char*> ops) {
  const int first = end();
  for (const char* op : ops) {
    StepEvent e;
    e.phase = phase;
    e.group = group;
    e.range = op;
    const bool unique = e.range.ends_with(" dW") || e.range.ends_with(" dx");
    if (phase == Phase::Backward && !unique) e.range += " bwd";
    e.name = std::string(phase == Phase::Forward ? "forward " : "backward ") + (group.empty() ? "" : group + " ") + op;
    events_.push_back(std::move(e));
  }
  return first;
}

std::string StepSchedule::name(int event) const {
  TS_CHECK(event >= 0 && event <= end(), "internal: step event ", event, " of ", num_events());
  return event == end() ? "end of step" : events_[static_cast<size_t>(event)].name;
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

void PlanBuilder::plant(const std::string& name, int& first, int& last) {
  if (name == debug_.plant_early_death) {
    TS_CHECK(last > first, "plan debug: ", name, " lives one event only; it cannot die earlier");
    --last;
    planted_death_ = true;
  }
  if (name == debug_.plant_late_birth) {
    last = std::max(last, ++first);
    planted_birth_ = true;
  }
}

void PlanBuilder::add(Tensor& t, const std::string& name, DType d, std::vector<int64_t> shape, int first, int last) {
  plant(name, first, last);
  size_t bytes = dtype_size(d);
  bool fits = true;
  for (int64_t s : shape) fits = fits && s >= 0 && !__builtin_mul_overflow(bytes, static_cast<size_t>(s), &bytes);
  const size_t used = mp_.total() + reserved_ + mp_.align();  // the alignment: bytes' rounding
  fits = fits && used <= MemoryPlan::kMaxTotal && bytes <= MemoryPlan::kMaxTotal - used;
  TS_CHECK(fits, "batch ", B_, " x seq ", T_, ": the activations need more than 1 EiB (2^60 bytes) at ", name,
           "; give a smaller batch or sequence");
  const int id = mp_.add(name, bytes, first, last);
  slots_.push_back({&t, d, std::move(shape), id});
}

int PlanBuilder::add_fixed(const std::string& name, size_t bytes, int first, int last, size_t offset) {
  plant(name, first, last);
  return mp_.add_fixed(name, bytes, first, last, offset);
}

void PlanBuilder::check_planted() const {
  TS_CHECK((debug_.plant_early_death.empty() || planted_death_) && (debug_.plant_late_birth.empty() || planted_birth_),
           "plan debug: no activation is named ", debug_.plant_early_death, " ", debug_.plant_late_birth);
}

void PlanBuilder::bind(const Arena& arena) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    *slots_[i].tensor = arena.tensor_at(mp_[slots_[i].id].offset, slots_[i].dtype, slots_[i].shape);
}

void StepEnv::mm(GemmParams gp, const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias) const {
  gp.allow_tf32 = false;
  gemm(gp, c, a, b, bias, *ctx);
}

Tensor rows(const Tensor& t, int64_t n, int64_t cols) {
  return Tensor::from_shape(t.data(), t.dtype(), std::initializer_list<int64_t>{n, cols}, t.device());
}

Tensor columns_from(const Tensor& t, int64_t col) {
  return Tensor::from_shape(static_cast<char*>(t.data()) + col * static_cast<int64_t>(dtype_size(t.dtype())), t.dtype(),
                            std::initializer_list<int64_t>{t.numel() - col}, t.device());
}

}  // namespace tessera
