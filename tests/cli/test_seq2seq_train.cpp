// tessera train on paired shards (an encoder-decoder preset) through the binary: the loss falls on make-task
// reverse; a run stopped after step 4 and resumed gives the uninterrupted run's losses bit for bit; a stop signal
// leaves a whole checkpoint that loads; each bad input is one line, exit code 2, and nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "tessera/core/file_io.h"
#include "tessera/train/seq2seq_checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::run;

// The losses of metrics.jsonl, in step order, as written (text: equal means bit for bit).
std::vector<std::string> losses(const fs::path& run_dir) {
  std::istringstream in(read_file_text((run_dir / "metrics.jsonl").string()));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line)["loss"].dump());
  return out;
}

void expect_error(const test::CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

class Seq2SeqTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = test::temp_dir("s2s_train");
    ASSERT_EQ(run("make-task --task reverse --pairs 400 --max-len 6 --out " + at("rev.tsv")).code, 0);
    ASSERT_EQ(run("prepare --pairs " + at("rev.tsv") + " --out " + at("data")).code, 0);
  }
  void TearDown() override { fs::remove_all(d_); }
  std::string at(const std::string& name) const { return (d_ / name).string(); }
  // A short run: small batches, so that a few steps see several of them; dropout on (the tiny preset has none), so
  // that a resumed run must also restore the dropout streams.
  std::string train(const std::string& out, const std::string& more = "") const {
    return "train --preset tiny --data " + at("data") + " --out " + at(out) +
           " --steps 8 --max-tokens 128 --warmup 2 --lr 1e-2 --val-every 4 --dropout 0.1 --attn-dropout 0.1 "
           "--no-progress " +
           more;
  }
  fs::path d_;
};

TEST_F(Seq2SeqTrain, LossFallsAndAResumedRunMatchesAnUninterruptedOne) {
  const test::CliRun whole = run(train("whole"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const std::vector<std::string> expected = losses(d_ / "whole");
  ASSERT_EQ(expected.size(), 8u);
  EXPECT_LT(std::stod(expected.back()), std::stod(expected.front()));
  EXPECT_TRUE(is_seq2seq_checkpoint(at("whole/checkpoint")));
  EXPECT_TRUE(fs::exists(d_ / "whole" / "best" / "model.safetensors"));

  const test::CliRun first = run(train("split", "--stop-after 4"));
  ASSERT_EQ(first.code, 128 + SIGTERM) << first.err;
  ASSERT_EQ(losses(d_ / "split").size(), 4u);
  const test::CliRun rest = run("train --resume " + at("split/checkpoint") + " --no-progress");
  ASSERT_EQ(rest.code, 0) << rest.err;
  EXPECT_EQ(losses(d_ / "split"), expected);
}

TEST_F(Seq2SeqTrain, AResumeCutsTheMetricsBackToItsCheckpoint) {
  // A record past the checkpoint's step (a run killed after writing step 5's record, before a checkpoint) is
  // dropped on resume, as GPT's runs drop it (RunDir): the resumed run's records are the uninterrupted run's.
  ASSERT_EQ(run(train("whole")).code, 0);
  ASSERT_EQ(run(train("split", "--stop-after 4")).code, 128 + SIGTERM);
  const std::string metrics = at("split/metrics.jsonl");
  write_file_atomic(metrics, read_file_text(metrics) + "{\"step\":5,\"loss\":9.5}\n");
  const test::CliRun rest = run("train --resume " + at("split/checkpoint") + " --no-progress");
  ASSERT_EQ(rest.code, 0) << rest.err;
  EXPECT_EQ(losses(d_ / "split"), losses(d_ / "whole"));
}

TEST_F(Seq2SeqTrain, AResumeRefusesTheFlagsItsCheckpointFixes) {
  // As GPT's: --data (the same data or another) and the settings the checkpoint records are refused, not ignored.
  ASSERT_EQ(run(train("r", "--stop-after 4")).code, 128 + SIGTERM);
  const std::string resume = "train --resume " + at("r/checkpoint") + " --no-progress ";
  expect_error(run(resume + "--data " + at("data")), "--data cannot be combined with --resume");
  expect_error(run(resume + "--lr 1e-3"), "--lr cannot be combined with --resume");
  expect_error(run(resume + "--max-tokens 64"), "--max-tokens cannot be combined with --resume");
  expect_error(run(resume + "--d-model 64"), "--d-model cannot be combined with --resume");
  EXPECT_EQ(losses(d_ / "r").size(), 4u);
  // The help names both defaults where an encoder-decoder run's differ from GPT's.
  const test::CliRun help = run("train --help");
  for (const char* s : {"(default 20; 100 for an encoder-decoder preset)", "(default 0.1; 0.01 for an encoder-decoder",
                        "(default 100; 250 for an encoder-decoder preset)"})
    EXPECT_NE(help.out.find(s), std::string::npos) << s << "\n" << help.out;
}

TEST_F(Seq2SeqTrain, AStopSignalLeavesAWholeCheckpoint) {
  const test::CliRun r = test::run_after("TESSERA_FAULT_INJECT=seq2seq-stop-step-2 ", train("stopped"));
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_NE(r.err.find("stopping after this step, with a checkpoint"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(at("stopped/checkpoint.tmp")));
  Context ctx(Device::cpu());
  auto m = load_seq2seq_checkpoint(at("stopped/checkpoint"), ctx);
  EXPECT_EQ(load_seq2seq_train_state(at("stopped/checkpoint"), *m).step, 2);
  EXPECT_EQ(losses(d_ / "stopped").size(), 2u);
}

TEST_F(Seq2SeqTrain, BadInputIsOneLineAndNothingIsWritten) {
  // GPT token shards given to an encoder-decoder preset, and paired shards to a GPT preset.
  ASSERT_EQ(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/README.md --out " + at("tokens")).code, 0);
  expect_error(run("train --preset transformer-base --data " + at("tokens") + " --out " + at("o1")),
               "GPT token shards");
  expect_error(run("train --preset gpt2-124m --data " + at("data") + " --out " + at("o2")), "holds paired shards");
  // A pair longer than the tiny preset's 32 positions.
  write_file_atomic(at("long.tsv"), "abc\tcba\n" + std::string(40, 'x') + "\tx\nab\tba\n");
  ASSERT_EQ(run("prepare --pairs " + at("long.tsv") + " --out " + at("long")).code, 0);
  expect_error(run("train --preset tiny --data " + at("long") + " --out " + at("o3")), "more than the model's 32");
  expect_error(run(train("o4", "--batch 4")), "--batch does not apply to an encoder-decoder preset");
  for (const char* o : {"o1", "o2", "o3", "o4"}) EXPECT_FALSE(fs::exists(at(o))) << o;
}

}  // namespace
}  // namespace tessera
