// `tessera train` refuses flags that would fail, or train a degenerate model, only after it started writing: each
// is one line and exit code 2 before anything is written (found by a new user's trial of the CLI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "tessera/train/data.h"
#include "test_util.h"

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
  expect_refused(test::run(train_args(out, "--memory-timeline " + dir.string())), "is a directory, not a file to write",
                 out);
  expect_refused(test::run(train_args(out, "--emb-scale nan")), "--emb-scale must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--emb-scale inf")), "--emb-scale must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--norm-eps inf")), "--norm-eps must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta 0")),
                 "--rope-theta must be positive and finite", out);
  // Other positions ignore it: given there, it is refused rather than taken without effect.
  expect_refused(test::run(train_args(out, "--rope-theta 0")),
                 "--rope-theta applies to rotary positions (--positions rope); this model's positions are learned",
                 out);
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta nan")),
                 "--rope-theta must be positive and finite", out);
  expect_refused(test::run(train_args(out, "--n-layers 100000")), "--n-layers 100000 is more than 512", out);
  expect_refused(test::run(train_args(out, "--d-model 2000000000 --n-heads 1")), "--d-model 2000000000 is more than",
                 out);
  expect_refused(test::run(train_args(out, "--stop-after 9")), "--stop-after 9 is not a step this run takes (1 to 4)",
                 out);
  // As typed: 0.99999999 is 1 as a float ("got 1" read as a misreading); "cuda:" alone was taken as cuda:0.
  expect_refused(test::run(train_args(out, "--label-smoothing 0.99999999")),
                 "--label-smoothing must be in [0, 1), got 0.99999999 (1 as a float)", out);
  expect_refused(test::run(train_args(out, "--label-smoothing 1")), "--label-smoothing must be in [0, 1), got 1\n",
                 out);
  expect_refused(test::run(train_args(out, "--device cuda:")), "--device: 'cuda:' is not cuda:N", out);
  expect_refused(test::run(train_args(out, "--device cuda:+1")), "--device: 'cuda:+1' is not cuda:N", out);
  // A flag without its value took the next flag as it: --out --force trained into a directory named "--force".
  expect_refused(test::run(train_args(out, "--data --force")),
                 "--data needs a value (DIR|FILE); it took the flag "
                 "--force as one",
                 out);
  expect_refused(test::run(train_args(out, "--prompt --steps")), "--prompt needs a value", out);
  // An integer too large for its flag says so, not that it is no integer.
  expect_refused(test::run(train_args(out, "--steps 99999999999999999999")),
                 "--steps 99999999999999999999 is out of range (at most 2147483647)", out);
  expect_refused(test::run(train_args(out, "--steps 2147483648")),
                 "--steps 2147483648 is out of range (at most "
                 "2147483647)",
                 out);  // past int, within long: not strtol's ERANGE
  expect_refused(test::run(train_args(out, "--warmup -2147483649")),
                 "--warmup -2147483649 is out of range (at least "
                 "-2147483648)",
                 out);
  expect_refused(test::run(train_args(out, "--warmup -99999999999999999999")),
                 "--warmup -99999999999999999999 is "
                 "out of range (at least -2147483648)",
                 out);
  expect_refused(test::run(train_args(out, "--seed 99999999999999999999999")),
                 "--seed 99999999999999999999999 is out of range (at most 18446744073709551615)", out);
  expect_refused(test::run(train_args(out, "--steps 1e3")), "--steps expects an integer, got '1e3'", out);
  // A decimal too large for its float says so with the text given: it said "rope_theta must be positive and
  // finite, got inf" and "--lr must be a positive number, got inf" (float's inf), or that 1e999 was no number.
  const std::string floats = " is out of range (-3.40282e+38 to 3.40282e+38)";
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta 1e300")), "--rope-theta 1e300" + floats, out);
  expect_refused(test::run(train_args(out, "--emb-scale -1e39")), "--emb-scale -1e39" + floats, out);
  expect_refused(test::run(train_args(out, "--lr 1e300")), "train: --lr 1e300" + floats, out);
  expect_refused(test::run(train_args(out, "--grad-clip 1e39")), "train: --grad-clip 1e39" + floats, out);
  expect_refused(test::run(train_args(out, "--lr 1e999")), "train: --lr 1e999" + floats, out);
  expect_refused(test::run(train_args(out, "--ckpt-minutes 1e999")),
                 "train: --ckpt-minutes 1e999 is out of range (-1.79769e+308 to 1.79769e+308)", out);
  // Too close to zero for a float: it was 0, and the error said "got 0" (or a temperature of 1e-50 sampled greedily).
  const std::string tiny = " is too close to zero (the smallest magnitude it takes is 1.17549e-38)";
  expect_refused(test::run(train_args(out, "--lr 1e-50")), "train: --lr 1e-50" + tiny, out);
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta 1e-45")), "--rope-theta 1e-45" + tiny, out);
  // The model's float fields read decimals only, as the train flags do: strtof took a hex float. (Each is named as
  // the flag given: "config: rope_theta ..." read as if a config file were wrong.)
  expect_refused(test::run(train_args(out, "--positions rope --rope-theta 0x10")),
                 "--rope-theta expects a decimal number, got '0x10'", out);
  // The same flags, well formed, train (so the checks above are not refusing every run).
  const test::CliRun ok = test::run(train_args(out, "--positions rope --rope-theta 500 --emb-scale 2 --stop-after 2"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.out.find("validation: none"), std::string::npos) << "the bundled corpus has a val split: " << ok.out;
  // An empty --out is an error of the flag, not an internal one.
  const test::CliRun empty_out = test::run("train --out '' --device cpu --steps 1 --no-progress");
  EXPECT_EQ(empty_out.code, 2) << empty_out.err;
  EXPECT_NE(empty_out.err.find("--out is empty"), std::string::npos) << empty_out.err;
  // Resumed at step 2: --stop-after at or before it is no step of the resumed run.
  const std::string ck = (out / "checkpoint").string();
  const test::CliRun resumed = test::run("train --resume " + ck + " --stop-after 2 --no-progress --sample-tokens 0");
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_NE(resumed.err.find("--stop-after 2 is not a step this run takes (3 to 4)"), std::string::npos) << resumed.err;
  fs::remove_all(dir);
}

// A second Ctrl-C while a run wrote its first checkpoint leaves RUN/checkpoint.tmp and no RUN/checkpoint (found
// by a new user's trial: "--resume: RUN/checkpoint is not a checkpoint directory", and a train into RUN offered
// only --force). Both now say what happened and offer the run's best/, a whole checkpoint, when it has one.
TEST(TrainBadFlags, AFirstCheckpointCutShortPointsToBest) {
  const fs::path dir = fresh_dir("tessera_cut_first_ckpt");
  const fs::path run = dir / "run";
  ASSERT_EQ(test::run(train_args(run, "")).code, 0);       // 4 steps, validated at 2 and 4: best/ is a whole checkpoint
  fs::rename(run / "checkpoint", run / "checkpoint.tmp");  // as a second Ctrl-C during the first save leaves it
  fs::rename(run / "best", dir / "best.aside");
  const std::string ck = (run / "checkpoint").string(), best = (run / "best").string();
  const test::CliRun no_best = test::run("train --resume " + ck + " --no-progress");
  EXPECT_EQ(no_best.code, 2) << no_best.err;
  EXPECT_NE(no_best.err.find("--resume: " + ck + " does not exist: the run was stopped while writing it (" + ck +
                             ".tmp is incomplete)\n"),
            std::string::npos)
      << no_best.err;
  fs::rename(dir / "best.aside", run / "best");
  const test::CliRun resumed = test::run("train --resume " + ck + " --no-progress");
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_NE(resumed.err.find("is incomplete); its best checkpoint can be continued as a new run: --resume " + best +
                             " --out NEW\n"),
            std::string::npos)
      << resumed.err;
  const test::CliRun into = test::run(train_args(run, ""));
  EXPECT_EQ(into.code, 2) << into.err;
  EXPECT_NE(into.err.find("no checkpoint to resume, only its best/: continue that as a new run with --resume " + best +
                          " --out NEW, replace it with --force"),
            std::string::npos)
      << into.err;
  // The advice works.
  const test::CliRun advised = test::run("train --resume " + best + " --out " + (dir / "new").string() +
                                         " --steps 6 --no-progress --sample-tokens 0");
  EXPECT_EQ(advised.code, 0) << advised.err;
  EXPECT_TRUE(fs::is_directory(dir / "new" / "checkpoint"));
  fs::remove_all(dir);
}

// A run branched with --resume A/checkpoint --out B reads A/data, which does not move with B; --data cannot be
// given beside --resume. With A moved, B's resume said only "data: A/data does not exist".
TEST(TrainBadFlags, ABranchWhoseDataMovedSaysWhereItLooks) {
  const fs::path dir = fresh_dir("tessera_branch_data");
  const fs::path a = dir / "a", b = dir / "b";
  const test::CliRun first = test::run(train_args(a, "--steps 2"));
  ASSERT_EQ(first.code, 0) << first.err;
  const test::CliRun branch = test::run("train --resume " + (a / "checkpoint").string() + " --out " + b.string() +
                                        " --steps 3 --no-progress --sample-tokens 0");
  ASSERT_EQ(branch.code, 0) << branch.err;
  fs::rename(a, dir / "a_moved");
  const test::CliRun r =
      test::run("train --resume " + (b / "checkpoint").string() + " --steps 4 --no-progress --sample-tokens 0");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--resume: the run's data, " + (a / "data").string() + ", does not exist"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("put it back there, or link it there"), std::string::npos) << r.err;
  // Linked there, but to a place that is gone: the link is named.
  fs::create_symlink(dir / "a_gone", a);
  const test::CliRun linked =
      test::run("train --resume " + (b / "checkpoint").string() + " --steps 4 --no-progress --sample-tokens 0");
  EXPECT_EQ(linked.code, 2) << linked.err;
  EXPECT_NE(linked.err.find("does not exist (" + a.string() + " is a symbolic link to " + (dir / "a_gone").string() +
                            ", which does not resolve)"),
            std::string::npos)
      << linked.err;
  // A run's own data/ removed is not said to lie outside the run.
  fs::remove_all(dir / "a_moved" / "data");
  const test::CliRun own = test::run("train --resume " + (dir / "a_moved" / "checkpoint").string() +
                                     " --steps 3 --no-progress --sample-tokens 0");
  EXPECT_EQ(own.code, 2) << own.err;
  EXPECT_NE(own.err.find("does not exist: it lay in the run's directory and was moved or removed; put it back there"),
            std::string::npos)
      << own.err;
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

// train_000000.bin and val_000000.bin in `dir`, 2000 tokens each, cycling through the ids [0, top].
fs::path shards_up_to(const fs::path& dir, uint16_t top) {
  std::vector<uint16_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % (top + 1u));
  fs::create_directories(dir);
  write_shard((dir / "train_000000.bin").string(), tokens);
  write_shard((dir / "val_000000.bin").string(), tokens);
  return dir;
}

// `train --out /` trained into the root directory: its metrics.jsonl, checkpoint/, best/ and data/ among the
// system's. A directory that holds no run but other files is refused, --force or not (it replaces a run, and there
// is none); an empty one, one that holds only data/ prepared beforehand, and a run's own (with --force) still train.
TEST(TrainBadFlags, ADirectoryOfOtherFilesIsNoOutputDirectory) {
  const fs::path dir = fresh_dir("tessera_out_foreign");
  const fs::path mine = dir / "mine";
  fs::create_directories(mine / "src");
  std::ofstream(mine / "notes.txt") << "mine\n";
  const std::vector<std::string> before = test::names_in(mine);
  for (const std::string force : {"", "--force"}) {
    const test::CliRun r = test::run(train_args(mine, force));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("output directory " + mine.string() +
                         " holds no tessera run but other files (notes.txt, "
                         "src), which the run's metrics.jsonl, checkpoint/, best/ and data/ would be mixed into: give "
                         "--out a new or empty directory"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
    EXPECT_EQ(test::names_in(mine), before) << force;
  }
  // The root directory (as root it is writable, and a regression would write there: that case runs where it is not).
  for (const std::string root : {"/proc", "/"}) {
    if (root == "/" && ::access("/", W_OK) == 0) continue;
    const test::CliRun r = test::run(train_args(root, ""));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("output directory " + root + " holds no tessera run but other files ("), std::string::npos)
        << r.err;
  }
  std::ofstream(dir / "a_file") << "x\n";
  expect_refused(test::run(train_args(dir / "a_file", "")),
                 "output path " + (dir / "a_file").string() + " is not a directory", dir / "a_file" / "metrics.jsonl");
  // What may be there: nothing, or the shards of data/ prepared beforehand.
  fs::create_directories(dir / "empty");
  EXPECT_EQ(test::run(train_args(dir / "empty", "")).code, 0);
  const fs::path prepared = dir / "prepared";
  shards_up_to(prepared / "data", 255);
  const test::CliRun with_data = test::run(train_args(prepared, "--data " + (prepared / "data").string()));
  EXPECT_EQ(with_data.code, 0) << with_data.err;
  // A run's directory with a file of the user's beside the run: --force replaces the run, as before.
  std::ofstream(prepared / "notes.txt") << "mine\n";
  const test::CliRun forced = test::run(train_args(prepared, "--force --data " + (prepared / "data").string()));
  EXPECT_EQ(forced.code, 0) << forced.err;
  EXPECT_TRUE(fs::exists(prepared / "notes.txt"));
  fs::remove_all(dir);
}

// The sample after training is byte-level text. A model whose tokens are not bytes (a vocab below 256, or shards
// of another tokenizer) used to skip it without a word, or print its ids masked to bytes: asked for, it is refused
// before anything is written; by default a line says why there is none.
TEST(TrainBadFlags, SampleTokensNeedsAByteLevelModel) {
  const fs::path dir = fresh_dir("tessera_sample_vocab");
  const fs::path out = dir / "run";
  const std::string small =
      " --batch 2 --seq 16 --d-model 32 --n-layers 2 --n-heads 2 --val-every 0 --no-progress "
      "--device cpu --steps 2 --out " +
      out.string();
  const std::string vocab100 = "train --vocab 100 --data " + shards_up_to(dir / "d100", 99).string() + small;
  expect_refused(test::run(vocab100 + " --sample-tokens 20"),
                 "--sample-tokens 20: no sample can be drawn: the model's vocab of 100 tokens is not the byte "
                 "vocabulary (256), and the sample is byte-level text",
                 out);
  expect_refused(test::run(vocab100 + " --prompt Hi"), "--prompt: no sample can be drawn: the model's vocab of 100",
                 out);
  const std::string wide = "train --vocab 512 --data " + shards_up_to(dir / "d300", 300).string() + small;
  expect_refused(test::run(wide + " --sample-tokens 20"),
                 "--sample-tokens 20: no sample can be drawn: the training data holds token ids up to 300, not bytes",
                 out);
  expect_refused(test::run(vocab100 + " --sample-tokens 0 --prompt Hi"),
                 "--prompt is for the sample after training, which --sample-tokens 0 turns off", out);
  // By default: the run trains, and says why it prints no sample.
  const test::CliRun quiet = test::run(vocab100);
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_NE(quiet.out.find("\nno sample: the model's vocab of 100 tokens is not the byte vocabulary (256)"),
            std::string::npos)
      << quiet.out;
  EXPECT_EQ(quiet.out.find("sample (temperature"), std::string::npos) << quiet.out;
  // A resumed run takes the vocab from the checkpoint.
  const test::CliRun resumed =
      test::run("train --resume " + (out / "checkpoint").string() + " --steps 3 --no-progress --sample-tokens 5");
  EXPECT_EQ(resumed.code, 2) << resumed.out;
  EXPECT_NE(resumed.err.find("--sample-tokens 5: no sample can be drawn: the model's vocab of 100"), std::string::npos)
      << resumed.err;
  // Byte-level shards in a wider vocab still sample.
  fs::remove_all(out);
  const test::CliRun bytes =
      test::run("train --vocab 512 --data " + shards_up_to(dir / "d255", 255).string() + small + " --sample-tokens 5");
  ASSERT_EQ(bytes.code, 0) << bytes.err;
  EXPECT_NE(bytes.out.find("sample (temperature"), std::string::npos) << bytes.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
