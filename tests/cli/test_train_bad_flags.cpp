// `tessera train` refuses flags that would fail, or train a degenerate model, only after it started writing: each
// is one line and exit code 2 before anything is written (found by a new user's trial of the CLI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_run.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

std::string train_args(const fs::path& out, const std::string& extra) { return test::small_train_args(out, extra); }

fs::path fresh_dir(const char* name) {
  const fs::path dir = fs::temp_directory_path() / (std::string(name) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void expect_refused(const test::CliRun& r, const std::string& message, const fs::path& out) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
  EXPECT_FALSE(fs::exists(out)) << "the refused run wrote " << out;
}

TEST(TrainBadFlags, AreRefusedBeforeAnythingIsWritten) {
  const fs::path dir = fresh_dir("tessera_bad_flags");
  const fs::path out = dir / "run";
  expect_refused(test::run(train_args(out, "--prompt ''")), "--prompt is empty", out);
  expect_refused(test::run(train_args(out, "--data ''")), "--data is empty", out);
  expect_refused(test::run(train_args(out, "--trace " + dir.string())), "is a directory, not a file to write", out);
  expect_refused(test::run(train_args(out, "--memory-timeline " + dir.string())),
                 "is a directory, not a file to write", out);
  expect_refused(test::run(train_args(out, "--emb-scale nan")), "emb_scale must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--emb-scale inf")), "emb_scale must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--norm-eps inf")), "norm_eps must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta 0")),
                 "rope_theta must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta nan")),
                 "rope_theta must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--n-layers 100000")), "n_layers 100000 is more than 512", out);
  expect_refused(test::run(train_args(out, "--d-model 2000000000 --n-heads 1")), "d_model 2000000000 is more than",
                 out);
  expect_refused(test::run(train_args(out, "--stop-after 9")), "--stop-after 9 is not a step this run takes (1 to 4)",
                 out);
  // The same flags, well formed, train (so the checks above are not refusing every run).
  const test::CliRun ok = test::run(train_args(out, "--positions rope --rope-theta 500 --emb-scale 2 --stop-after 2"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  // An empty --out is an error of the flag, not an internal one.
  const test::CliRun empty_out = test::run("train --out '' --device cpu --steps 1 --no-progress");
  EXPECT_EQ(empty_out.code, 2) << empty_out.err;
  EXPECT_NE(empty_out.err.find("--out is empty"), std::string::npos) << empty_out.err;
  // Resumed at step 2: --stop-after at or before it is no step of the resumed run.
  const std::string ck = (out / "checkpoint").string();
  const test::CliRun resumed = test::run("train --resume " + ck + " --stop-after 2 --no-progress --sample-tokens 0");
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_NE(resumed.err.find("--stop-after 2 is not a step this run takes (3 to 4)"), std::string::npos)
      << resumed.err;
  fs::remove_all(dir);
}

// A directory that holds a run's metrics but no checkpoint (a run that failed before its first one) is not
// offered to --resume: the advice is --force.
TEST(TrainBadFlags, ARunWithoutACheckpointIsNotOfferedToResume) {
  const fs::path dir = fresh_dir("tessera_no_ckpt_advice");
  fs::create_directories(dir / "run");
  std::ofstream(dir / "run" / "metrics.jsonl") << "{}\n";
  const test::CliRun r = test::run(train_args(dir / "run", ""));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("no checkpoint to resume: replace it with --force"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--resume"), std::string::npos) << r.err;
  fs::create_directories(dir / "run" / "checkpoint");
  const test::CliRun with = test::run(train_args(dir / "run", ""));
  EXPECT_NE(with.err.find("continue it with --resume"), std::string::npos) << with.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
