// f16 training with dynamic loss scaling on the GPU: an overflow planted in the f16 gradient buffer before the
// optimizer step is skipped (the f32 master weights do not move, the optimizer's count does not advance), the
// scale halves, the loss curve goes on, a resumed run continues exactly, and f16 training follows f32.
// tests/train/test_loss_scaling.cpp checks the same loop on the CPU (in f32, with loss scaling asked for).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "cuda_train_util.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/trainer.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> metrics(const std::string& out) {
  std::vector<nlohmann::json> recs;
  std::ifstream f(fs::path(out) / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) recs.push_back(nlohmann::json::parse(line));
  return recs;
}

double tail_mean(const std::vector<nlohmann::json>& recs, size_t k) {
  double s = 0;
  for (size_t i = recs.size() - k; i < recs.size(); ++i) s += recs[i]["loss"].get<double>();
  return s / static_cast<double>(k);
}

constexpr int64_t kPlantStep = 5;

// The planted step is skipped: the master weights the step after starts from are those of the planted step, the
// metrics mark it (and only natural overflows besides), the next step's scale is half, and the checkpoint's
// optimizer step is the run's steps less the skipped ones. The losses stay finite and fall.
TEST(CudaLossScaling, F16SkipsAPlantedOverflowAndHalvesTheScale) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path d = temp_dir("cuda_f16_skip");
  prepare_text(bundled_corpus(), (d / "data").string());
  TrainOptions o = tiny_run(d, "planted", "cuda", "f16", 30);
  o.loss_scale_init = 1024.0;  // small enough that the tiny model does not overflow by itself (checked below)
  std::vector<std::vector<float>> before(o.steps + 2);
  TrainControl c;
  c.before_optimizer_step = [&](int64_t step, Model& m) {
    before[step] = m.params().read_f32(m.context());  // the f32 master weights
    if (step == kPlantStep) plant_inf_f16(m);
  };
  const TrainResult r = train(train_setup(o), c);
  EXPECT_EQ(r.model->params().dtype(), DType::F16);
  EXPECT_EQ(before[kPlantStep + 1], before[kPlantStep]) << "the planted step must leave the master weights alone";
  EXPECT_NE(before[kPlantStep], before[kPlantStep - 1]);
  EXPECT_NE(before[kPlantStep + 2], before[kPlantStep + 1]);
  const auto recs = metrics(o.out);
  ASSERT_EQ(recs.size(), 30u);
  int64_t skipped = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    EXPECT_TRUE(std::isfinite(recs[i]["loss"].get<double>())) << "step " << step;
    const bool sk = recs[i]["skipped"].get<bool>();
    EXPECT_EQ(sk, step == kPlantStep) << "step " << step << " (an unplanted overflow at scale " << recs[i]["loss_scale"]
                                      << ")";
    skipped += sk;
  }
  EXPECT_EQ(recs[kPlantStep - 1]["loss_scale"].get<double>(), 1024.0);
  EXPECT_EQ(recs[kPlantStep]["loss_scale"].get<double>(), 512.0) << "the scale must halve after the overflow";
  EXPECT_EQ(r.skipped_steps, skipped);
  EXPECT_EQ(r.loss_scale, 512.0);  // 25 good steps since, far from the 2000 that double it
  auto saved = load_checkpoint_model(r.checkpoint);
  const TrainState st = load_train_state(r.checkpoint, *saved);
  EXPECT_EQ(st.step, 30);
  EXPECT_EQ(st.optimizer_step, 30 - skipped);
  EXPECT_EQ(st.loss_scale, 512.0);
  EXPECT_EQ(st.loss_scale_good_steps, 30 - kPlantStep);
  EXPECT_LT(recs.back()["loss"].get<double>(), recs.front()["loss"].get<double>() - 1.0) << "the loss must fall";

  // Stopped after step 8 and resumed in f16: the same weights as the straight run (the scaler's state and the
  // optimizer's step came back from the checkpoint).
  TrainOptions first = tiny_run(d, "split", "cuda", "f16", 30);
  first.loss_scale_init = 1024.0;
  first.stop_after = 8;
  train(train_setup(first), c);
  TrainOptions rest;
  rest.resume = (d / "split" / "checkpoint").string();
  rest.out = (d / "split").string();
  rest.steps = 30;
  rest.progress = false;
  rest.device = "cuda";
  rest.precision = "f16";
  const TrainResult resumed = train(train_setup(rest), c);
  EXPECT_EQ(resumed.model->params().read_f32(*resumed.context), r.model->params().read_f32(*r.context));
  fs::remove_all(d);
}

// f16 (f32 master weights, loss scale from the default 2^16) follows f32 from the same seed over 60 steps of
// `tiny`: the mean of the last 10 losses within 3%, and not equal step for step (which would mean f16 was
// ignored). Natural overflows, if any, are skipped and counted.
TEST(CudaLossScaling, F16FollowsF32) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path d = temp_dir("cuda_f16_f32");
  prepare_text(bundled_corpus(), (d / "data").string());
  const TrainResult r32 = train(tiny_run(d, "f32", "cuda", "f32", 60));
  const TrainResult r16 = train(tiny_run(d, "f16", "cuda", "f16", 60));
  const auto l32 = metrics((d / "f32").string()), l16 = metrics((d / "f16").string());
  ASSERT_EQ(l32.size(), 60u);
  ASSERT_EQ(l16.size(), 60u);
  EXPECT_FALSE(l32[0].contains("loss_scale"));
  EXPECT_EQ(l16[0]["loss_scale"].get<double>(), 65536.0);
  EXPECT_LT(r16.skipped_steps, 10) << "overflows at nearly every step: the scale is not coming down";
  bool all_equal = true;
  for (size_t i = 0; i < l32.size(); ++i) all_equal &= l32[i]["loss"] == l16[i]["loss"];
  EXPECT_FALSE(all_equal) << "the f16 run's losses equal the f32 run's, step for step";
  const double m32 = tail_mean(l32, 10), m16 = tail_mean(l16, 10);
  EXPECT_LT(m32, l32.front()["loss"].get<double>() - 1.0) << "the f32 run must learn";
  EXPECT_NEAR(m16, m32, 0.03 * m32) << "f16 " << m16 << " vs f32 " << m32;
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera::test
