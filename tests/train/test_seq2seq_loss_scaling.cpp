// The encoder-decoder's run with dynamic loss scaling (what --precision f16 turns on), on the CPU in f32: the scaler
// is GPT's (StepLossScaling), and its logic is the same in every dtype. A power-of-2 scale that does not overflow
// is exact in f32 (every op of the backward is linear in the loss gradient's scale, and the optimizer divides it out),
// so the losses equal an unscaled run's bit for bit. (f32 cannot overflow at the scales the scaler allows, 2^24 at
// most: the skipped steps of an overflow are GPT's test's, tests/train/test_loss_scaling.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/core/file_io.h"
#include "tessera/train/pair_data.h"
#include "tessera/train/seq2seq_checkpoint.h"
#include "tessera/train/seq2seq_train.h"
#include "tessera/train/synthetic_task.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<json> records(const fs::path& run) {
  std::istringstream in(read_file_text((run / "metrics.jsonl").string()));
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

class Seq2SeqLossScaling : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = test::temp_dir("s2s_scaling");
    PairLines lines;
    for (auto& [src, tgt] : make_synthetic_pairs({.task = SyntheticTask::Reverse, .pairs = 200, .seed = 3})) {
      lines.source.push_back(std::move(src));
      lines.target.push_back(std::move(tgt));
    }
    lines.source_name = lines.target_name = "reverse";
    const LineEncoder bytes = [](std::string_view line, std::vector<int32_t>& out) {
      for (unsigned char c : line) out.push_back(c);
    };
    prepare_pair_shards(lines, bytes, (d_ / "data").string(), {.val_fraction = 0.1, .max_positions = 32});
  }
  void TearDown() override { fs::remove_all(d_); }

  Seq2SeqTrainResult train(const std::string& out, bool scaling, double init_scale, int interval = 2000,
                           int stop_after = 0) {
    Seq2SeqTrainOptions s;
    s.model = encdec_preset("tiny");
    s.model.vocab = 256;
    s.max_tokens = 128;
    s.o.data = (d_ / "data").string();
    s.o.out = (d_ / out).string();
    s.o.steps = 6;
    s.o.warmup = 2;
    s.o.lr = 1e-2f;
    s.o.val_every = 3;
    s.o.label_smoothing = 0.1f;
    s.o.device = "cpu";
    s.o.progress = false;
    s.o.loss_scaling = scaling;
    s.o.loss_scale_init = init_scale;
    s.o.loss_scale_interval = interval;
    s.o.stop_after = stop_after;
    return train_seq2seq(s);
  }
  fs::path d_;
};

TEST_F(Seq2SeqLossScaling, AnExactScaleGivesTheUnscaledLossesAndIsCheckpointed) {
  train("plain", false, 65536.0);
  train("scaled", true, 65536.0);
  const std::vector<json> plain = records(d_ / "plain"), scaled = records(d_ / "scaled");
  ASSERT_EQ(plain.size(), 6u);
  ASSERT_TRUE(scaled[0].contains("loss_scale")) << scaled[0].dump();
  ASSERT_EQ(scaled.size(), 6u);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].at("loss").dump(), scaled[i].at("loss").dump()) << "step " << i + 1;
    EXPECT_FALSE(plain[i].contains("loss_scale"));
    EXPECT_EQ(scaled[i].at("loss_scale").get<double>(), 65536.0);
    EXPECT_FALSE(scaled[i].at("skipped").get<bool>());
  }
  Context ctx(Device::cpu());
  const std::string ck = (d_ / "scaled" / "checkpoint").string();
  EXPECT_EQ(load_seq2seq_train_state(ck, *load_seq2seq_checkpoint(ck, ctx)).loss_scale, 65536.0);
}

TEST_F(Seq2SeqLossScaling, TheScaleGrowsAndAResumeContinuesIt) {
  // Every 2 good steps the scale doubles; a run stopped after step 3 and resumed takes the checkpoint's scale and
  // count of good steps, so its records (scale and losses) are the uninterrupted run's.
  train("whole", true, 65536.0, 2);
  train("split", true, 65536.0, 2, /*stop_after=*/3);
  ASSERT_EQ(records(d_ / "split").size(), 3u);
  Seq2SeqTrainOptions s = seq2seq_options_from_checkpoint((d_ / "split" / "checkpoint").string());
  s.o.resume = (d_ / "split" / "checkpoint").string();
  s.o.out = (d_ / "split").string();
  s.o.device = "cpu";
  s.o.progress = false;
  s.o.loss_scaling = true;
  s.o.loss_scale_interval = 2;
  train_seq2seq(s);
  const std::vector<json> whole = records(d_ / "whole"), split = records(d_ / "split");
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(split.size(), 6u);
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].at("loss_scale").get<double>(), std::ldexp(65536.0, static_cast<int>(i / 2))) << i + 1;
    EXPECT_EQ(split[i].at("loss_scale").dump(), whole[i].at("loss_scale").dump()) << "step " << i + 1;
    EXPECT_EQ(split[i].at("loss").dump(), whole[i].at("loss").dump()) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace tessera
