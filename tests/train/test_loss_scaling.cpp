// Dynamic loss scaling on the CPU, which CI runs: the LossScaler's state machine, the AdamW object's skipped
// step (no bias-correction advance), and the training loop with an overflow planted before the optimizer step
// (an f32 run with loss_scaling on: the same loop an f16 run takes on a GPU, where tests/cuda/test_f16_cuda.cpp
// repeats it in f16).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/loss_scaler.h"
#include "tessera/train/optimizer.h"
#include "tessera/train/safetensors.h"
#include "tessera/train/trainer.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterTheIntervalOfGoodSteps) {
  LossScaler s({.init_scale = 1024.0, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(/*overflow=*/true, 1);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.good_steps(), 0);
  s.update(false, 2);
  s.update(false, 3);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.good_steps(), 2);
  s.update(true, 4);  // an overflow restarts the run of good steps
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_EQ(s.good_steps(), 0);
  for (int i = 0; i < 3; ++i) s.update(false, 5 + i);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.good_steps(), 0);
  const LossScaler defaults;
  EXPECT_EQ(defaults.scale(), 65536.0);
  EXPECT_EQ(defaults.config().growth_interval, 2000);
}

TEST(LossScaler, StaysWithinItsBoundsAndCallsAnOverflowAtTheMinimumDivergence) {
  LossScaler s({.init_scale = 2.0, .growth_interval = 1, .max_scale = 8.0});
  s.update(true, 1);
  EXPECT_EQ(s.scale(), 1.0);
  try {
    s.update(true, 7);
    ADD_FAILURE() << "an overflow at scale 1 must end the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.scale(), 1.0);
  for (int i = 0; i < 10; ++i) s.update(false, 10 + i);
  EXPECT_EQ(s.scale(), 8.0);  // capped
  s.set_state(4.0, 0);
  EXPECT_EQ(s.scale(), 4.0);
  EXPECT_THROW(s.set_state(0.5, 0), Error);
  EXPECT_THROW(s.set_state(16.0, 0), Error);
  EXPECT_THROW(s.set_state(4.0, -1), Error);
  EXPECT_THROW(LossScaler({.init_scale = 0.5}), Error);
  EXPECT_THROW(LossScaler({.init_scale = std::numeric_limits<double>::infinity()}), Error);
  EXPECT_THROW(LossScaler({.growth_interval = 0}), Error);
}

// A skipped step leaves the parameters as they were and does not count: the next good step is step 2 of the bias
// correction, so the run equals one that never saw the bad gradient, bit for bit.
TEST(LossScaling, SkippedOptimizerStepDoesNotCount) {
  Context ctx;
  Gpt a(model_preset("tiny"), ctx, DType::F32), b(model_preset("tiny"), ctx, DType::F32);
  a.init_weights(5);
  b.init_weights(5);
  const size_t n = a.params().size();
  std::mt19937_64 rng(test::test_seed());
  const std::vector<float> g1 = test::randn<float>(n, rng, 1e-2), g2 = test::randn<float>(n, rng, 1e-2);
  AdamW scaled(a.params(), {}, ctx), plain(b.params(), {}, ctx);
  const float S = 4096.0f;
  auto set_grad = [&](Gpt& m, const std::vector<float>& g, float scale) {
    float* d = m.params().host_grad<float>();
    for (size_t i = 0; i < n; ++i) d[i] = g[i] * scale;
  };
  const GradScaling scaling{.scale = S, .skip_nonfinite = true};

  set_grad(a, g1, S);
  scaled.step(a.params(), 1e-3f, scaling);
  EXPECT_THROW(scaled.step(a.params(), 1e-3f, scaling), Error) << "a step that may be skipped must be read first";
  StepReport r = scaled.read_step();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(scaled.step_count(), 1);
  const std::vector<float> after_first = a.params().read_f32(ctx);

  set_grad(a, g2, S);
  a.params().host_grad<float>()[n / 2] = std::numeric_limits<float>::infinity();
  scaled.step(a.params(), 1e-3f, scaling);
  r = scaled.read_step();
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(scaled.step_count(), 1) << "a skipped step must not advance the bias correction";
  EXPECT_EQ(a.params().read_f32(ctx), after_first);

  set_grad(a, g2, S);
  scaled.step(a.params(), 1e-3f, scaling);
  EXPECT_FALSE(scaled.read_step().skipped);
  EXPECT_EQ(scaled.step_count(), 2);

  set_grad(b, g1, 1.0f);
  plain.step(b.params(), 1e-3f);
  set_grad(b, g2, 1.0f);
  plain.step(b.params(), 1e-3f);
  EXPECT_EQ(plain.step_count(), 2);
  EXPECT_EQ(a.params().read_f32(ctx), b.params().read_f32(ctx));
  EXPECT_EQ(scaled.read_m(), plain.read_m());
  EXPECT_EQ(scaled.read_v(), plain.read_v());
}

// ---- The training loop. ----

TrainOptions options(const fs::path& d) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  if (!fs::exists(d / "data")) prepare_text(text, (d / "data").string());
  TrainOptions o;
  o.model = test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/24,
                               /*max_seq=*/16);
  o.data = (d / "data").string();
  o.batch = 2;
  o.seq = 8;
  o.accum = 2;
  o.warmup = 1;
  o.val_every = 0;
  o.ckpt_every = 0;
  o.progress = false;
  o.steps = 6;
  o.device = "cpu";  // the tests plant an inf in the host gradient (on a GPU machine the default is the GPU)
  return o;
}

std::vector<nlohmann::json> metrics(const fs::path& out) {
  std::vector<nlohmann::json> recs;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) recs.push_back(nlohmann::json::parse(line));
  return recs;
}

std::vector<float> weights(const std::string& ckpt) {
  auto m = load_checkpoint_model(ckpt);
  return m->params().read_f32(m->context());
}

// A power-of-2 loss scale is exact in f32 through the whole backward (every op is linear in the incoming gradient)
// and AdamW divides it out exactly: without an overflow, a loss-scaled run is the unscaled run, bit for bit. A
// scale that reached the backward but not the optimizer (or the reverse) would differ by orders of magnitude.
TEST(LossScaling, ScaledRunWithoutOverflowEqualsTheUnscaledRun) {
  const fs::path d = test::temp_dir("lossscale_same");
  TrainOptions o = options(d);
  o.out = (d / "plain").string();
  train(o);
  o.out = (d / "scaled").string();
  o.loss_scaling = true;
  o.loss_scale_init = 1024.0;
  o.loss_scale_interval = 2;
  const TrainResult r = train(o);
  const auto a = metrics(d / "plain"), b = metrics(d / "scaled");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << "step " << i + 1;
    EXPECT_FALSE(a[i].contains("loss_scale"));
    EXPECT_FALSE(b[i]["skipped"].get<bool>());
  }
  // Doubling every 2 good steps: 1024, 1024, 2048, 2048, 4096, 4096.
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i]["loss_scale"].get<double>(), 1024.0 * (1 << (i / 2)));
  EXPECT_EQ(r.loss_scale, 8192.0);
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_EQ(weights((d / "plain" / "checkpoint").string()), weights((d / "scaled" / "checkpoint").string()));
  fs::remove_all(d);
}

// An inf planted in the gradient at step 3: the step is skipped (the parameters at step 4 are those of step 3),
// the scale halves, the optimizer's count lags the run's by one, the losses go on finite, and the metrics and the
// checkpoint say so. Stopping after step 4 and resuming gives the same run, bit for bit: the scaler's state and
// the optimizer's step travel in the checkpoint.
TEST(LossScaling, PlantedOverflowSkipsTheStepAndHalvesTheScale) {
  const fs::path d = test::temp_dir("lossscale_skip");
  TrainOptions o = options(d);
  o.loss_scaling = true;
  o.loss_scale_init = 1024.0;
  o.loss_scale_interval = 2;
  std::vector<std::vector<float>> before_step(8);  // the parameters each step's optimizer starts from
  TrainControl c;
  c.before_optimizer_step = [&](int64_t step, Model& m) {
    before_step[step] = m.params().read_f32(m.context());
    if (step == 3) m.params().host_grad<float>()[7] = std::numeric_limits<float>::infinity();
  };
  o.out = (d / "full").string();
  const TrainResult r = train(train_setup(o), c);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(before_step[4], before_step[3]) << "step 3 must leave the parameters alone";
  EXPECT_NE(before_step[3], before_step[2]);
  EXPECT_NE(before_step[5], before_step[4]);

  const auto recs = metrics(d / "full");
  ASSERT_EQ(recs.size(), 6u);
  // Scales used: step 1 1024, 2 1024 (then 2 good steps: 2048), 3 2048 skipped (1024), 4 1024, 5 1024 (2048),
  // 6 2048; after step 6: 2048 with 1 good step.
  const double used[] = {1024, 1024, 2048, 1024, 1024, 2048};
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i]["loss_scale"].get<double>(), used[i]) << "step " << i + 1;
    EXPECT_EQ(recs[i]["skipped"].get<bool>(), i == 2) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(recs[i]["loss"].get<double>()));
    EXPECT_EQ(recs[i]["grad_norm"].is_null(), i == 2) << "step " << i + 1;
  }
  EXPECT_EQ(r.loss_scale, 2048.0);
  auto model = load_checkpoint_model(r.checkpoint);
  const TrainState st = load_train_state(r.checkpoint, *model);
  EXPECT_EQ(st.step, 6);
  EXPECT_EQ(st.optimizer_step, 5);
  EXPECT_EQ(st.loss_scale, 2048.0);
  EXPECT_EQ(st.loss_scale_good_steps, 1);

  // Interrupted after step 4, resumed.
  o.out = (d / "split").string();
  o.stop_after = 4;
  train(train_setup(o), c);
  TrainOptions resume;
  resume.resume = (d / "split" / "checkpoint").string();
  resume.device = o.device;
  resume.out = o.out;
  resume.steps = 0;
  resume.progress = false;
  resume.loss_scaling = true;
  resume.loss_scale_interval = 2;
  train(train_setup(resume), c);
  const auto split = metrics(d / "split");
  ASSERT_EQ(split.size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(split[i]["loss"].get<double>(), recs[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(split[i]["loss_scale"].get<double>(), recs[i]["loss_scale"].get<double>()) << "step " << i + 1;
  }
  EXPECT_EQ(weights((d / "split" / "checkpoint").string()), weights(r.checkpoint));
  fs::remove_all(d);
}

// A checkpoint written before loss scaling existed has neither the optimizer's step nor a scaler state: it loads
// with the optimizer at the run's step and no scale.
TEST(LossScaling, OldCheckpointsLoadWithoutScalerState) {
  const fs::path d = test::temp_dir("lossscale_old");
  TrainOptions o = options(d);
  o.out = (d / "run").string();
  o.steps = 2;
  const TrainResult r = train(o);
  const std::string file = (fs::path(r.checkpoint) / "optimizer.safetensors").string();
  auto model = load_checkpoint_model(r.checkpoint);
  {  // rewrite optimizer.safetensors without the new keys
    const SafetensorsFile st = SafetensorsFile::load(file);
    const int64_t n = static_cast<int64_t>(model->params().size());
    std::vector<float> m(n), v(n);
    st.read_f32("adam.m", {n}, m.data());
    st.read_f32("adam.v", {n}, v.data());
    SafetensorsWriter w;
    w.add("adam.m", DType::F32, {n}, m.data());
    w.add("adam.v", DType::F32, {n}, v.data());
    for (const auto& [k, val] : st.metadata())
      if (k != "optimizer_step" && k != "loss_scale" && k != "loss_scale_good_steps") w.set_metadata(k, val);
    ASSERT_TRUE(st.metadata().count("optimizer_step"));
    w.write(file + ".new");
  }
  fs::rename(file + ".new", file);
  const TrainState st = load_train_state(r.checkpoint, *model);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.optimizer_step, 2);
  EXPECT_EQ(st.loss_scale, 0.0);
  // And it resumes.
  TrainOptions resume;
  resume.resume = r.checkpoint;
  resume.out = o.out;
  resume.steps = 3;
  resume.progress = false;
  EXPECT_EQ(train(train_setup(resume)).last_step, 3);
  fs::remove_all(d);
}

TEST(LossScaling, SetupRefusesBadFlagsAndF16OnTheCpu) {
  const fs::path d = test::temp_dir("lossscale_flags");
  TrainOptions o = options(d);
  o.device = "cpu";
  o.loss_scaling = true;
  o.loss_scale_init = 0.25;
  EXPECT_THROW(train_setup(o), Error);
  o.loss_scale_init = 1024;
  o.loss_scale_interval = 0;
  EXPECT_THROW(train_setup(o), Error);
  o.loss_scale_interval = 10;
  EXPECT_NO_THROW(train_setup(o));
  o.precision = "f16";
  EXPECT_THROW(train_setup(o), Error);  // the CPU reference trains in f32
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Without loss scaling an inf gradient is applied (the parameters become NaN): the run stops with one line at that
// step, before anything is saved, so the checkpoint of the step before stays the last good one.
TEST(Diverged, ANonFiniteGradientStopsTheRunBeforeItOverwritesTheCheckpoint) {
  const fs::path d = test::temp_dir("diverged_grad");
  TrainOptions o = options(d);
  o.ckpt_every = 1;
  o.out = (d / "run").string();
  TrainControl c;
  c.before_optimizer_step = [&](int64_t step, Model& m) {
    if (step == 3) m.params().host_grad<float>()[7] = std::numeric_limits<float>::infinity();
  };
  try {
    train(train_setup(o), c);
    FAIL() << "a run with an inf gradient finished";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged: the gradient norm is inf at step 3"), std::string::npos)
        << e.what();
  }
  const std::string ckpt = (d / "run" / "checkpoint").string();
  const TrainState st = load_train_state(ckpt, *load_checkpoint_model(ckpt));
  EXPECT_EQ(st.step, 2) << "the checkpoint of step 2 must stay the last one written";
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
