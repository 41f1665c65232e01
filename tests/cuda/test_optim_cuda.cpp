// AdamW with global-norm clipping: the one-launch CUDA step against adamw_update_ref / clip_grad_norm_ref.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda_test_util.h"
#include "tessera/models/gpt.h"
#include "tessera/ops/optim/adamw.h"
#include "tessera/train/optimizer.h"

namespace tessera::test {
namespace {

// Segments of awkward sizes with mixed decay, gaps between some (alignment padding, never touched) and a tail;
// listed out of offset order (the table sorts them).
struct Layout {
  std::vector<ParamSegment> segments;
  std::vector<char> in_segment;
  size_t numel = 0;
};
Layout make_layout() {
  const size_t sizes[] = {1, 3, 1000, 100003, 7, 6149, 2048};
  const bool decay[] = {true, false, true, false, true, false, true};
  const size_t gap_before[] = {0, 5, 2, 0, 3, 1, 0};
  Layout L;
  size_t at = 0;
  for (int i = 0; i < 7; ++i) {
    at += gap_before[i];
    std::string name = "s";  // appended, not "s" + to_string(i): GCC 12 warns falsely (-Wrestrict) on that
    name += std::to_string(i);
    L.segments.push_back({.name = name, .offset = at, .numel = sizes[i], .decay = decay[i]});
    at += sizes[i];
  }
  L.numel = at + 4;
  L.in_segment.assign(L.numel, 0);
  for (const ParamSegment& s : L.segments)
    for (size_t i = s.offset; i < s.offset + s.numel; ++i) L.in_segment[i] = 1;
  std::reverse(L.segments.begin(), L.segments.end());
  return L;
}

enum class Clip { Off, Inactive, Active };

struct OptimCase {
  DType dt;
  bool master;  // separate f32 master weights
  Clip clip;
  bool norm_out;    // ask for the norm
  bool misaligned;  // buffers one element off 16-byte alignment: the scalar path
  int64_t first_step;
};

std::string label(const OptimCase& c) {
  const char* clip = c.clip == Clip::Off ? "off" : c.clip == Clip::Inactive ? "inactive" : "active";
  return std::string("adamw ") + dtype_label(c.dt) + (c.master ? " +master" : "") + " clip=" + clip +
         (c.norm_out ? " norm" : "") + (c.misaligned ? " misaligned" : "") + " from step " +
         std::to_string(c.first_step);
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void run_adamw_case(const OptimCase& c, Context& ctx, std::mt19937_64& rng) {
  const Layout L = make_layout();
  const size_t n = L.numel;
  const std::string what = label(c);
  // Initial state: f32 master weights, moments (nonzero when resuming from a later step).
  std::vector<float> master(n), m(n, 0.0f), v(n, 0.0f);
  {
    const auto w0 = randn<double>(n, rng, 1.0);
    for (size_t i = 0; i < n; ++i) master[i] = static_cast<float>(w0[i]);
    if (c.first_step > 1) {
      const auto m0 = randn<double>(n, rng, 0.01), v0 = randn<double>(n, rng, 0.01);
      for (size_t i = 0; i < n; ++i) {
        m[i] = static_cast<float>(m0[i]);
        v[i] = static_cast<float>(v0[i] * v0[i]);
      }
    }
  }
  // The 16-bit params start as round(master); with no separate master the f32 params are the master.
  std::vector<double> params0(n);
  for (size_t i = 0; i < n; ++i) params0[i] = round_to(c.dt, master[i]);
  const std::vector<float> master0 = master;
  if (!c.master) {
    ASSERT_EQ(c.dt, DType::F32);
  }

  DeviceArena dev(ctx);
  // One element in front shifts a buffer off 16-byte alignment when asked.
  auto place = [&](DType dt, const std::vector<double>& vals) {
    if (!c.misaligned) return dev.upload(dt, vals);
    std::vector<double> shifted(vals.size() + 1, 0.0);
    std::copy(vals.begin(), vals.end(), shifted.begin() + 1);
    return dev.upload(dt, shifted).slice1d(1, static_cast<int64_t>(vals.size()));
  };
  const AdamWSegmentTable table(L.segments, ctx);
  ASSERT_EQ(table.end(), n - 4);
  const Tensor tparams = place(c.dt, params0);
  const Tensor tmaster = c.master ? place(DType::F32, to_double(master)) : Tensor();
  const Tensor tm = place(DType::F32, to_double(m)), tv = place(DType::F32, to_double(v));
  const Tensor tnorm = c.norm_out ? dev.poisoned(DType::F32, 1) : Tensor();

  AdamWParams p{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  for (int64_t step = c.first_step; step < c.first_step + 3; ++step) {
    p.step = step;
    // Fresh gradients in the compute dtype; the device sees NaN in the gaps (never read), the reference zeros.
    const auto g0 = rounded(c.dt, randn<double>(n, rng, 0.02));
    std::vector<double> g_dev(n);
    std::vector<float> g_ref(n);
    double sq = 0;
    for (size_t i = 0; i < n; ++i) {
      g_dev[i] = L.in_segment[i] ? g0[i] : std::numeric_limits<double>::quiet_NaN();
      g_ref[i] = L.in_segment[i] ? static_cast<float>(g0[i]) : 0.0f;
      sq += static_cast<double>(g_ref[i]) * g_ref[i];
    }
    p.max_grad_norm = c.clip == Clip::Off        ? 0.0f
                      : c.clip == Clip::Inactive ? 1e9f
                                                 : static_cast<float>(0.5 * std::sqrt(sq));
    const double norm_ref = clip_grad_norm_ref(g_ref.data(), n, p.max_grad_norm);
    adamw_update_ref(p, L.segments, master.data(), g_ref.data(), m.data(), v.data());

    const Tensor tgrads = place(c.dt, g_dev);
    adamw_step(p, table, tparams, tgrads, tmaster, tm, tv, tnorm, ctx);
    const std::string at = what + " step " + std::to_string(step);
    if (c.norm_out) {
      const double got = dev.download(tnorm)[0];
      EXPECT_NEAR(got, norm_ref, 1e-5 * norm_ref) << at << " grad norm, seed " << test_seed();
    }
  }

  const std::vector<double> got_w = dev.download(c.master ? tmaster : tparams);
  const std::vector<double> got_m = dev.download(tm), got_v = dev.download(tv), got_p = dev.download(tparams);
  // f32 state: within f32 rounding of the reference (FMA contraction and the order of the update's factors).
  expect_close(got_w, to_double(master), DType::F32, what + " master", 0.1);
  expect_close(got_m, to_double(m), DType::F32, what + " m", 0.1);
  expect_close(got_v, to_double(v), DType::F32, what + " v", 0.1);
  // The updates themselves (w - w0), which the master's magnitude would hide.
  std::vector<double> d_got(n), d_ref(n);
  for (size_t i = 0; i < n; ++i) {
    d_got[i] = got_w[i] - master0[i];
    d_ref[i] = static_cast<double>(master[i]) - master0[i];
  }
  expect_close(d_got, d_ref, DType::F32, what + " master update", 20.0);
  // Gaps untouched; the compute-dtype params are exactly round(master).
  for (size_t i = 0; i < n; ++i) {
    if (!L.in_segment[i]) {
      ASSERT_EQ(got_w[i], c.master ? master0[i] : params0[i]) << what << ": gap element " << i << " changed";
      ASSERT_EQ(got_m[i], m[i]) << what << ": gap element " << i << " of m changed";
      ASSERT_EQ(got_p[i], params0[i]) << what << ": gap element " << i << " of params changed";
    } else if (c.master) {
      ASSERT_EQ(got_p[i], round_to(c.dt, got_w[i])) << what << ": params[" << i << "] is not round(master)";
    }
  }
}

TEST(CudaAdamW, MatchesReferenceOverSegmentTable) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const std::pair<DType, bool> kinds[] = {{DType::F32, false},
                                          {DType::F32, true},
                                          {DType::BF16, true},
                                          {DType::F16, true}};
  for (auto [dt, master] : kinds)
    for (Clip clip : {Clip::Off, Clip::Inactive, Clip::Active})
      run_adamw_case({.dt = dt, .master = master, .clip = clip, .norm_out = true, .misaligned = false, .first_step = 1},
                     ctx, rng);
  // No norm asked and no clipping: the norm pass is skipped.
  run_adamw_case(
      {.dt = DType::BF16, .master = true, .clip = Clip::Off, .norm_out = false, .misaligned = false, .first_step = 1},
      ctx, rng);
  // Resuming at a later step with nonzero moments; clipping without reading the norm back.
  run_adamw_case({.dt = DType::F32,
                  .master = false,
                  .clip = Clip::Active,
                  .norm_out = false,
                  .misaligned = false,
                  .first_step = 10},
                 ctx, rng);
  // Buffers off 16-byte alignment: the element-by-element path everywhere.
  for (auto [dt, master] : kinds)
    run_adamw_case(
        {.dt = dt, .master = master, .clip = Clip::Active, .norm_out = true, .misaligned = true, .first_step = 4}, ctx,
        rng);
}

// ---- Loss scaling (f16 training) in the kernel: unscale in registers, skip a non-finite step. ----

// The state of one kernel-level step on the device, uploaded from host values.
struct ScaledState {
  Tensor params, grads, master, m, v, norm;
};
ScaledState upload_state(DeviceArena& dev, DType dt, bool master, const std::vector<double>& w,
                         const std::vector<double>& g, const std::vector<double>& m, const std::vector<double>& v) {
  return {.params = dev.upload(dt, rounded(dt, w)),
          .grads = dev.upload(dt, g),
          .master = master ? dev.upload(DType::F32, w) : Tensor(),
          .m = dev.upload(DType::F32, m),
          .v = dev.upload(DType::F32, v),
          .norm = dev.poisoned(DType::F32, 1)};
}
void step_state(const AdamWParams& p, const AdamWSegmentTable& table, const ScaledState& s, Context& ctx) {
  adamw_step(p, table, s.params, s.grads, s.master, s.m, s.v, s.norm, ctx);
}

// Host state as after a few steps: f32 master weights, nonzero moments.
struct HostState {
  std::vector<double> w, m, v;
};
HostState host_state(size_t n, std::mt19937_64& rng) {
  HostState h{.w = randn<double>(n, rng, 1.0), .m = randn<double>(n, rng, 0.01), .v = randn<double>(n, rng, 0.01)};
  for (size_t i = 0; i < n; ++i) {
    h.w[i] = static_cast<float>(h.w[i]);
    h.m[i] = static_cast<float>(h.m[i]);
    h.v[i] = static_cast<float>(h.v[i] * h.v[i]);
  }
  return h;
}

const std::pair<DType, bool> kScaledKinds[] = {{DType::F32, false}, {DType::BF16, true}, {DType::F16, true}};

// Gradients that hold S·g (S = 2^16, exact in every dtype for these magnitudes: S·g < 65504 in f16) update exactly
// as g does: the norm partials scale by S² (exact), the norm is divided by S, and g·(c/S) in registers has the bits
// of g·c. So the norm, the master, m, v and the params agree bit for bit with the unscaled step, with clipping off
// and active, over many blocks (each block reduces the norm itself). An unscale that were dropped would leave m S
// times too large; a norm that were not divided by S would clip differently. The gaps hold NaN in both runs: they
// are never read, so they must not cause a skip.
TEST(CudaAdamWLossScaling, ScaledGradientsUpdateAsTheUnscaledOnes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const Layout L = make_layout();
  const size_t n = L.numel;
  const AdamWSegmentTable table(L.segments, ctx);
  constexpr double S = 65536.0;
  for (auto [dt, master] : kScaledKinds)
    for (const bool clip : {false, true}) {
      const std::string what = std::string(dtype_label(dt)) + (clip ? " clip" : "") + ", seed " +
                               std::to_string(test_seed());
      const HostState h = host_state(n, rng);
      const auto g0 = rounded(dt, randn<double>(n, rng, 0.02));
      std::vector<double> g(n), gs(n);
      double sq = 0;
      for (size_t i = 0; i < n; ++i) {
        g[i] = L.in_segment[i] ? g0[i] : std::numeric_limits<double>::quiet_NaN();
        gs[i] = g[i] * S;
        if (L.in_segment[i]) sq += g0[i] * g0[i];
      }
      DeviceArena dev(ctx);
      const ScaledState plain = upload_state(dev, dt, master, h.w, g, h.m, h.v);
      const ScaledState scaled = upload_state(dev, dt, master, h.w, gs, h.m, h.v);
      const float max_norm = clip ? static_cast<float>(0.5 * std::sqrt(sq)) : 0.0f;
      const AdamWParams p{.lr = 1e-2f, .step = 3, .max_grad_norm = max_norm};
      AdamWParams ps = p;
      ps.grad_scale = static_cast<float>(S);
      ps.skip_nonfinite = true;
      step_state(p, table, plain, ctx);
      step_state(ps, table, scaled, ctx);
      const auto norm = dev.download(plain.norm);
      EXPECT_NEAR(norm[0], std::sqrt(sq), 1e-5 * std::sqrt(sq)) << what;
      EXPECT_EQ(dev.download(scaled.norm), norm) << what << ": the norm must be the unscaled gradient's";
      EXPECT_EQ(dev.download(scaled.m), dev.download(plain.m)) << what << ": m";
      EXPECT_EQ(dev.download(scaled.v), dev.download(plain.v)) << what << ": v";
      EXPECT_EQ(dev.download(scaled.params), dev.download(plain.params)) << what << ": params";
      if (master) {
        EXPECT_EQ(dev.download(scaled.master), dev.download(plain.master)) << what << ": master";
      }
      EXPECT_NE(dev.download(master ? plain.master : plain.params), h.w) << what << ": the step must update";
    }
}

// An inf or a NaN in any segment element, in the first tile or the last, makes every block skip: params, master,
// m and v stay as they were, bit for bit, and the norm says why. The same gradient without skip_nonfinite does
// reach the parameters, so the check is not vacuous.
TEST(CudaAdamWLossScaling, NonFiniteGradientSkipsTheWholeStep) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const Layout L = make_layout();
  const size_t n = L.numel;
  const AdamWSegmentTable table(L.segments, ctx);
  size_t first = 0, last = n - 1;
  while (!L.in_segment[first]) ++first;
  while (!L.in_segment[last]) --last;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::pair<size_t, double> plants[] = {{first, inf}, {last, nan}, {n / 2, -inf}};
  for (auto [dt, master] : kScaledKinds)
    for (auto [at, bad] : plants) {
      ASSERT_TRUE(L.in_segment[at]);
      const std::string what = std::string(dtype_label(dt)) + " " + std::to_string(bad) + " at " + std::to_string(at);
      const HostState h = host_state(n, rng);
      std::vector<double> g = rounded(dt, randn<double>(n, rng, 0.02 * 1024));
      g[at] = bad;
      DeviceArena dev(ctx);
      const ScaledState s = upload_state(dev, dt, master, h.w, g, h.m, h.v);
      const auto params0 = dev.download(s.params), m0 = dev.download(s.m), v0 = dev.download(s.v);
      const std::vector<double> master0 = master ? dev.download(s.master) : std::vector<double>();
      step_state({.lr = 1e-2f, .step = 2, .max_grad_norm = 1.0f, .grad_scale = 1024.0f, .skip_nonfinite = true}, table,
                 s, ctx);
      const double norm = dev.download(s.norm)[0];
      EXPECT_FALSE(std::isfinite(norm)) << what;
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(norm)) << what;
      }
      auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
      };
      EXPECT_TRUE(same(dev.download(s.params), params0)) << what << ": params changed";
      EXPECT_TRUE(same(dev.download(s.m), m0)) << what << ": m changed";
      EXPECT_TRUE(same(dev.download(s.v), v0)) << what << ": v changed";
      if (master) {
        EXPECT_TRUE(same(dev.download(s.master), master0)) << what << ": master changed";
      }

      const ScaledState applied = upload_state(dev, dt, master, h.w, g, h.m, h.v);
      step_state({.lr = 1e-2f, .step = 2, .grad_scale = 1024.0f}, table, applied, ctx);
      EXPECT_FALSE(std::isfinite(dev.download(applied.m)[at])) << what << ": without skipping it must be applied";
    }
}

// ---- Master-less 16-bit parameters (LightSeq's mode): the update in f32 registers, round(w) written back. ----

// ulps of dt between a and b, at the larger magnitude's spacing.
// |a - b| in units of the 16-bit spacing at the largest of |a|, |b| and `at_least` (the largest magnitude the
// value had on its way: a rounding made while it was larger was coarser).
double ulps(DType dt, double a, double b, double at_least = 0.0) {
  const int mant = dt == DType::BF16 ? 8 : 11;  // significand bits with the implicit one
  const double mag = std::max({std::abs(a), std::abs(b), at_least, dt == DType::BF16 ? 1e-38 : 6.1e-5});
  const double spacing = std::ldexp(1.0, std::ilogb(mag) - (mant - 1));
  return std::abs(a - b) / spacing;
}

// From the same start (the master equal to the 16-bit params), one master-less step writes exactly round(the
// master-on step's f32 master): the same f32 math on the same values, rounded once, on the vector path and on
// the element-by-element path (buffers one element off alignment). m and v agree bit for bit. Over three more
// steps the master-less params drift from the master by their own rounding only: at most half an ulp a step, so
// within 2 ulps, 4 allowed, counted at the largest magnitude the value can have had on the way (|w0| plus 10 lr a
// step, far above AdamW's largest step; a value that shrank toward 0 was rounded more coarsely before, and in
// units of its final spacing it drifted by hundreds: measured on the H200).
TEST(CudaAdamWMasterless, StepIsRoundOfTheMasterStep) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const Layout L = make_layout();
  const size_t n = L.numel;
  const AdamWSegmentTable table(L.segments, ctx);
  for (const DType dt : {DType::BF16, DType::F16})
    for (const bool misaligned : {false, true}) {
      const std::string what = std::string(dtype_label(dt)) + (misaligned ? " misaligned" : "") + ", seed " +
                               std::to_string(test_seed());
      DeviceArena dev(ctx);
      auto place = [&](DType t, const std::vector<double>& vals) {
        if (!misaligned) return dev.upload(t, vals);
        std::vector<double> shifted(vals.size() + 1, 0.0);
        std::copy(vals.begin(), vals.end(), shifted.begin() + 1);
        return dev.upload(t, shifted).slice1d(1, static_cast<int64_t>(vals.size()));
      };
      HostState h = host_state(n, rng);
      h.w = rounded(dt, h.w);  // the master starts as the 16-bit value, so both runs start from the same numbers
      const Tensor on_params = place(dt, h.w), on_master = place(DType::F32, h.w), on_m = place(DType::F32, h.m),
                   on_v = place(DType::F32, h.v);
      const Tensor off_params = place(dt, h.w), off_m = place(DType::F32, h.m), off_v = place(DType::F32, h.v);
      const Tensor norm = dev.alloc(DType::F32, 1);
      std::string why;
      ASSERT_TRUE(adamw_supports(dt, /*master=*/false, ctx.device(), &why)) << why;
      for (int64_t step = 3; step <= 6; ++step) {
        const auto g = rounded(dt, randn<double>(n, rng, 0.02));
        const Tensor grads = place(dt, g);
        const AdamWParams p{.lr = 1e-2f, .step = step, .max_grad_norm = 1.0f};
        adamw_step(p, table, on_params, grads, on_master, on_m, on_v, norm, ctx);
        adamw_step(p, table, off_params, grads, Tensor(), off_m, off_v, norm, ctx);
        const auto master = dev.download(on_master), got = dev.download(off_params);
        if (step == 3) {
          EXPECT_EQ(got, dev.download(on_params)) << what << ": one step from the same start";
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(got[i], round_to(dt, master[i])) << what << ": params[" << i << "] is not round(master)";
          EXPECT_EQ(dev.download(off_m), dev.download(on_m)) << what << ": m";
          EXPECT_EQ(dev.download(off_v), dev.download(on_v)) << what << ": v";
          EXPECT_NE(got, h.w) << what << ": the step must change the 16-bit params";
        } else {
          double worst = 0;
          for (size_t i = 0; i < n; ++i)
            if (L.in_segment[i])
              worst = std::max(worst, ulps(dt, got[i], master[i], std::abs(h.w[i]) + 10.0 * 1e-2 * (step - 2)));
          EXPECT_LE(worst, 4.0) << what << ": step " << step << ", the master-less params drift from the master";
        }
      }
      // Gaps untouched.
      const auto got = dev.download(off_params);
      for (size_t i = 0; i < n; ++i)
        if (!L.in_segment[i]) {
          ASSERT_EQ(got[i], h.w[i]) << what << ": gap element " << i << " changed";
        }
    }
}

TEST(CudaAdamW, NormIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const size_t n = 3'000'001;
  const std::vector<ParamSegment> segs = {{.name = "a", .offset = 0, .numel = 1'000'003, .decay = true},
                                          {.name = "b", .offset = 1'000'008, .numel = n - 1'000'008, .decay = false}};
  const AdamWSegmentTable table(segs, ctx);
  DeviceArena dev(ctx);
  const auto g = randn<double>(n, rng, 0.1);
  const Tensor tg = dev.upload(DType::BF16, g), tnorm = dev.alloc(DType::F32, 1);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor tp = dev.upload(DType::BF16, std::vector<double>(n, 0.5)),
                 tw = dev.upload(DType::F32, std::vector<double>(n, 0.5));
    const Tensor tm = dev.upload(DType::F32, std::vector<double>(n, 0.0)),
                 tv = dev.upload(DType::F32, std::vector<double>(n, 0.0));
    adamw_step({.max_grad_norm = 1.0f}, table, tp, tg, tw, tm, tv, tnorm, ctx);
    const auto got = dev.download(tnorm);
    const auto w = dev.download(tw);
    std::vector<double> both = got;
    both.insert(both.end(), w.begin(), w.begin() + 1000);
    if (run == 0) first = both;
    else ASSERT_EQ(both, first) << "the norm or the update differs between identical runs";
  }
}

// The CPU route (runs without a GPU): clip_grad_norm_ref then adamw_update_ref, the norm written to a host scalar.
TEST(CudaAdamW, CpuEntryRoutesToReference) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(test_seed());
  const Layout L = make_layout();
  const size_t n = L.numel;
  std::vector<float> w(n), g(n), m(n, 0.0f), v(n, 0.0f);
  const auto w0 = randn<double>(n, rng), g0 = randn<double>(n, rng, 0.02);
  for (size_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(w0[i]);
    g[i] = L.in_segment[i] ? static_cast<float>(g0[i]) : 0.0f;
  }
  std::vector<float> w_ref = w, g_ref = g, m_ref = m, v_ref = v;
  const AdamWParams p{.lr = 1e-2f, .step = 1, .max_grad_norm = 0.5f};
  const double norm = clip_grad_norm_ref(g_ref.data(), n, p.max_grad_norm);
  adamw_update_ref(p, L.segments, w_ref.data(), g_ref.data(), m_ref.data(), v_ref.data());
  float got_norm = -1;
  const int64_t N = static_cast<int64_t>(n);
  const AdamWSegmentTable table(L.segments, ctx);
  adamw_step(p, table, Tensor(w.data(), DType::F32, {N}), Tensor(g.data(), DType::F32, {N}), Tensor(),
             Tensor(m.data(), DType::F32, {N}), Tensor(v.data(), DType::F32, {N}), Tensor(&got_norm, DType::F32, {1}),
             ctx);
  EXPECT_FLOAT_EQ(got_norm, static_cast<float>(norm));
  EXPECT_EQ(w, w_ref);
  EXPECT_EQ(m, m_ref);
  EXPECT_EQ(v, v_ref);
}

TEST(CudaAdamW, SupportsAnswersWithoutGpu) {
  std::string why;
  EXPECT_TRUE(adamw_supports(DType::F32, /*master=*/false, Device::cpu(), &why)) << why;
  EXPECT_FALSE(adamw_supports(DType::F32, /*master=*/true, Device::cpu(), &why));
  EXPECT_FALSE(adamw_supports(DType::BF16, /*master=*/true, Device::cpu(), &why));
  EXPECT_TRUE(adamw_supports(DType::BF16, /*master=*/false, Device::cuda(0), &why)) << why;  // LightSeq's mode
  EXPECT_TRUE(adamw_supports(DType::F16, /*master=*/false, Device::cuda(0), &why)) << why;
  EXPECT_TRUE(adamw_supports(DType::BF16, /*master=*/true, Device::cuda(0), &why)) << why;
  EXPECT_TRUE(adamw_supports(DType::F32, /*master=*/false, Device::cuda(0), &why)) << why;
  Context ctx(Device::cpu());
  EXPECT_THROW(AdamWSegmentTable({{.name = "a", .offset = 0, .numel = 10}, {.name = "b", .offset = 5, .numel = 10}},
                                 ctx),
               Error);
}

}  // namespace
}  // namespace tessera::test

// The optimizer object without norm tracking (the one-launch step the AdamW bench row times) updates exactly as
// one that tracks the norm, on the GPU and on the CPU, and refuses read_grad_norm.
namespace tessera::test {
namespace {
void expect_untracked_step_matches(Context& ctx, DType dt) {
  Gpt a(model_preset("tiny"), ctx, dt), b(model_preset("tiny"), ctx, dt);
  a.init_weights(5);
  b.init_weights(5);
  const int64_t n = static_cast<int64_t>(a.params().size());
  std::vector<float> g(static_cast<size_t>(n));
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<float> nd(0.0f, 1e-2f);
  for (float& x : g) x = nd(rng);
  std::vector<char> bytes(static_cast<size_t>(n) * dtype_size(dt));
  convert_from_f32(g.data(), g.size(), dt, bytes.data());
  for (Gpt* m : {&a, &b})
    copy_bytes(m->params().grad().data(), ctx.device(), bytes.data(), Device::cpu(), bytes.size(), ctx);
  AdamW tracked(a.params(), {.grad_clip = 0.0f}, ctx),
      plain(b.params(), {.grad_clip = 0.0f, .track_grad_norm = false}, ctx);
  for (int s = 0; s < 2; ++s) {
    tracked.step(a.params(), 1e-3f);
    plain.step(b.params(), 1e-3f);
  }
  EXPECT_EQ(a.params().read_f32(ctx), b.params().read_f32(ctx));
  EXPECT_NE(a.params().read_f32(ctx), [&] {
    Gpt c(model_preset("tiny"), ctx, dt);
    c.init_weights(5);
    return c.params().read_f32(ctx);
  }()) << "the steps must change the parameters";
  EXPECT_GT(tracked.read_grad_norm(), 0.0);
  EXPECT_THROW(plain.read_grad_norm(), Error);
}
}  // namespace

TEST(CudaAdamW, UntrackedNormStepsTheSame) {
  Context cpu;
  expect_untracked_step_matches(cpu, DType::F32);
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible (CPU case checked)";
  Context gpu = Context::best_available();
  expect_untracked_step_matches(gpu, DType::BF16);
}
}  // namespace tessera::test
