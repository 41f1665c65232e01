// `tessera train --trace FILE.json`: one training step as a Chrome trace, and its flags checked before a run starts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "tessera/core/file_io.h"
#include "tessera/models/gpt_plan.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

class TrainTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tessera_trace_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string train(const std::string& extra) const {
    return "train --out " + (dir / "run").string() +
           " --batch 2 --seq 16 --d-model 32 --n-layers 2 --n-heads 2 "
           "--val-every 0 --no-progress --sample-tokens 0 --device cpu " +
           extra;
  }
  fs::path dir;
};

// The trace holds the chosen step's phases once each (FWD_STEP before BWD_STEP before OPTIM_STEP), one range per
// layer in each phase, op ranges inside them, and the planned-memory counter; it is valid JSON (atomic write).
TEST_F(TrainTrace, RecordsTheChosenStep) {
  const fs::path trace = dir / "t.json";
  const test::CliRun r = test::run(train("--steps 3 --trace " + trace.string() + " --trace-step 3"));
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(trace));
  // The summary names it (it was written without a word).
  EXPECT_NE(r.out.find("\ntrace:      " + trace.string() + " (step 3)\n"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(read_file_text(trace.string()));
  const auto& events = j.contains("traceEvents") ? j.at("traceEvents") : j;
  std::map<std::string, int> count;
  std::map<std::string, double> start;
  int counters = 0;
  for (const auto& e : events) {
    const std::string ph = e.value("ph", "");
    const std::string name = e.value("name", "");
    if (ph == "X") {
      ++count[name];
      if (!start.count(name)) start[name] = e.at("ts").get<double>();
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << name;
    }
    if (ph == "C") ++counters;
  }
  for (const char* phase : {"FWD_STEP", "BWD_STEP", "OPTIM_STEP"}) EXPECT_EQ(count[phase], 1) << phase;
  EXPECT_LT(start["FWD_STEP"], start["BWD_STEP"]);
  EXPECT_LT(start["BWD_STEP"], start["OPTIM_STEP"]);
  int layer_ranges = 0;
  for (const auto& [name, n] : count)
    if (name.rfind("layer", 0) == 0) layer_ranges += n;
  EXPECT_EQ(layer_ranges, 2 * 2) << "one range per layer in the forward and in the backward";
  EXPECT_GT(count.size(), 8u) << "op ranges inside the layers";
  EXPECT_GT(counters, 0) << "the planned-memory counter";
}

// --memory-timeline: the PNG and, beside it, one CSV line per op of the step (the activation plan's events), each
// the static buffers plus the plan's live activations at that op; the arena bounds every line.
TEST_F(TrainTrace, MemoryTimelineOfTheChosenStep) {
  const fs::path png = dir / "m.png", csv = dir / "m.csv";
  const test::CliRun r = test::run(train("--steps 2 --memory-timeline " + png.string() + " --trace-step 2"));
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(png));
  EXPECT_NE(r.out.find("\ntrace:      " + png.string() + ", " + csv.string() + " (step 2)\n"), std::string::npos)
      << r.out;
  const std::string image = read_file_text(png.string());
  ASSERT_GT(image.size(), 8u);
  EXPECT_EQ(image.substr(1, 3), "PNG");
  std::istringstream lines(read_file_text(csv.string()));
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line.rfind("event,phase,op,activations_live_bytes,static_bytes,planned_total_bytes,allocated_bytes", 0), 0u)
      << line;
  int n = 0;
  long long static0 = -1, max_live = 0, arena = 0;
  std::map<std::string, int> phases;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    ASSERT_GE(f.size(), 7u) << line;
    EXPECT_EQ(std::stoi(f[0]), n) << line;
    ++phases[f[1]];
    const long long live = std::stoll(f[3]), st = std::stoll(f[4]), planned = std::stoll(f[5]);
    arena = std::stoll(f[6]) - st;
    if (static0 < 0) static0 = st;
    EXPECT_EQ(st, static0) << line;
    EXPECT_EQ(planned, st + live) << line;
    EXPECT_LE(live, arena) << line;
    max_live = std::max(max_live, live);
    ++n;
  }
  EXPECT_EQ(n, step_event(/*n_layers=*/2, StepOp::End) + 1) << "one line per op of the step";
  EXPECT_GT(static0, 0);
  EXPECT_GT(max_live, 0);
  // The plan's peak is the largest live set, or near it: the gradients are planned in the arena as fixed buffers,
  // around which first fit does not always reach the bound (here 2.6% above it).
  EXPECT_GE(arena, max_live);
  EXPECT_LE(arena, max_live + max_live / 20) << "the plan's peak is far above the largest live set";
  EXPECT_GT(phases["forward"], 0);
  EXPECT_GT(phases["backward"], 0);
  EXPECT_EQ(phases["optimizer"], 1);
}

// A step the run does not take, a trace step without a trace, and a missing directory are one-line errors, and
// nothing is written.
TEST_F(TrainTrace, BadFlagsAreOneLineAndWriteNothing) {
  const auto expect_error = [&](const std::string& args, const std::string& what) {
    const test::CliRun r = test::run(train(args));
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(dir / "run")) << args;
  };
  expect_error("--steps 2 --trace " + (dir / "t.json").string() + " --trace-step 5", "--trace-step 5");
  expect_error("--steps 2 --trace-step 1", "--trace-step needs --trace");
  expect_error("--steps 2 --trace " + (dir / "no" / "t.json").string(), "does not exist");
  expect_error("--steps 2 --memory-timeline " + (dir / "m.jpg").string(), "must end in .png");
  expect_error("--steps 2 --memory-timeline " + (dir / "no" / "m.png").string(), "does not exist");
  expect_error("--steps 2 --memory-timeline " + (dir / "m.png").string() + " --trace-step 3", "--trace-step 3");
  // The CSV beside the plot is checked before the training too: a directory in its place failed after it.
  fs::create_directory(dir / "m.csv");
  expect_error("--steps 2 --memory-timeline " + (dir / "m.png").string(), "m.csv is a directory");
  fs::remove(dir / "m.csv");
  EXPECT_FALSE(fs::exists(dir / "t.json"));
  EXPECT_FALSE(fs::exists(dir / "m.png"));
}

// Without --trace-step the trace is of the run's second step, or its only one: the default was step 2 whatever
// the run, so a resumed run (checkpoint at step 2, steps 3 to 4) was refused with "--trace-step 2 is not a step
// this run takes", a flag never given, and a one-step run likewise. A run that stopped before the step it traced
// (--stop-after) wrote no trace, without a word; it traces its last step by default now, and an explicit
// --trace-step past it is refused.
TEST_F(TrainTrace, TheDefaultStepIsOneTheRunTakes) {
  const fs::path trace = dir / "t.json";
  // The step the trace holds (its otherData.step), read back: a trace that only exists could be of any step.
  const auto traced_step = [&] {
    const nlohmann::json doc = nlohmann::json::parse(read_file_text(trace.string()));
    return doc.at("otherData").at("step").get<int64_t>();
  };
  test::CliRun r = test::run(train("--steps 4 --stop-after 2"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = test::run("train --resume " + (dir / "run" / "checkpoint").string() +
                " --no-progress --sample-tokens 0 "
                "--trace " +
                trace.string());
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(trace));
  EXPECT_EQ(traced_step(), 4) << "a resume at step 2: its second step";
  fs::remove_all(dir / "run");
  fs::remove(trace);
  // A new run: its second step, or its last where it ends sooner (--stop-after 1: a trace step after it was never
  // reached, and no trace written).
  for (const auto& [flags, step] :
       {std::pair<std::string, int64_t>{"--steps 4", 2}, {"--steps 1", 1}, {"--steps 4 --stop-after 1", 1}}) {
    SCOPED_TRACE(flags);
    r = test::run(train(flags + " --trace " + trace.string()));
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_TRUE(fs::exists(trace));
    EXPECT_EQ(traced_step(), step);
    fs::remove_all(dir / "run");
    fs::remove(trace);
  }
  r = test::run(train("--steps 4 --stop-after 2 --memory-timeline " + (dir / "m.png").string() + " --trace-step 3"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "tessera: error: --trace-step 3 is not a step this run takes (1 to 2)\n");
  r = test::run(train("--steps 4 --trace " + trace.string() + " --trace-step 0"));
  EXPECT_EQ(r.err, "tessera: error: --trace-step must be >= 1, got 0\n");
  EXPECT_FALSE(fs::exists(dir / "run"));
}

// An output path that is a file the run writes or reads, or another output's: a --trace of the run's metrics.jsonl
// replaced the metrics, one of a data shard replaced the shard, one of the timeline's CSV lost the trace; each run
// "succeeded". Each is now refused before the run starts, and leaves the data as it was.
TEST_F(TrainTrace, OutputsThatAreTheRunsOwnFilesAreRefused) {
  const fs::path run = dir / "run", data = dir / "data", corpus = data / "corpus.txt";
  fs::create_directories(data);
  write_file_atomic(corpus.string(), std::string(4000, 'a') + "the end\n");
  const std::string with_data = "--steps 2 --data " + corpus.string() + " ";
  const auto expect_refused = [&](const std::string& args, const std::string& what) {
    const test::CliRun r = test::run(train(with_data + args));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(run)) << args;
  };
  expect_refused("--trace " + (run / "metrics.jsonl").string(), "metrics.jsonl is also the run's metrics");
  expect_refused("--trace " + (dir / "." / "run" / "checkpoint" / "t.json").string(),
                 "is inside the run's checkpoint directory");
  expect_refused("--trace " + corpus.string(), "corpus.txt is also the --data text, which the run reads");
  expect_refused("--trace " + (dir / "m.csv").string() + " --memory-timeline " + (dir / "m.png").string(),
                 "--memory-timeline's CSV " + (dir / "m.csv").string() + " is also --trace's file");
  EXPECT_EQ(read_file_text(corpus.string()), std::string(4000, 'a') + "the end\n");
  // A path of its own is taken.
  const test::CliRun ok = test::run(train(with_data + "--trace " + (dir / "t.json").string()));
  EXPECT_EQ(ok.code, 0) << ok.err;
}

}  // namespace
}  // namespace tessera
