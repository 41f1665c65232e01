// Output that cannot be written is an error: `tessera info > /dev/full` exited 0 with the output lost.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli/cli_run.h"
#include "tessera/core/file_io.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::CliRun;
using test::run;

class CliStdout : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = test::temp_dir("cli_stdout");
    std::string text;
    for (int i = 0; i < 40; ++i) text += "It is easy to despise what you cannot get. ";
    write_file_atomic((dir / "t.txt").string(), text);
    Gpt m(test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/32,
                             /*max_seq=*/16));
    m.init_weights(1);
    save_checkpoint((dir / "ck").string(), m, nullptr);
  }
  void TearDown() override { fs::remove_all(dir); }

  // One command of each kind that prints, and succeeds when its output can be written.
  std::vector<std::string> printing_commands() const {
    // train --help is longer than stdio's buffer: it fails at a flush before main's check, which then had no reason.
    return {"--help",
            "--version",
            "bench --help",
            "train --help",
            "info",
            "info --plan",
            "prepare --text t.txt --out d",
            "generate --checkpoint ck --tokens 3 --greedy"};
  }
};

// What the line adds where the output was lost only once the command had finished (checked as it exits): prepare
// had replaced the shards, and its exit 2 read as nothing written. A long help or generate's text fails mid-way.
std::string after(const std::string& args) {
  return args == "train --help" || args.rfind("generate", 0) == 0
             ? "\n"
             : " (the command had finished: only what it printed was lost)\n";
}

TEST_F(CliStdout, OutputToAFullDiskIsAnError) {
  for (const std::string& args : printing_commands()) {
    ASSERT_EQ(run(args, dir).code, 0) << args;
    const CliRun r = run(args + " > /dev/full", dir);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err, "tessera: error: cannot write standard output: No space left on device" + after(args)) << args;
  }
}

// train's first write to reach a full disk is its sample's, after the run is saved: said as such.
TEST_F(CliStdout, TrainWhoseOutputIsLostSaysItFinished) {
  const CliRun r =
      run("train --device cpu --no-progress --out o --batch 2 --seq 16 --d-model 32 --n-layers 1 "
          "--steps 2 > /dev/full",
          dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "tessera: error: cannot write standard output: No space left on device (the command had finished: "
            "only what it printed was lost)\n");
  EXPECT_TRUE(fs::exists(dir / "o" / "checkpoint" / "model.safetensors"));
}

// A closed stdout fails the same way.
TEST_F(CliStdout, ClosedStdoutIsAnError) {
  for (const std::string& args : printing_commands()) {
    const CliRun r = run(args + " >&-", dir);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err, "tessera: error: cannot write standard output: Bad file descriptor" + after(args)) << args;
  }
}

// A standard stream closed at the start lends its number to no file: train with stderr closed wrote its progress
// lines (a line every 2 steps of 40) into metrics.jsonl, which took number 2.
TEST_F(CliStdout, AClosedStreamWritesIntoNoFile) {
  const std::string cmd = "cd '" + dir.string() + "' && " + test::binary() + " train --out o --batch 2 --seq 16 " +
                          "--d-model 32 --n-layers 1 --val-every 0 --sample-tokens 0 --device cpu --steps 40 " +
                          ">/dev/null 2>&- </dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string metrics = read_file_text((dir / "o" / "metrics.jsonl").string());
  EXPECT_EQ(metrics.find("step 2/40"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.rfind("{\"step\":1,", 0), 0u) << metrics;
}

// A separate value that is one of the command's flags is refused (--tokens took --greedy as its value), but one
// given with "=" is a value: a prompt may be "--greedy".
TEST_F(CliStdout, AFlagAsAValueIsRefusedUnlessGivenWithEquals) {
  const CliRun r = run("generate --checkpoint ck --greedy --prompt --tokens", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "tessera: error: generate: --prompt needs a value (TEXT); it took the flag --tokens as one\n");
  const CliRun ok = run("generate --checkpoint ck --tokens 3 --greedy --prompt=--tokens", dir);
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.out.rfind("--tokens", 0), 0u) << ok.out;  // the prompt, echoed first
}

// A command that failed says so in its own line, without a second one about the output.
TEST_F(CliStdout, AFailedCommandSaysOnlyItsOwnError) {
  const CliRun r = run("info --bogus 1 > /dev/full", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "tessera: error: info: unknown flag --bogus (see tessera info --help)\n");
}

}  // namespace
}  // namespace tessera
