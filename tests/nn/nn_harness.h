// tests/nn/nn_harness.h — runs nn layers on their own on the CPU in fp64: a ParamBuffer, a schedule, a plan
// without reuse and an arena, and central differences of a scalar loss over every parameter and input.
#pragma once
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/core/arena.h"
#include "tessera/core/buffer.h"
#include "tessera/nn/step.h"
#include "test_util.h"

namespace tessera::test {

// Checks that the layers mark their events in the schedule's order, each once at most.
struct OrderClock final : StepClock {
  const StepSchedule* sched = nullptr;
  int last = -1;
  void at(int event) override {
    ASSERT_GT(event, last) << "event " << sched->name(event) << " after "
                           << (last < 0 ? "the start" : sched->name(last));
    ASSERT_LT(event, sched->end());
    last = event;
  }
};

// A host f64 buffer that a layer reads or writes as a Tensor.
struct HostTensor {
  std::vector<double> v;
  std::vector<int64_t> shape;
  HostTensor(std::vector<int64_t> s, double fill = 0.0) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    v.assign(static_cast<size_t>(n), fill);
  }
  Tensor t() { return Tensor::from_shape(v.data(), DType::F64, shape, Device::cpu()); }
};

// A CPU f64 tensor's elements.
inline double* f64(const Tensor& t) { return static_cast<double*>(t.data()); }
inline std::vector<double> values(const Tensor& t) { return std::vector<double>(f64(t), f64(t) + t.numel()); }

inline Tensor i32_tensor(std::vector<int32_t>& v) {
  return Tensor::from_shape(v.data(), DType::I32, std::vector<int64_t>{static_cast<int64_t>(v.size())}, Device::cpu());
}

class LayerHarness {
 public:
  LayerHarness(int B, int T) : ctx_(Device::cpu()), params_(Device::cpu(), DType::F64), B_(B), T_(T) {}
  Context& ctx() { return ctx_; }
  ParamBuffer& params() { return params_; }
  StepSchedule& sched() { return sched_; }
  // After the layers' add_params: allocates and fills the parameters with N(0, scale) (gains near 1).
  void finalize_params(std::mt19937_64& rng, double scale = 0.5) {
    params_.finalize(ctx_);
    double* p = params_.host_data<double>();
    for (const ParamSegment& s : params_.segments()) {
      const bool gain = s.name.ends_with("ln1.w") || s.name.ends_with("ln2.w") || s.name.ends_with("ln3.w") ||
                        s.name.ends_with("norm.w") || s.name == "lnf.w";
      std::vector<double> r = randn<double>(s.numel, rng, scale);
      for (size_t i = 0; i < s.numel; ++i) p[s.offset + i] = gain ? 1.0 + r[i] : r[i];
    }
  }
  // Declares through `declare` into a plan without reuse, and binds the layers' tensors to an arena.
  void plan(const std::function<void(PlanBuilder&)>& declare) {
    MemoryPlan mp(Arena::kAlign);
    PlanBuilder pb(mp, debug_, B_, T_);
    declare(pb);
    pb.check_planted();
    mp.assign(/*reuse=*/false);
    arena_ = Arena(mp.peak(), Device::cpu());
    pb.bind(arena_);
  }
  // The env of one pass (a fresh order check each call).
  StepEnv env(float dropout = 0.0f, float attn_dropout = 0.0f, uint64_t seed = 0) {
    clock_ = OrderClock{};
    clock_.sched = &sched_;
    return {.ctx = &ctx_,
            .params = &params_,
            .dtype = DType::F64,
            .clock = &clock_,
            .B = B_,
            .T = T_,
            .dropout = dropout,
            .attn_dropout = attn_dropout,
            .seed = seed};
  }
  // The parameters' gradient of `loss` by the layer's backward (`backward` after zero_grad) against central
  // differences, over the whole buffer and per segment (each segment's gradient must be non-zero).
  void check_param_grads(const std::function<double()>& loss, const std::function<void()>& backward,
                         double tol = kFdTolF64) {
    loss();
    params_.zero_grad(ctx_);
    backward();
    const size_t n = params_.size();
    std::vector<double> analytic(params_.host_grad<double>(), params_.host_grad<double>() + n);
    std::vector<double> x(params_.host_data<double>(), params_.host_data<double>() + n);
    auto loss_of_x = [&] {
      std::copy(x.begin(), x.end(), params_.host_data<double>());
      return loss();
    };
    const std::vector<double> numeric = fd_gradient(loss_of_x, x);
    std::copy(x.begin(), x.end(), params_.host_data<double>());
    EXPECT_LT(rel_error(analytic, numeric), tol);
    for (const ParamSegment& s : params_.segments()) {
      const std::vector<double> a(analytic.begin() + s.offset, analytic.begin() + s.offset + s.numel);
      const std::vector<double> m(numeric.begin() + s.offset, numeric.begin() + s.offset + s.numel);
      EXPECT_LT(rel_error(a, m), tol) << s.name;
      double norm = 0;
      for (double v : m) norm += v * v;
      EXPECT_GT(norm, 0.0) << s.name << " has a zero gradient, so the check would be vacuous";
    }
  }
  // An input's gradient: `analytic` (from the backward) against central differences over `x`.
  static void check_input_grad(const std::function<double()>& loss, std::vector<double>& x,
                               const std::vector<double>& analytic, const std::string& what, double tol = kFdTolF64) {
    const std::vector<double> numeric = fd_gradient(loss, x);
    EXPECT_LT(rel_error(analytic, numeric), tol) << what;
    double norm = 0;
    for (double v : numeric) norm += v * v;
    EXPECT_GT(norm, 0.0) << what << " has a zero gradient";
  }

 private:
  Context ctx_;
  ParamBuffer params_;
  StepSchedule sched_;
  PlanDebug debug_;
  Arena arena_;
  OrderClock clock_;
  int B_, T_;
};

}  // namespace tessera::test
