// bench model's f16 step on the CPU: dynamic loss scaling as `train --precision f16` steps (StepLossScaling).
// The CPU computes in f32, so these drive the same path in f32 with loss scaling asked for, as
// tests/train/test_loss_scaling.cpp drives train's: a power-of-2 scale is exact there, so the scaled step must equal
// the unscaled one bit for bit (a scale missing from the backward or from AdamW's unscaling would not), and an
// overflow planted in the gradient must skip its step (the parameters unchanged) and halve the scale.
// tests/cuda/test_graph_step_cuda.cpp runs it in f16 on a GPU, as graphs and eagerly, where a scale too large for
// f16 overflows the backward by itself.
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/bench/model.h"
#include "tessera/models/config.h"
#include "tessera/models/gpt.h"
#include "test_util.h"

namespace tessera {
namespace {

// What the bench's hook saw before each optimizer step: the parameters it started from and the loss of its forward.
struct Seen {
  std::map<int64_t, std::vector<float>> params;
  std::map<int64_t, double> loss;
};

// "" when a and b hold the same values, else where they first differ (a failure names one element, not two vectors).
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) {
      std::ostringstream s;
      s << std::setprecision(9) << "element " << i << ": " << a[i] << " vs " << b[i];
      return s.str();
    }
  return "";
}

// fwd-bwd and step of the tiny model, 1 warm-up and `steps` timed runs (no graphs on the CPU: every one eager).
ModelBenchConfig config(int steps) {
  ModelBenchConfig bc;
  bc.batch = 2;
  bc.seq = 16;
  bc.fwd = false;
  bc.warmup = 1;
  bc.steps = steps;
  bc.seed = test::test_seed();
  return bc;
}

ModelBenchRow run(ModelBenchConfig bc, Seen& seen, int64_t plant_at = 0) {
  bc.before_optimizer_step = [&seen, plant_at](int64_t step, Model& m) {
    seen.params[step] = m.params().read_f32(m.context());
    seen.loss[step] = m.read_loss();
    if (step == plant_at) m.params().host_grad<float>()[7] = std::numeric_limits<float>::infinity();
  };
  Context ctx;
  return bench_model(model_preset("tiny"), bc, ctx, 0.0);
}

TEST(BenchModelLossScaling, ScaledStepEqualsTheUnscaledStepBitForBit) {
  SCOPED_TRACE("TESSERA_TEST_SEED=" + std::to_string(test::test_seed()));
  const ModelBenchConfig plain_cfg = config(/*steps=*/3);
  ModelBenchConfig scaled_cfg = plain_cfg;
  scaled_cfg.loss_scaling = true;
  scaled_cfg.loss_scaler = {.init_scale = 1024.0, .growth_interval = 1000};
  Seen plain, scaled;
  const ModelBenchRow p = run(plain_cfg, plain), s = run(scaled_cfg, scaled);
  ASSERT_TRUE(p.step && s.step && s.fwd_bwd);
  EXPECT_FALSE(p.loss_scale) << "no loss scaling asked for in f32";
  ASSERT_TRUE(s.loss_scale);
  EXPECT_EQ(*s.loss_scale, 1024.0);
  EXPECT_EQ(s.optimizer_steps, 4);  // 1 warm-up + 3 timed
  EXPECT_EQ(s.skipped_steps, 0);
  ASSERT_EQ(scaled.params.size(), 4u);
  for (int64_t step = 1; step <= 4; ++step) {
    EXPECT_TRUE(std::isfinite(scaled.loss[step])) << "step " << step;
    EXPECT_EQ(scaled.loss[step], plain.loss[step]) << "step " << step;
    EXPECT_EQ(first_difference(scaled.params[step], plain.params[step]), "")
        << "the parameters step " << step << " starts from";
    if (step > 1) {
      EXPECT_NE(first_difference(scaled.params[step], scaled.params[step - 1]), "")
          << "step " << step - 1 << " changed nothing";
    }
  }
}

TEST(BenchModelLossScaling, PlantedOverflowSkipsTheStepAndHalvesTheScale) {
  SCOPED_TRACE("TESSERA_TEST_SEED=" + std::to_string(test::test_seed()));
  ModelBenchConfig bc = config(/*steps=*/3);
  bc.loss_scaling = true;
  bc.loss_scaler = {.init_scale = 1024.0, .growth_interval = 1000};
  Seen seen;
  const ModelBenchRow r = run(bc, seen, /*plant_at=*/2);
  ASSERT_TRUE(r.loss_scale);
  EXPECT_EQ(*r.loss_scale, 512.0);
  EXPECT_EQ(r.optimizer_steps, 4);
  EXPECT_EQ(r.skipped_steps, 1);
  ASSERT_EQ(seen.params.size(), 4u);
  EXPECT_NE(first_difference(seen.params[2], seen.params[1]), "") << "step 1 is a good step";
  EXPECT_EQ(first_difference(seen.params[3], seen.params[2]), "")
      << "step 2 overflowed: it must leave the parameters alone";
  EXPECT_NE(first_difference(seen.params[4], seen.params[3]), "") << "step 3 is a good step again, at half the scale";
  for (const auto& [step, loss] : seen.loss) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
}

}  // namespace
}  // namespace tessera
