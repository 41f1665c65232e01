// Training with --master-weights off on the GPU (LightSeq's mode): only 16-bit parameters exist, the checkpoint
// is still f32 and loads as such, a resumed run continues bit for bit, and the loss follows the run with f32
// master weights. tests/cuda/test_optim_cuda.cpp checks the kernel (CudaAdamWMasterless).
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

// `tiny` in bf16 on the GPU, with or without f32 master weights.
TrainOptions bf16_run(const fs::path& d, const std::string& out, bool master, int steps) {
  TrainOptions o = tiny_run(d, out, "cuda", "bf16", steps);
  o.master_weights = master;
  return o;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  std::ifstream f(fs::path(out) / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) l.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return l;
}

double tail_mean(const std::vector<double>& l) {
  double s = 0;
  for (size_t i = l.size() - 10; i < l.size(); ++i) s += l[i];
  return s / 10;
}

TEST(CudaMasterWeights, OffTrainsChecksInF32AndResumesExactly) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path d = temp_dir("cuda_masterless");
  prepare_text(bundled_corpus(), (d / "data").string());
  const TrainResult on = train(bf16_run(d, "on", true, 60));
  const TrainResult off = train(bf16_run(d, "off", false, 60));
  EXPECT_TRUE(on.model->params().has_master());
  EXPECT_FALSE(off.model->params().has_master()) << "--master-weights off must not allocate f32 masters";

  // The loss falls as with master weights (bf16 rounding of every update costs little over 60 steps of `tiny`),
  // and the two runs differ (the option reached the optimizer).
  const auto l_on = losses((d / "on").string()), l_off = losses((d / "off").string());
  ASSERT_EQ(l_off.size(), 60u);
  EXPECT_NE(l_off, l_on);
  EXPECT_LT(tail_mean(l_off), l_off.front() - 1.0) << "the master-less run must learn";
  EXPECT_NEAR(tail_mean(l_off), tail_mean(l_on), 0.05 * tail_mean(l_on));

  // The checkpoint holds f32 values: exactly the bf16 parameters, widened.
  auto saved = load_checkpoint_model(off.checkpoint);
  const std::vector<float> w = saved->params().read_f32(saved->context());
  EXPECT_EQ(w, off.model->params().read_f32(*off.context));
  for (size_t i = 0; i < w.size(); i += 97) ASSERT_EQ(w[i], round_to(DType::BF16, w[i])) << "element " << i;

  // Stopped after step 30 and resumed (still master-less): the same parameters as the straight run.
  TrainOptions first = bf16_run(d, "split", false, 60);
  first.stop_after = 30;
  train(first);
  TrainOptions rest;
  rest.resume = (d / "split" / "checkpoint").string();
  rest.out = (d / "split").string();
  rest.steps = 60;
  rest.progress = false;
  rest.device = "cuda";
  rest.precision = "bf16";
  rest.master_weights = false;
  const TrainResult resumed = train(rest);
  EXPECT_FALSE(resumed.model->params().has_master());
  EXPECT_EQ(resumed.model->params().read_f32(*resumed.context), off.model->params().read_f32(*off.context));
  fs::remove_all(d);
}

// f16 without master weights, with loss scaling: the update in registers unscales and rounds to f16.
TEST(CudaMasterWeights, OffWithF16AndLossScaling) {
  if (!probe_gpu().available) GTEST_SKIP() << "no GPU visible";
  const fs::path d = temp_dir("cuda_masterless_f16");
  prepare_text(bundled_corpus(), (d / "data").string());
  TrainOptions o = bf16_run(d, "f16", false, 30);
  o.precision = "f16";
  const TrainResult r = train(o);
  EXPECT_FALSE(r.model->params().has_master());
  EXPECT_EQ(r.model->params().dtype(), DType::F16);
  const auto l = losses(o.out);
  ASSERT_EQ(l.size(), 30u);
  EXPECT_LT(tail_mean(l), l.front() - 1.0) << "the run must learn";
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera::test
