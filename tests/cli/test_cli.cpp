// The tessera binary end to end: each bad input is one line on stderr, exit code 2, and no partial file.
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/cli_run.h"
#include "tessera/core/context.h"
#include "tessera/core/file_io.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::binary;
using test::CliRun;
using test::run;

// A `tessera` started in the background, its stdout and stderr in files.
struct Child {
  pid_t pid = -1;
  fs::path out, err;
};

Child spawn(const std::string& args, const fs::path& logs) {
  std::vector<std::string> words{binary()};
  for (size_t i = 0, j; i < args.size(); i = j + 1) {
    j = std::min(args.find(' ', i), args.size());
    if (j > i) words.push_back(args.substr(i, j - i));
  }
  Child c{.pid = -1, .out = logs / "child.out", .err = logs / "child.err"};
  c.pid = ::fork();
  if (c.pid == 0) {
    const int o = ::open(c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(c.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    ::dup2(o, 1), ::dup2(e, 2), ::dup2(in, 0);
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return c;
}

// The exit code, or 128 + the signal that killed it.
int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int count_lines(const fs::path& p) {
  std::ifstream in(p);
  int n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

// Waits until `metrics` holds `lines` records while `pid` runs; false if it exits first or a minute passes.
bool wait_for_steps(const fs::path& metrics, int lines, pid_t pid) {
  for (int i = 0; i < 6000; ++i) {
    if (count_lines(metrics) >= lines) return true;
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  return false;
}

int64_t checkpoint_step(const fs::path& ck) {
  auto m = load_checkpoint_model(ck.string());
  return load_train_state(ck.string(), *m).step;
}

class Cli : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tessera_cli_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  // A data dir whose train shard is `shard` (from write_shards.py) and whose val shard is good.
  std::string data_with(const std::string& shard) {
    const fs::path shards = dir / "shards";
    const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR +
                            "/tests/tools/write_shards.py --out " + shards.string() + " --count 3000";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    const fs::path d = dir / ("data_" + shard);
    fs::create_directories(d);
    fs::copy_file(shards / shard, d / "train_000000.bin");
    fs::copy_file(shards / "good_train_000000.bin", d / "val_000000.bin");
    return d.string();
  }

  // Exit 2, one line on stderr (no blank line before it) that says `tessera: error:` once and names `what`,
  // and the output directory, when given, not created at all.
  void expect_error(const CliRun& r, const std::string& what, const fs::path& out = {}) {
    EXPECT_EQ(r.code, 2) << r.err;
    const std::string& e = r.err;
    EXPECT_EQ(e.rfind("tessera: error: ", 0), 0u) << r.err;
    EXPECT_EQ(e.find("tessera: error:", 1), std::string::npos) << "said twice: " << r.err;
    EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_NE(e.find(what), std::string::npos) << "expected '" << what << "' in: " << r.err;
    if (!out.empty()) {
      EXPECT_FALSE(fs::exists(out)) << "left behind: " << out;
    }
  }
  // A small model on the bundled corpus: quick steps, on the CPU even where a GPU is visible (the signal tests
  // time their signals against CPU steps).
  std::string small_train(const fs::path& out) {
    return "train --out " + out.string() +
           " --batch 2 --seq 16 --d-model 32 --n-layers 1 --val-every 0 --no-progress "
           "--sample-tokens 0 --device cpu";
  }
  // SIGINT or SIGTERM mid-run: the step finishes, a checkpoint is written, the exit code is 128 + the
  // signal, and the printed --resume command continues the run.
  void interrupt_and_resume(int sig) {
    const fs::path out = dir / "o";
    Child c = spawn(small_train(out) + " --steps 1000000 --ckpt-every 0", dir);
    ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 3, c.pid)) << read_file_text(c.err.string());
    ASSERT_EQ(::kill(c.pid, sig), 0);
    EXPECT_EQ(wait_exit(c.pid), 128 + sig);
    const std::string err = read_file_text(c.err.string());
    const std::string cmd = "train --resume " + (out / "checkpoint").string();
    EXPECT_NE(err.find(cmd), std::string::npos) << err;
    ASSERT_TRUE(fs::exists(out / "checkpoint")) << err;
    const int64_t step = checkpoint_step(out / "checkpoint");
    EXPECT_GE(step, 3);
    EXPECT_EQ(count_lines(out / "metrics.jsonl"), step);
    const CliRun r = run(cmd + " --steps " + std::to_string(step + 2) + " --no-progress --sample-tokens 0");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
    EXPECT_EQ(count_lines(out / "metrics.jsonl"), step + 2);
  }

  std::string train_args(const std::string& data, const fs::path& out) {
    return "train --data " + data + " --out " + out.string() +
           " --steps 2 --batch 2 --seq 16 --no-progress --sample-tokens 0";
  }
};

TEST_F(Cli, MissingShard) {
  expect_error(run(train_args((dir / "nope").string(), dir / "o")), "does not exist", dir / "o");
}
// Endless inputs that are not text are refused at their first block. They were read until memory ran out (2.7 GB
// in 5 s) to be refused for their first byte. The address limit and the timeout turn a regression into a failure,
// not a machine out of memory or a hung suite.
TEST_F(Cli, AnEndlessNonTextInputIsRefusedAtOnce) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  const std::string guard = test::address_limit_prefix(4096) + "timeout 60 ";
  const CliRun zero = test::run_after(guard, "prepare --text /dev/zero --out " + (dir / "z").string());
  expect_error(zero, "a NUL byte at byte 0", dir / "z");
  const CliRun noise =
      test::run_after(guard, "train --data /dev/urandom --steps 2 --no-progress --out " + (dir / "u").string());
  expect_error(noise, "is neither a token shard", dir / "u");
}

// A dangling symbolic link where a checkpoint or the data belongs, itself or a directory above the path given: the
// error names the link and its missing target. It said only "does not exist", of a path that ls showed.
TEST_F(Cli, ADanglingLinkIsNamedAsOne) {
  const fs::path link = dir / "ck", gone = dir / "gone";
  fs::create_symlink("gone", link);  // relative: shown from the working directory
  const std::string note = link.string() + " is a symbolic link to " + gone.string() + ", which does not resolve";
  expect_error(run("generate --checkpoint " + link.string()), note);
  expect_error(run("generate --checkpoint " + link.string() + "/"), note);
  expect_error(run("info --checkpoint " + link.string()), note);
  expect_error(run("train --resume " + (link / "checkpoint").string() + " --out " + (dir / "o").string() +
                   " --no-progress"),
               note, dir / "o");
  expect_error(run(train_args(link.string(), dir / "o")), note, dir / "o");
  expect_error(run("bench kernels --out " + (link / "k.md").string()), note);
  expect_error(run("train --steps 2 --no-progress --out " + (dir / "o").string() + " --trace " +
                   (link / "t.json").string()),
               note, dir / "o");
  // As the output: mkdir's "File exists" alone named a path that ls showed empty, and a failed prepare then removed
  // the user's link as a directory it had made (the train after it made a directory in its place).
  write_file_atomic((dir / "t.txt").string(), "some plain text to prepare");
  expect_error(run("prepare --text " + (dir / "t.txt").string() + " --out " + link.string()), note);
  expect_error(run("train --steps 1 --no-progress --out " + link.string()), note);
  EXPECT_TRUE(fs::is_symlink(link));
  // Through a link, "ck/.." is the directory that holds the link's target, not dir: the link is still the cause.
  expect_error(run("generate --checkpoint " + (link / ".." / "x").string()), note);
  // A missing path that is no link, or that only passes through a live one, keeps the plain message.
  const fs::path live = dir / "live";
  fs::create_directory(dir / "real");
  fs::create_symlink(dir / "real", live);
  for (const fs::path& p : {gone, live / "nothing"}) {
    const CliRun plain = run("generate --checkpoint " + p.string());
    EXPECT_EQ(plain.err.find("symbolic link"), std::string::npos) << plain.err;
    EXPECT_EQ(plain.err, "tessera: error: checkpoint " + p.string() + " does not exist\n");
  }
}

// A finished run's --resume, as "already holds a run" advises it, says how to go on: it said only "nothing to do".
TEST_F(Cli, ResumingAFinishedRunSaysToRaiseSteps) {
  const fs::path out = dir / "o";
  ASSERT_EQ(run(small_train(out) + " --steps 2").code, 0);
  expect_error(run("train --resume " + (out / "checkpoint").string() + " --no-progress"),
               "the checkpoint is at step 2, the last of the run's 2 steps: give --steps above 2 to train on");
  // The flag is named only where it was given.
  expect_error(run("train --resume " + (out / "checkpoint").string() + " --steps 1 --no-progress"),
               "the checkpoint is at step 2, nothing to do for --steps 1: give --steps above 2 to train on");
}

// A branch from best/ (--resume RUN/best --out NEW) starts from a model validated at its step: that is the branch's
// best so far, and its best/ starts as it. Its first validation, however much worse, became its best/ (a new user's
// trial: a step-7 best at 4.2515 over the step-6 model at 4.0943 that the branch began with).
TEST_F(Cli, ABranchFromBestKeepsItsStartAsBest) {
  const std::string flags = " --device cpu --no-progress --sample-tokens 0";
  const fs::path a = dir / "a", b = dir / "b";
  const CliRun first = run("train --out " + a.string() + flags +
                               " --batch 2 --seq 16 --d-model 32 --n-layers 2 "
                               "--n-heads 2 --steps 7 --lr 0.05 --warmup 0 --val-every 2",
                           dir);
  ASSERT_EQ(first.code, 0) << first.err;
  // The premise: the run's best is step 6, and step 7 (the end's validation) is worse.
  const auto best = best_record((a / "best").string());
  ASSERT_TRUE(best && best->second == 6) << first.out;
  const CliRun branch = run("train --resume " + (a / "best").string() + " --out " + b.string() + flags, dir);
  ASSERT_EQ(branch.code, 0) << branch.err;
  const size_t done = branch.out.find("val loss ", branch.out.find("done: 1 step"));
  ASSERT_NE(done, std::string::npos) << branch.out;
  ASSERT_GT(std::stod(branch.out.substr(done + 9)), best->first) << "the premise: step 7 validates worse";
  EXPECT_NE(branch.out.find("best:       " + (b / "best").string() + " (step 6, val loss "), std::string::npos)
      << branch.out;
  const auto kept = best_record((b / "best").string());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->second, 6);
  EXPECT_EQ(kept->first, best->first);
  EXPECT_TRUE(read_file_text((b / "best" / "model.safetensors").string()) ==
              read_file_text((a / "best" / "model.safetensors").string()))
      << "the branch's best/ is not the model it started from";
}

// `--precision ''` trained as if the flag were absent (empty is the device's default inside the options); info and
// bench refused it.
TEST_F(Cli, AnEmptyPrecisionIsRefused) {
  expect_error(run(small_train(dir / "p") + " --precision ''"),
               "--precision: unknown precision '' (expected f32, bf16 or f16)", dir / "p");
  // A switch-like config flag names every form it takes ("expects true/false" while 1 and on were taken too).
  expect_error(run("info --bias yes"), "--bias expects true/false (or on/off, 1/0), got 'yes'");
}

// Shards prepared by hand into OUT/data, with no run beside them, are not replaced by train's prepare of its text
// without --force: they were, without a word. The refusal names them all, or the first few.
TEST_F(Cli, TrainKeepsShardsPreparedIntoItsDataDir) {
  const fs::path out = dir / "run", text = dir / "t.txt";
  std::string words;
  for (int i = 0; i < 400; ++i) words += "a few words of text to prepare. ";
  write_file_atomic(text.string(), words);
  ASSERT_EQ(run("prepare --text " + text.string() + " --out " + (out / "data").string() + " --no-progress").code, 0);
  const std::string before = read_file_text((out / "data" / "train_000000.bin").string());
  const std::string train = "train --data " + text.string() + " --out " + out.string() +
                            " --steps 1 --batch 2 --seq 16 --no-progress --sample-tokens 0";
  expect_error(run(train),
               "holds no run, but its data/ holds shards (train_000000.bin, val_000000.bin) that train "
               "would replace");
  EXPECT_EQ(read_file_text((out / "data" / "train_000000.bin").string()), before);
  // Many are named as the first few: the refusal named the one shard it met first, as if it alone were at stake.
  for (int i = 1; i <= 4; ++i)
    fs::copy_file(out / "data" / "val_000000.bin", out / "data" / ("val_00000" + std::to_string(i) + ".bin"));
  expect_error(run(train), "holds shards (train_000000.bin, val_000000.bin, val_000001.bin and 3 more) that train");
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
  const CliRun forced = run(train + " --force");
  EXPECT_EQ(forced.code, 0) << forced.err;
}

// generate's missing checkpoint: "train one first" only for its default, runs/tiny's (given a path, tessera train
// would train another model there), and a run stopped while it wrote its first checkpoint is named.
TEST_F(Cli, AMissingCheckpointSaysWhy) {
  const CliRun dflt = run("generate", dir);
  expect_error(dflt, "checkpoint runs/tiny/checkpoint does not exist (train one first: tessera train)");
  fs::create_directories(dir / "run" / "checkpoint.tmp");
  expect_error(run("generate --checkpoint " + (dir / "run" / "checkpoint").string()),
               "does not exist: the run was stopped while writing it (" + (dir / "run" / "checkpoint.tmp").string() +
                   " is incomplete)");
}

TEST_F(Cli, TruncatedShard) {
  expect_error(run(train_args(data_with("truncated.bin"), dir / "o")), "truncated", dir / "o");
}
TEST_F(Cli, ShortHeader) {
  expect_error(run(train_args(data_with("short_header.bin"), dir / "o")), "truncated header", dir / "o");
}
TEST_F(Cli, BadMagic) { expect_error(run(train_args(data_with("bad_magic.bin"), dir / "o")), "bad magic", dir / "o"); }
TEST_F(Cli, BadVersion) {
  expect_error(run(train_args(data_with("bad_version.bin"), dir / "o")), "unsupported version", dir / "o");
}
TEST_F(Cli, TokenBeyondVocab) {
  expect_error(run(train_args(data_with("big_token.bin"), dir / "o")), "token id 300", dir / "o");
}
TEST_F(Cli, SequenceLongerThanMaxSeq) {
  expect_error(run("train --seq 65 --out " + (dir / "o").string() + " --no-progress"),
               "longer than the model's max_seq");
  expect_error(run("generate --checkpoint x --tokens -1"), "--tokens must be >= 0");
  expect_error(run("generate --checkpoint x"), "does not exist");
  expect_error(run("generate --checkpoint ''"), "--checkpoint is empty");
}
TEST_F(Cli, HeadsDoNotDivideWidth) { expect_error(run("info --n-heads 3"), "not divisible by --n-heads 3"); }
TEST_F(Cli, UnknownPreset) { expect_error(run("info --preset gpt5"), "unknown preset 'gpt5'"); }
TEST_F(Cli, UnknownFlagAndCommand) {
  expect_error(run("train --bogus 1"), "unknown flag --bogus");
  expect_error(run("info --d-model"), "--d-model needs a value");
  expect_error(run("info --d-model 12x"), "expects an integer");
  CliRun r = run("fly");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command 'fly' (see tessera --help)"), std::string::npos) << r.err;
  // A typo of a command, or of --version, is named as a flag's is.
  expect_error(run("--verison"), "unknown command '--verison' (did you mean --version?)");
  expect_error(run("trian --steps 1"), "unknown command 'trian' (did you mean train?)");
}
// Every command's --help works where the command itself could not run: bench allreduce outside mpirun.
TEST_F(Cli, BenchAllreduceHelpWithoutMpirun) {
  CliRun r = run("bench allreduce --help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--backend"), std::string::npos) << r.out;
  expect_error(run("bench allreduce --sizes 1MB"), "start the ranks with mpirun");
}
TEST_F(Cli, CorruptSafetensors) {
  fs::create_directories(dir / "ck");
  write_file_atomic((dir / "ck" / "model.safetensors").string(), std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
  expect_error(run("generate --checkpoint " + (dir / "ck").string()), "safetensors");
  write_file_atomic((dir / "ck" / "model.safetensors").string(), std::string("abc"));
  expect_error(run("info --checkpoint " + (dir / "ck").string()), "truncated");
}
// What a checkpoint lacks is named in the one line (it used to be the JSON library's text, or a tensor count).
TEST_F(Cli, CheckpointThatLacksSomethingNamesIt) {
  Gpt m(model_preset("tiny"));
  const fs::path ck = dir / "ck", file = ck / "model.safetensors";
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) { h["transformer.wte.weight"].erase("data_offsets"); });
  expect_error(run("generate --checkpoint " + ck.string()), "tensor 'transformer.wte.weight' has no data_offsets");
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) { h["transformer.wte.weight"] = nullptr; });
  expect_error(run("info --checkpoint " + ck.string()), "tensor 'transformer.wte.weight' is null, not an object");
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) { h.erase("transformer.wte.weight"); });
  expect_error(run("generate --checkpoint " + ck.string()), "missing tensor 'transformer.wte.weight'");
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) { h["__metadata__"].erase("tessera_config"); });
  expect_error(run("info --checkpoint " + ck.string()), "header has no tessera_config metadata");
  // Two tensors over the same bytes (both of 128 floats) were read without a word; a dtype that does not fit the
  // bytes was named only by the byte count.
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) {
    h["transformer.ln_f.bias"]["data_offsets"] = h["transformer.ln_f.weight"]["data_offsets"];
  });
  expect_error(run("generate --checkpoint " + ck.string()),
               "tensors 'transformer.ln_f.bias' and 'transformer.ln_f.weight' overlap in the data");
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) { h["transformer.ln_f.bias"]["dtype"] = "F16"; });
  expect_error(run("info --checkpoint " + ck.string()),
               "tensor 'transformer.ln_f.bias' has 512 bytes for shape (128) of dtype F16 (256 bytes)");
  // Bytes no tensor owns were read without a word: something appended after the data (here 8 bytes), or a hole
  // (the same 8 bytes put before the last tensor's data).
  save_checkpoint(ck.string(), m, nullptr);
  const std::string whole = read_file_text(file.string());
  write_file_atomic(file.string(), whole + std::string(8, '\0'));
  expect_error(run("generate --checkpoint " + ck.string()), "model.safetensors: 8 bytes after the last tensor's data");
  uint64_t last_end = 0;
  test::edit_safetensors_header(file, [&](nlohmann::json& h) {
    std::string last;
    for (const auto& [name, e] : h.items())
      if (name != "__metadata__" && e["data_offsets"][1].get<uint64_t>() > last_end) {
        last = name;
        last_end = e["data_offsets"][1].get<uint64_t>();
      }
    auto& off = h[last]["data_offsets"];
    off = {off[0].get<uint64_t>() + 8, off[1].get<uint64_t>() + 8};
  });
  expect_error(run("info --checkpoint " + ck.string()), " of the data belong to no tensor (a corrupt file)");
  // Offsets in reverse order were called "outside the file", of a file that was whole.
  save_checkpoint(ck.string(), m, nullptr);
  test::edit_safetensors_header(file, [](nlohmann::json& h) {
    auto& off = h["transformer.ln_f.bias"]["data_offsets"];
    off = {off[1], off[0]};
  });
  expect_error(run("generate --checkpoint " + ck.string()), "tensor 'transformer.ln_f.bias' has data offsets [");
  expect_error(run("generate --checkpoint " + ck.string()), "]: its end before its begin (a corrupt header)");
}
TEST_F(Cli, MismatchedSafetensors) {
  // A training checkpoint whose optimizer state belongs to another model.
  ModelConfig a = model_preset("tiny"), b = a;
  b.d_ff = 256;
  Gpt ma(a), mb(b);
  TrainState sb;
  sb.adam_m.assign(mb.params().size(), 0.0f);
  sb.adam_v = sb.adam_m;
  save_checkpoint((dir / "ckb").string(), mb, &sb);
  save_checkpoint((dir / "cka").string(), ma, nullptr);
  fs::copy_file(dir / "ckb" / "optimizer.safetensors", dir / "cka" / "optimizer.safetensors");
  expect_error(run("train --resume " + (dir / "cka").string() + " --out " + (dir / "o").string() + " --steps 3"),
               "has shape", dir / "o");
}
// A path that the file system refuses reached the user as "internal error: filesystem error: status: File name too
// long [...]" with exit code 1.
TEST_F(Cli, PathTheFileSystemRefusesIsOneLine) {
  const std::string long_name = (dir / std::string(300, 'a')).string();
  const std::string train = "train --device cpu --no-progress ";
  for (const std::string& args :
       {"info --checkpoint " + long_name, "generate --checkpoint " + long_name, train + "--out " + long_name,
        train + "--data " + long_name + " --out " + (dir / "o").string()}) {
    SCOPED_TRACE(args);
    const CliRun r = run(args);
    expect_error(r, "tessera: error: cannot access " + long_name, dir / "o");  // or a file inside it (--out)
    EXPECT_NE(r.err.find(": File name too long\n"), std::string::npos) << r.err;
  }
}
// A new directory whose last name the file system refuses: the parent made on the way is removed again (it was
// left behind once the directories made were only returned at the end).
TEST_F(Cli, AFailedOutputLeavesNoParentBehind) {
  const std::string too_long = std::string(300, 'a');
  expect_error(run("train --device cpu --no-progress --out " + (dir / "newt" / too_long).string()),
               "File name too long", dir / "newt");
  expect_error(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out " +
                   (dir / "newp" / too_long).string()),
               "File name too long", dir / "newp");
}
TEST_F(Cli, UnwritableOutput) {
  write_file_atomic((dir / "file").string(), std::string("x"));
  expect_error(run("train --out " + (dir / "file" / "sub").string()), "cannot create output directory");
  expect_error(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out " +
                   (dir / "file" / "sub").string()),
               "cannot create output directory");
  // A file as the directory itself said "cannot create output directory F: Not a directory" too.
  expect_error(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out " +
                   (dir / "file").string()),
               "tessera: error: output path " + (dir / "file").string() + " is not a directory\n");
  EXPECT_EQ(read_file_text((dir / "file").string()), "x");
}

// The names in a directory, sorted, with each file's size: what an interrupted or failed prepare must leave as it was.
std::vector<std::string> listing(const fs::path& d) {
  std::vector<std::string> out;
  if (!fs::exists(d)) return out;
  for (const auto& e : fs::directory_iterator(d))
    out.push_back(e.path().filename().string() + " " + std::to_string(e.is_regular_file() ? e.file_size() : 0));
  std::sort(out.begin(), out.end());
  return out;
}

// A text of `mib` MiB: long enough that prepare is still writing its shards when a test signals it.
fs::path big_text(const fs::path& dir, size_t mib) {
  std::string line = "It is easy to despise what you cannot get.\n", text;
  text.reserve(mib << 20);
  while (text.size() < (mib << 20)) text += line;
  const fs::path p = dir / "big.txt";
  write_file_atomic(p.string(), text);
  return p;
}

// SIGINT or SIGTERM while prepare wrote its shards killed it, leaving .train_000000.bin.tmp.<pid> beside the
// previous run's val shard, or a new train shard beside an old val one. Now it exits 128 + the signal and leaves
// the directory as it was: the previous shards, byte for byte, or no directory where it made one.
TEST_F(Cli, InterruptedPrepareLeavesTheDirectoryAsItWas) {
  const fs::path text = big_text(dir, 24);
  const fs::path old = dir / "old";
  ASSERT_EQ(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out " + old.string()).code,
            0);
  fs::copy_file(old / "val_000000.bin", old / "val_000001.bin");  // an earlier shard, kept when interrupted
  const std::vector<std::string> before = listing(old);
  ASSERT_EQ(before.size(), 3u);
  for (int sig : {SIGINT, SIGTERM}) {
    for (const fs::path& out : {old, dir / "new" / "sub"}) {
      SCOPED_TRACE(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + " into " + out.string());
      Child c = spawn("prepare --text " + text.string() + " --out " + out.string(), dir);
      // Signalled once a temporary shard exists: mid-write.
      bool writing = false;
      for (int i = 0; i < 20000 && !writing; ++i) {
        std::error_code ec;  // `out` comes and goes
        for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec))
          writing = writing || it->path().filename().string().find(".tmp.") != std::string::npos;
        if (!writing) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      ASSERT_TRUE(writing) << "prepare finished before it could be signalled";
      ASSERT_EQ(::kill(c.pid, sig), 0);
      EXPECT_EQ(wait_exit(c.pid), 128 + sig) << read_file_text(c.err.string());
      EXPECT_EQ(listing(out), out == old ? before : std::vector<std::string>{});
      EXPECT_FALSE(fs::exists(dir / "new")) << "the directories it made are removed again";
      EXPECT_NE(read_file_text(c.err.string()).find(" left as it was"), std::string::npos)
          << read_file_text(c.err.string());
    }
  }
  const auto [n_train, n_val] = std::make_pair(read_shard((old / "train_000000.bin").string()).size(),
                                               read_shard((old / "val_000000.bin").string()).size());
  EXPECT_EQ(n_train, 25751u);
  EXPECT_EQ(n_val, 2048u);
}

// prepare ran for 10-20 s over a 1.6 GB text with nothing printed. From 16 MiB of text on, a bar on stderr counts
// the MiB of it written as tokens (off a terminal, a line every 5%), ending at the whole text; stdout is as before.
// --no-progress, or a smaller text, print nothing there. train --data TEXT shows the same bar unless --no-progress.
TEST_F(Cli, PrepareShowsProgressForALargeText) {
  const fs::path text = big_text(dir, 17), out = dir / "o";
  const size_t mib = (fs::file_size(text) + (size_t{1} << 20) - 1) >> 20;
  const std::string total = std::to_string(mib) + "/" + std::to_string(mib);
  const CliRun r = run("prepare --text " + text.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.err);
  std::vector<std::string> bar;
  for (std::string line; std::getline(lines, line);) bar.push_back(line);
  ASSERT_GE(bar.size(), 2u) << r.err;
  EXPECT_LE(bar.size(), 21u) << "more than a line every 5%: " << r.err;
  for (size_t i = 0; i < bar.size(); ++i) {
    EXPECT_EQ(bar[i].rfind('[', 0), 0u) << bar[i];
    const std::string what = i + 1 < bar.size() ? "| writing shards | ETA " : "] MiB " + total + " | shards written | ";
    EXPECT_NE(bar[i].find(what), std::string::npos) << "expected '" << what << "' in " << bar[i];
  }
  EXPECT_EQ(r.out.find("MiB"), std::string::npos) << r.out;
  const CliRun quiet = run("prepare --no-progress --text " + text.string() + " --out " + out.string());
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  EXPECT_EQ(quiet.out, r.out);
  const fs::path small = dir / "small.txt";
  write_file_atomic(small.string(), std::string((size_t{16} << 20) - 1, 'x'));
  const CliRun below = run("prepare --text " + small.string() + " --out " + (dir / "s").string());
  ASSERT_EQ(below.code, 0) << below.err;
  EXPECT_EQ(below.err, "");
  const std::string train = "train --data " + text.string() +
                            " --batch 1 --seq 8 --d-model 16 --n-layers 1 "
                            "--n-heads 2 --steps 1 --val-every 0 --sample-tokens 0 --device cpu --out ";
  const CliRun t = run(train + (dir / "run").string());
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.err.find("] MiB " + total + " | shards written | "), std::string::npos) << t.err;
  const CliRun tq = run(train + (dir / "run2").string() + " --no-progress");
  ASSERT_EQ(tq.code, 0) << tq.err;
  EXPECT_EQ(tq.err.find("MiB"), std::string::npos) << tq.err;
}

// Train's own prepare of its text ran before its signal handlers: a Ctrl-C there killed it with a hidden temporary
// shard in OUT/data, and the next run into OUT refused that file. Now the prepare is undone, train exits 128 + the
// signal, and the run directory it made is gone.
TEST_F(Cli, TrainInterruptedWhilePreparingItsTextLeavesNothing) {
  const fs::path text = big_text(dir, 24), out = dir / "run";
  Child c = spawn(test::small_train_args(out, "--data " + text.string()), dir);
  bool writing = false;
  for (int i = 0; i < 20000 && !writing; ++i) {
    std::error_code ec;  // `out` comes and goes
    for (fs::directory_iterator it(out / "data", ec), end; !ec && it != end; it.increment(ec))
      writing = writing || it->path().filename().string().find(".tmp.") != std::string::npos;
    if (!writing) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  ASSERT_TRUE(writing) << "the prepare finished before it could be signalled";
  ASSERT_EQ(::kill(c.pid, SIGINT), 0);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGINT) << read_file_text(c.err.string());
  EXPECT_FALSE(fs::exists(out)) << "the run directory it made is removed again";
  EXPECT_NE(read_file_text(c.err.string()).find("interrupted while preparing"), std::string::npos)
      << read_file_text(c.err.string());
}

// Out of memory (ulimit -v) while it tokenized the text left the empty output directory it had made. Prepare now
// streams the tokens to disk, needing the text once and little beyond it: it finishes, or fails and removes the
// directory. What it needs is measured by bisection of the limit for a 32 and a 96 MiB text: the 64 MiB between
// them may cost 64 MiB of address space, not twice that (a second copy of the text). What both runs need beyond
// the text depends on the machine (on the GPU machine, 16 cores and libcuda mapped, about 100 MiB more than here),
// and cancels.
TEST_F(Cli, PrepareUnderAnAddressLimitFinishesOrLeavesNothing) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  const fs::path small = dir / "small.txt", out = dir / "o";
  fs::rename(big_text(dir, 32), small);
  const fs::path large = big_text(dir, 96);
  const auto args = [&](const fs::path& text) { return "prepare --text " + text.string() + " --out " + out.string(); };
  const auto runs = [](const std::string& a) {
    return [a](size_t m) { return test::run_after(test::address_limit_prefix(m), a).code == 0; };
  };
  const size_t small_mib = test::smallest_address_limit_mib(runs(args(small)), test::startup_address_mib());
  const size_t large_mib = test::smallest_address_limit_mib(runs(args(large)), small_mib);
  // Each limit is found to within 16 MiB: the 64 MiB of text more read as 48 to 80.
  EXPECT_LE(large_mib - small_mib, 96u) << "64 MiB more text should need 64 MiB more, not twice that (" << small_mib
                                        << " MiB for 32 MiB of text, " << large_mib << " for 96)";
  EXPECT_EQ(listing(out).size(), 2u);
  // Under a limit it cannot meet, one line, and nothing left behind.
  fs::remove_all(out);
  const CliRun r = test::run_after(test::address_limit_prefix(small_mib + 16), args(large));
  expect_error(r, "out of memory", out);
}

// A text too large to read whole says so, by name and size, not only "out of memory". The file is sparse.
TEST_F(Cli, ATextTooLargeToReadWholeIsNamedInTheError) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  const fs::path text = dir / "huge.txt", out = dir / "o";
  std::ofstream(text).close();
  fs::resize_file(text, uintmax_t{2} << 30);
  const CliRun r = test::run_with_address_limit(256, "prepare --text " + text.string() + " --out " + out.string());
  expect_error(r, "out of memory reading text " + text.string() + " whole (2048.0 MiB)", out);
}

// Prepare into a directory with an earlier run's train_000001.bin and val_000001.bin left them there, and
// train --data read all four shards. They are removed with the new shards' renames, and the output says so; a
// shard of another name that train would read (llm.c's, perhaps a long download) is refused, not removed.
TEST_F(Cli, PrepareReplacesTheShardsItFinds) {
  const fs::path out = dir / "stale", text = dir / "small.txt";
  write_file_atomic(text.string(), std::string(3000, 'x'));
  ASSERT_EQ(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out " + out.string()).code,
            0);
  fs::rename(out / "train_000000.bin", out / "train_000001.bin");
  fs::rename(out / "val_000000.bin", out / "val_000001.bin");
  write_file_atomic((out / "notes.txt").string(), std::string("mine"));
  const CliRun r = run("prepare --text " + text.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote 2700 train and 300 val tokens to " + out.string() +
                       " (removed 2 earlier shards: train_000001.bin, val_000001.bin)\n");
  EXPECT_EQ(listing(out), (std::vector<std::string>{"notes.txt 4", "train_000000.bin 6424", "val_000000.bin 1624"}));
  EXPECT_EQ(find_shards(out.string(), "train").size(), 1u);
  EXPECT_EQ(find_shards(out.string(), "val").size(), 1u);
  // Again: nothing else to remove, and nothing said about it.
  EXPECT_EQ(run("prepare --text " + text.string() + " --out " + out.string()).out,
            "wrote 2700 train and 300 val tokens to " + out.string() + "\n");

  fs::copy_file(out / "val_000000.bin", out / "fineweb_val_000001.bin");
  const std::vector<std::string> before = listing(out);
  expect_error(run("prepare --text " + text.string() + " --out " + out.string()),
               "tessera: error: prepare: " + out.string() +
                   " holds fineweb_val_000001.bin, a shard that train --data "
                   "would read beside the new ones");
  EXPECT_EQ(listing(out), before);
}

// An empty --out was "cannot create output directory : Invalid argument".
TEST_F(Cli, PrepareRefusesAnEmptyOut) {
  expect_error(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out ''"),
               "tessera: error: --out is empty\n");
}

TEST_F(Cli, ModelTooLargeForMemory) {
  // About 43B parameters: 16 bytes each for f32 training is far beyond any test machine.
  expect_error(run(train_args(data_with("good_train_000000.bin"), dir / "o") + " --preset cs336-2.7b --n-layers 400"),
               "out of memory: training this model needs", dir / "o");
}

TEST_F(Cli, SigintCheckpointsAndResumes) { interrupt_and_resume(SIGINT); }
TEST_F(Cli, SigtermCheckpointsAndResumes) { interrupt_and_resume(SIGTERM); }

TEST_F(Cli, SecondSigintExitsAtOnce) {
  // Steps of two to three seconds on 2 cores (the tiny preset, 256 x 64 tokens), so that both signals land inside
  // one, the second past the quarter second within which a repeat is the same stop.
  const fs::path out = dir / "o";
  Child c =
      spawn("train --out " + out.string() + " --batch 256 --steps 1000 --ckpt-every 0 --no-progress --device cpu", dir);
  ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 1, c.pid)) << read_file_text(c.err.string());
  ::kill(c.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ::kill(c.pid, SIGINT);
  EXPECT_EQ(wait_exit(c.pid), 130);
  // The first signal was acknowledged when it came, before the second.
  const std::string err = read_file_text(c.err.string());
  const size_t said = err.find("tessera: stopping after this step, with a checkpoint (a second signal exits at once");
  EXPECT_NE(said, std::string::npos) << err;
  EXPECT_LT(said, err.find("interrupted again")) << err;
  EXPECT_NE(err.find("interrupted again"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out / "checkpoint"));
}

// Two trains into one run directory both wrote its checkpoints and metrics, and died with errors about each other's
// temporary files. The second is refused while the first runs, --force or not, and leaves its files alone.
TEST_F(Cli, ASecondTrainIntoARunningRunIsRefused) {
  const fs::path out = dir / "o";
  const std::string flags = " --no-progress --sample-tokens 0";  // a resume takes the rest from its checkpoint
  // (Also: one step is said in the singular, and --out with a trailing slash prints its metrics path once-slashed.)
  const CliRun first = run("train --out o/ --steps 1 --batch 96 --device cpu" + flags, dir);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("done: 1 step in "), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("metrics:    o/metrics.jsonl\n"), std::string::npos) << first.out;
  Child c = spawn("train --resume " + (out / "checkpoint").string() + " --steps 1000" + flags, dir);  // logs in dir
  ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 2, c.pid)) << read_file_text(c.err.string());
  // (Bounded, should the lock fail: the checkpoint is the first run's, at step 1.)
  for (const char* second : {"--resume o/checkpoint --steps 1000 --stop-after 2", "--out o --force --steps 2"}) {
    const CliRun r = run("train " + std::string(second) + flags, dir);
    EXPECT_EQ(r.code, 2) << second << ": " << r.err;
    EXPECT_NE(r.err.find("output directory o is in use by another tessera process"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(fs::exists(out / "checkpoint"));
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGTERM);
  EXPECT_TRUE(fs::exists(out / "checkpoint"));
  // Once it has ended, the run is resumed as usual.
  const std::string next = std::to_string(checkpoint_step(out / "checkpoint") + 1);
  const CliRun resumed = run("train --resume o/checkpoint --stop-after " + next + flags, dir);
  EXPECT_EQ(resumed.code, 0) << resumed.err;
}

// Two trains started at once into one new --out: each saw it missing, both made it, and the one the other's lock
// refused then removed the directory as its own, under the run that held it (a third of the pairs, seen on 2
// cores). The one refused leaves the directory to the other, which finishes. A race, so the pair runs 8 times:
// with the fault, all 8 passing was about a 4% chance.
TEST_F(Cli, TwoTrainsStartedAtOnceIntoOneNewOutKeepTheWinnersRun) {
  const std::string data = data_with("good_train_000000.bin");
  for (int trial = 0; trial < 8; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const fs::path out = dir / ("race" + std::to_string(trial)), logs_a = dir / "logs_a", logs_b = dir / "logs_b";
    fs::create_directories(logs_a);
    fs::create_directories(logs_b);
    Child a = spawn(train_args(data, out), logs_a), b = spawn(train_args(data, out), logs_b);
    const int code_a = wait_exit(a.pid), code_b = wait_exit(b.pid);
    const std::string err_a = read_file_text(a.err.string()), err_b = read_file_text(b.err.string());
    // Exactly one finishes; the other is refused, while the first runs or once it has a run there, and says why.
    EXPECT_EQ((code_a == 0) + (code_b == 0), 1) << err_a << err_b;
    for (const auto& [code, err] : {std::pair{code_a, err_a}, std::pair{code_b, err_b}})
      if (code != 0) {
        EXPECT_EQ(code, 2) << err;
        EXPECT_TRUE(err.find("is in use by another tessera process") != std::string::npos ||
                    err.find("already holds a run") != std::string::npos)
            << err;
      }
    EXPECT_TRUE(fs::exists(out / "checkpoint")) << err_a << err_b;
    EXPECT_EQ(count_lines(out / "metrics.jsonl"), 2) << err_a << err_b;
  }
}

// The same race for prepare: the one refused by the other's lock removed the new directory it had made, under the
// prepare that held it, which then could not write its shards. The race runs in microseconds, so a fault point pauses
// the prepare between its mkdir and its lock, while flock(1) takes the lock as the other prepare would: the refused
// one leaves the directory to it.
TEST_F(Cli, APrepareRefusedByTheLockLeavesTheNewDirectoryToItsHolder) {
  const fs::path text = dir / "t.txt", out = dir / "new";
  write_file_atomic(text.string(), "Slow and steady wins the race. ");
  ::setenv("TESSERA_FAULT_INJECT", "prepare-pause-before-lock", 1);  // the child's, from the fork
  Child p = spawn("prepare --no-progress --text " + text.string() + " --out " + out.string(), dir);
  ::unsetenv("TESSERA_FAULT_INJECT");
  for (int i = 0; i < 1000 && !fs::exists(out); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_TRUE(fs::exists(out));
  const std::string holder = "flock -n " + out.string() + " sleep 4 &";
  ASSERT_EQ(std::system(holder.c_str()), 0);
  EXPECT_EQ(wait_exit(p.pid), 2);
  const std::string err = read_file_text(p.err.string());
  EXPECT_NE(err.find("is in use by another tessera process"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_directory(out)) << "removed under the lock's holder";
}

// `timeout` signals the command and then its process group, microseconds apart; a script's two kills land
// milliseconds apart. The second was taken as "again": the run left without its checkpoint. A repeat within a
// quarter second is the same stop. (The pause lets the first be delivered: two pending signals would merge.)
TEST_F(Cli, ASignalRepeatedAtOnceIsOneStop) {
  const fs::path out = dir / "o";
  Child c =
      spawn("train --out " + out.string() + " --batch 96 --steps 1000 --ckpt-every 0 --no-progress --device cpu", dir);
  ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 1, c.pid)) << read_file_text(c.err.string());
  ::kill(c.pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGTERM);
  const std::string err = read_file_text(c.err.string());
  EXPECT_EQ(err.find("again"), std::string::npos) << err;
  // The stop is acknowledged once: the repeat says nothing.
  const std::string note = "tessera: stopping after this step, with a checkpoint";
  ASSERT_NE(err.find(note), std::string::npos) << err;
  EXPECT_EQ(err.find(note, err.find(note) + 1), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(out / "checkpoint"));
}

// A resume with --no-checkpoint printed the run's best/ as if it were this run's best, beside a better validation
// loss of its own that it did not save. It says that best/ is as it was.
TEST_F(Cli, AResumeWithoutCheckpointsSaysItsBestIsAsItWas) {
  const fs::path out = dir / "o";
  ASSERT_EQ(run(test::small_train_args(out, ""), dir).code, 0);
  const CliRun r = run("train --resume " + (out / "checkpoint").string() +
                           " --steps 6 --no-checkpoint --no-progress "
                           "--sample-tokens 0 --device cpu",
                       dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("best:       " + (out / "best").string() + " (step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; as it was: --no-checkpoint writes none)\n"), std::string::npos) << r.out;
  // The header names the steps this resume runs ("for 6 steps" read against "done: 2 steps").
  EXPECT_NE(r.out.find(" for steps 5 to 6 -> "), std::string::npos) << r.out;
  const CliRun one = run("train --resume " + (out / "checkpoint").string() +
                             " --steps 5 --no-checkpoint --no-progress "
                             "--sample-tokens 0 --device cpu",
                         dir);
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find(" for step 5 -> "), std::string::npos) << one.out;  // not "for steps 5 to 5"
  // --stop-after ends the span ("for steps 5 to 8" under --stop-after 5 promised four steps and ran one).
  const std::string resume = "train --resume " + (out / "checkpoint").string() +
                             " --steps 8 --no-progress "
                             "--sample-tokens 0 --device cpu --stop-after ";
  const CliRun stop7 = run(resume + "7 --out " + (dir / "b").string(), dir);
  ASSERT_EQ(stop7.code, 0) << stop7.err;
  EXPECT_NE(stop7.out.find(" for steps 5 to 7 of 8 (--stop-after 7) -> "), std::string::npos) << stop7.out;
  const CliRun stop5 = run(resume + "5", dir);  // in place: after the branch, which read step 4
  ASSERT_EQ(stop5.code, 0) << stop5.err;
  EXPECT_NE(stop5.out.find(" for step 5 of 8 (--stop-after 5) -> "), std::string::npos) << stop5.out;
  const CliRun fresh = run(test::small_train_args(dir / "f", "--stop-after 3"), dir);
  ASSERT_EQ(fresh.code, 0) << fresh.err;
  EXPECT_NE(fresh.out.find(" for steps 1 to 3 of 4 (--stop-after 3) -> "), std::string::npos) << fresh.out;
  const CliRun all = run(test::small_train_args(dir / "g", "--stop-after 4"), dir);  // the last step: no note
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_NE(all.out.find(" for 4 steps -> "), std::string::npos) << all.out;
  const CliRun saved = run(test::small_train_args(dir / "s", ""), dir);  // a run that saves says nothing more
  ASSERT_EQ(saved.code, 0) << saved.err;
  EXPECT_EQ(saved.out.find("as it was"), std::string::npos) << saved.out;
}

// Under --no-checkpoint the acknowledgement does not promise a checkpoint.
TEST_F(Cli, AStopWithoutCheckpointsSaysNoneIsWritten) {
  const fs::path out = dir / "o";
  Child c =
      spawn("train --out " + out.string() + " --batch 96 --steps 1000 --no-checkpoint --no-progress --device cpu", dir);
  ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 1, c.pid)) << read_file_text(c.err.string());
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGTERM);
  const std::string err = read_file_text(c.err.string());
  EXPECT_NE(err.find("tessera: stopping after this step (--no-checkpoint: nothing is written)"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("with a checkpoint"), std::string::npos) << err;
  // The newline that ends a bar drawn in place is not printed with no bar: it was an empty line.
  EXPECT_EQ(err.rfind("tessera: stopping after this step", 0), 0u) << err;
}

// A run stopped before its --trace-step writes no trace, and said nothing of it.
TEST_F(Cli, AStopBeforeTheTraceStepSaysNoTraceWasWritten) {
  const fs::path out = dir / "o", trace = dir / "t.json";
  Child c = spawn("train --out " + out.string() + " --batch 96 --steps 1000 --trace-step 999 --trace " +
                      trace.string() + " --no-checkpoint --no-progress --device cpu",
                  dir);
  ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 1, c.pid)) << read_file_text(c.err.string());
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGTERM);
  const std::string err = read_file_text(c.err.string());
  EXPECT_NE(err.find("tessera: no --trace / --memory-timeline file: the run stopped before step 999, the one they "
                     "record\n"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(trace));
}

// A model whose vocab is wider than the bytes draws ids above 255; generate printed each masked to its low byte,
// text the model never wrote. Untrained, a vocab of 4096 draws them nearly always: each is now "<id N>".
TEST_F(Cli, GeneratePrintsIdsThatAreNoBytesAsIds) {
  const fs::path out = dir / "o";
  const CliRun t = run(small_train(out) + " --steps 1 --vocab 4096");
  ASSERT_EQ(t.code, 0) << t.err;
  const CliRun r = run("generate --greedy --prompt Hi --tokens 20 --checkpoint " + (out / "checkpoint").string());
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_GE(r.out.size(), 3u);
  EXPECT_EQ(r.out.substr(0, 2), "Hi");
  EXPECT_EQ(r.out.back(), '\n');
  // The 20 tokens: each one byte, or <id N> with N a wide id.
  int tokens = 0, wide = 0;
  for (size_t i = 2; i + 1 < r.out.size(); ++tokens) {
    int id = 0, len = 0;
    if (std::sscanf(r.out.c_str() + i, "<id %d>%n", &id, &len) == 1 && len > 0) {
      EXPECT_GE(id, 256) << r.out;
      EXPECT_LT(id, 4096) << r.out;
      ++wide;
      i += static_cast<size_t>(len);
    } else {
      ++i;
    }
  }
  EXPECT_EQ(tokens, 20) << r.out;
  EXPECT_GT(wide, 0) << r.out;
}

// A crash between the two renames of a checkpoint swap (where RENAME_EXCHANGE is missing) leaves only <dir>.old:
// generate reads it, as train --resume does.
TEST_F(Cli, GenerateFallsBackToTheOldCheckpoint) {
  const fs::path out = dir / "o";
  const CliRun t = run(small_train(out) + " --steps 2");
  ASSERT_EQ(t.code, 0) << t.err;
  const CliRun before = run("generate --greedy --tokens 5 --checkpoint " + (out / "checkpoint").string());
  ASSERT_EQ(before.code, 0) << before.err;
  fs::rename(out / "checkpoint", out / "checkpoint.old");
  const CliRun after = run("generate --greedy --tokens 5 --checkpoint " + (out / "checkpoint").string());
  EXPECT_EQ(after.code, 0) << after.err;
  EXPECT_EQ(after.out, before.out);
}

// A training run's directory given where a checkpoint is asked for was "cannot read <run>/model.safetensors".
TEST_F(Cli, RunDirectoryGivenForACheckpointNamesItsCheckpoints) {
  const fs::path out = dir / "o";
  const CliRun t = run(small_train(out) + " --steps 1");
  ASSERT_EQ(t.code, 0) << t.err;
  const std::string what = out.string() + " is a training run's directory, not a checkpoint: give " +
                           (out / "checkpoint").string() + " (the last step)";
  expect_error(run("generate --checkpoint " + out.string()), what);
  expect_error(run("info --checkpoint " + out.string()), what);
  expect_error(run("train --resume " + out.string() + " --out " + (dir / "o2").string()), what, dir / "o2");
}

// A stop between the micro-batches of a long step abandons the step: with --accum in the thousands a step takes
// minutes here, and SIGTERM waited for its end (timeout(1)'s one SIGTERM could not stop such a run). The checkpoint
// is the last whole step's (here the initial one), and resuming from it works.
TEST_F(Cli, SigtermWithinALongAccumulatedStepStopsAtOnce) {
  const fs::path out = dir / "o";
  // Step 1 alone: 100000 micro-batches of 2 x 16 tokens, far more than a minute on any machine.
  Child c = spawn(small_train(out) + " --steps 2 --accum 100000 --ckpt-every 0", dir);
  // metrics.jsonl is opened just before the first step, after the signal handlers are in place.
  for (int i = 0; i < 6000 && !fs::exists(out / "metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(out / "metrics.jsonl")) << read_file_text(c.err.string());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // inside step 1's micro-batches
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(c.pid, SIGTERM), 0);
  int code = -1;
  for (int i = 0; i < 6000 && code < 0; ++i) {  // up to a minute
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid)
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (code < 0) {
    ::kill(c.pid, SIGKILL);
    wait_exit(c.pid);
  }
  const std::string err = read_file_text(c.err.string());
  ASSERT_EQ(code, 128 + SIGTERM) << "still running a minute after SIGTERM: " << err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  EXPECT_NE(err.find("tessera: terminated at step 0: checkpoint written to " + (out / "checkpoint").string()),
            std::string::npos)
      << err;
  ASSERT_TRUE(fs::exists(out / "checkpoint")) << err;
  EXPECT_EQ(checkpoint_step(out / "checkpoint"), 0);
  EXPECT_EQ(count_lines(out / "metrics.jsonl"), 0);
  const CliRun r = run("generate --greedy --tokens 2 --checkpoint " + (out / "checkpoint").string());
  EXPECT_EQ(r.code, 0) << r.err;
}

// generate printed its text only at the end: 100k tokens on the CPU were minutes of silence, and an interrupt lost
// them all (as it lost train's summary lines, unflushed, during its sample). Each token is printed as it is drawn.
TEST_F(Cli, GenerateStreamsItsText) {
  const fs::path out = dir / "o";
  const CliRun t = run(small_train(out) + " --steps 1");
  ASSERT_EQ(t.code, 0) << t.err;
  Child c = spawn("generate --tokens 10000000 --prompt Hi --checkpoint " + (out / "checkpoint").string(), dir);
  size_t printed = 0;
  for (int i = 0; i < 6000 && printed < 12; ++i) {  // the prompt and 10 tokens, within a minute
    std::error_code ec;
    const auto n = fs::file_size(c.out, ec);
    printed = ec ? 0 : n;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(c.pid, SIGKILL);
  wait_exit(c.pid);
  EXPECT_GE(printed, 12u) << read_file_text(c.err.string());
  // Flushed token by token: first seen before stdio's 4096-byte buffer would have filled.
  EXPECT_LT(printed, 4096u);
  EXPECT_EQ(read_file_text(c.out.string()).substr(0, 2), "Hi");
}

// Out of memory making the model (past a ulimit -v, where the check of the free memory up front passes) left an
// empty output directory, and the prepared data in it.
TEST_F(Cli, OutOfMemoryBeforeTheFirstStepLeavesNothing) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  const fs::path out = dir / "o";
  // cs336-small's f32 parameters alone are 0.48 GiB, more than the limit leaves.
  const CliRun r = test::run_after(test::address_limit_prefix(test::startup_address_mib() + 256),
                                   "train --preset cs336-small --batch 1 --seq 16 --steps 1 --no-progress "
                                   "--sample-tokens 0 --device cpu --out " +
                                       out.string());
  expect_error(r, "out of memory", out);
  EXPECT_NE(r.out.find("prepared "), std::string::npos) << "failed before it made the directory: " << r.out;
}

// Two threads under an address limit: OpenBLAS maps a 128 MiB work buffer for each thread at its first call and,
// when that fails, retries forever. A train whose first GEMM found too little address space spun at 100% CPU,
// never ended and ignored Ctrl-C (a new user's trial). Now each limit either trains or fails in one line, and the
// limits just above the start-up's are the ones where the GEMMs' buffers do not fit.
TEST_F(Cli, ThreadsWithoutRoomForTheirBlasBuffersFailInsteadOfSpinning) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  const std::string args =
      "train --batch 8 --seq 64 --d-model 32 --n-layers 1 --n-heads 2 --steps 1 --no-progress "
      "--sample-tokens 0 --device cpu --out ";
  int blas_errors = 0, trained = 0;
  for (size_t extra : {160, 224, 288, 352, 416, 544}) {
    std::string name = "o";  // appended, not "o" + std::string&& (GCC 12 -Wrestrict false positive)
    name.append(std::to_string(extra));
    const fs::path out = dir / name;
    const size_t mib = test::startup_address_mib() + extra;
    const CliRun r = test::run_after("ulimit -v " + std::to_string(mib * 1024) +
                                         " && OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout -k 5 60 ",
                                     args + out.string());
    SCOPED_TRACE(std::to_string(extra) + " MiB past start-up");
    // timeout's SIGTERM asks train to stop after its step, which a spinning step never reaches: SIGKILL, 137.
    ASSERT_TRUE(r.code != 124 && r.code != 137) << "still running after 60 s: " << r.err;
    if (r.code == 0) {
      ++trained;
      continue;
    }
    expect_error(r, "out of memory", out);
    blas_errors += r.err.find("BLAS work buffer") != std::string::npos;
  }
  EXPECT_GE(blas_errors, 1) << "no limit reached the GEMMs' buffers";
  EXPECT_GE(trained, 1) << "no limit was enough to train";
}

// OpenBLAS starts its worker threads when it loads; under an address limit that leaves them no room for their work
// buffers they retry the mapping forever, and exit() waits for them: `info` printed its report and never ended, and
// a bench hung after its out-of-memory line (a new user's trial). Both now end.
TEST_F(Cli, CommandsEndWhenBlasThreadsFoundNoRoomUnderAnAddressLimit) {
  TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY();
  const std::string limit = "ulimit -v " + std::to_string((test::startup_address_mib() + 32) * 1024) +
                            " && OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout -k 5 30 ";
  const CliRun info = test::run_after(limit, "info");
  ASSERT_TRUE(info.code != 124 && info.code != 137) << "still running after 30 s: " << info.out;
  EXPECT_EQ(info.code, 0) << info.err;
  EXPECT_NE(info.out.find("model      tiny"), std::string::npos) << info.out;
  const CliRun bench = test::run_after(limit, "bench optimizer --size full --iters 1 --warmup 0 --no-progress");
  ASSERT_TRUE(bench.code != 124 && bench.code != 137) << "still running after 30 s: " << bench.err;
  expect_error(bench, "out of memory");
}

// Item 13 of the hardening issue: one step of gpt2-124m on the CPU used to be followed by minutes of sampling.
// Over 100M parameters on the CPU there is no sample unless asked for (about 4 GB and a few seconds here).
TEST_F(Cli, NoDefaultSampleForLargeModelsOnTheCpu) {
  const fs::path out = dir / "big";
  // One shard file as --data: no val split, so no best/ checkpoint to write as well (the checkpoint is 1.5 GB).
  const fs::path shard = fs::path(data_with("good_train_000000.bin")) / "train_000000.bin";
  const CliRun r = run("train --preset gpt2-124m --steps 1 --batch 1 --seq 8 --no-progress --device cpu --data " +
                       shard.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("no sample: 124.44M parameters"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("sample (temperature"), std::string::npos) << r.out;
}

TEST_F(Cli, CheckpointsByWallTimeUnlessCkptEveryZero) {
  // A run killed outright (SIGKILL, no handler) keeps its last periodic checkpoint. The metrics record of
  // step 3 is written after step 2's checkpoint, so one must exist by then.
  // Both flags together are refused (below): --ckpt-every 0 is shown writing none with the default interval.
  for (const char* mode : {"--ckpt-minutes 1e-12", "--ckpt-every 0"}) {
    const fs::path out = dir / "o";
    fs::remove_all(out);
    Child c = spawn(small_train(out) + " --steps 1000000 " + mode, dir);
    ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 3, c.pid)) << read_file_text(c.err.string());
    ::kill(c.pid, SIGKILL);
    wait_exit(c.pid);
    if (std::string(mode).find("--ckpt-every 0") == std::string::npos) {
      ASSERT_TRUE(fs::exists(out / "checkpoint")) << mode;
      EXPECT_GE(checkpoint_step(out / "checkpoint"), 2);
    } else {
      EXPECT_FALSE(fs::exists(out / "checkpoint")) << mode;
    }
  }
  // --ckpt-minutes was ignored beside --ckpt-every, without a word.
  expect_error(run(small_train(dir / "both") + " --ckpt-every 1 --ckpt-minutes 5", dir),
               "--ckpt-every times checkpoints by steps, and --ckpt-minutes by wall time (only without --ckpt-every): "
               "give one of them");
}

TEST_F(Cli, KeepsTheBestCheckpoint) {
  // A learning rate far too high makes the validation loss jump about; best/ holds its lowest step.
  const fs::path out = dir / "o";
  const CliRun r = run("train --out " + out.string() +
                       " --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 8 "
                       "--val-every 1 --lr 1 --min-lr-ratio 1 --warmup 0 --no-progress --sample-tokens 0");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(out / "metrics.jsonl");
  int64_t best_step = 0;
  double best = std::numeric_limits<double>::infinity();
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["val_loss"].get<double>() < best) best = j["val_loss"], best_step = j["step"];
  }
  ASSERT_NE(best_step, 8) << "the validation loss must turn up for best/ to differ from checkpoint/";
  EXPECT_EQ(checkpoint_step(out / "best"), best_step);
  EXPECT_NE(r.out.find("best:"), std::string::npos) << r.out;
}

TEST_F(Cli, OneOutputDirectoryPerRun) {
  // The default --out is runs/<preset>, and a second run there is refused until --force.
  const std::string args =
      "train --preset gpt2-124m --vocab 256 --d-model 32 --n-layers 1 --n-heads 2 --d-ff 64 "
      "--max-seq 16 --batch 2 --steps 1 --no-progress --sample-tokens 0";
  CliRun r = run(args, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "runs" / "gpt2-124m" / "checkpoint"));
  EXPECT_FALSE(fs::exists(dir / "runs" / "tiny"));
  const std::string metrics = read_file_text((dir / "runs" / "gpt2-124m" / "metrics.jsonl").string());
  r = run(args + " --steps 2", dir);
  expect_error(r, "already holds a run");
  EXPECT_NE(r.err.find("--resume runs/gpt2-124m/checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(read_file_text((dir / "runs" / "gpt2-124m" / "metrics.jsonl").string()), metrics);
  r = run(args + " --steps 2 --force", dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_lines(dir / "runs" / "gpt2-124m" / "metrics.jsonl"), 2);
  // A run whose checkpoint swap was cut short between its renames holds only checkpoint.old: still a run (its
  // first save would have deleted that last checkpoint), even with its metrics and best/ gone.
  fs::rename(dir / "runs" / "gpt2-124m" / "checkpoint", dir / "runs" / "gpt2-124m" / "checkpoint.old");
  fs::remove(dir / "runs" / "gpt2-124m" / "metrics.jsonl");
  fs::remove_all(dir / "runs" / "gpt2-124m" / "best");
  r = run(args + " --steps 2", dir);
  expect_error(r, "already holds a run: continue it with --resume runs/gpt2-124m/checkpoint.old");
  EXPECT_TRUE(fs::exists(dir / "runs" / "gpt2-124m" / "checkpoint.old" / "model.safetensors"));
  // --force replaces that run whole: a new run that saves no checkpoint (or no best/) left the old one's <dir>.old,
  // which the loaders read as RUN/checkpoint (RUN/best) while that is missing: the old model for the new run's.
  fs::copy(dir / "runs" / "gpt2-124m" / "checkpoint.old", dir / "runs" / "gpt2-124m" / "best.old",
           fs::copy_options::recursive);
  r = run(args + " --steps 2 --force --no-checkpoint", dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir / "runs" / "gpt2-124m" / "checkpoint.old"));
  EXPECT_FALSE(fs::exists(dir / "runs" / "gpt2-124m" / "best.old"));
  EXPECT_EQ(count_lines(dir / "runs" / "gpt2-124m" / "metrics.jsonl"), 2);
}

// A run's data path was saved as typed: resumed from another working directory it was not found, or another
// directory's data of that name was trained on silently; a copied run resumed on the original's data. The
// run's own OUT/data is now found beside its checkpoint, and a resume checks that the data is the same.
TEST_F(Cli, ResumeFindsTheRunsOwnDataFromAnywhereAndRefusesOtherData) {
  const std::string corpus = std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt";
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  // The loss of step `step` in a run's metrics.
  const auto loss_at = [](const fs::path& metrics, int step) {
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("step").get<int>() == step) return j.at("loss").get<double>();
    }
    return -1.0;
  };
  CliRun r =
      run("train --out a --batch 2 --seq 16 --d-model 32 --n-layers 1 --n-heads 2 --steps 6 --stop-after 2" + tail,
          dir);
  ASSERT_EQ(r.code, 0) << r.err;
  fs::copy(dir / "a", dir / "b", fs::copy_options::recursive);
  // The copy b resumes on its own b/data: step 3 as the run would have taken it.
  r = run("train --resume b/checkpoint --stop-after 3" + tail, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const double step3 = loss_at(dir / "b" / "metrics.jsonl", 3);
  ASSERT_GT(step3, 0);
  // a, resumed from another directory that holds an a/data of its own (other text), trains on its own data.
  std::string upper = read_file_text(corpus);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  write_file_atomic((dir / "upper.txt").string(), upper);
  fs::create_directories(dir / "elsewhere");
  ASSERT_EQ(run("prepare --text ../upper.txt --out a/data", dir / "elsewhere").code, 0);
  r = run("train --resume " + (dir / "a" / "checkpoint").string() + " --stop-after 3" + tail, dir / "elsewhere");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(loss_at(dir / "a" / "metrics.jsonl", 3), step3);
  // With b/data replaced by other text, b refuses to go on.
  const std::string metrics = read_file_text((dir / "b" / "metrics.jsonl").string());
  ASSERT_EQ(run("prepare --text upper.txt --out b/data --force", dir).code, 0);
  r = run("train --resume b/checkpoint --stop-after 4" + tail, dir);
  expect_error(r, "/b/data no longer holds the data this run trained on");
  EXPECT_EQ(read_file_text((dir / "b" / "metrics.jsonl").string()), metrics);
  // Other data too short for a batch, or for the saved position, is refused as other data too: its size was
  // checked first ("holds 27 tokens, fewer than batch x seq + 1"), which said nothing of why.
  write_file_atomic((dir / "short.txt").string(), std::string("thirty bytes of some new text"));
  ASSERT_EQ(run("prepare --text short.txt --out b/data --force", dir).code, 0);
  r = run("train --resume b/checkpoint --stop-after 4" + tail, dir);
  expect_error(r, "/b/data no longer holds the data this run trained on");
}

// --resume writes into the checkpoint's own run: into another directory that holds a run (--out B, or RUN/best
// resumed into RUN, whose checkpoint/ is later) it replaced that run's checkpoint and cut its metrics back.
TEST_F(Cli, ResumeRefusesToReplaceAnotherRun) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  const std::string model = " --batch 2 --seq 16 --d-model 32 --n-layers 1 --n-heads 2";
  ASSERT_EQ(run("train --out victim --steps 2" + model + tail, dir).code, 0);
  ASSERT_EQ(run("train --out src --steps 8 --val-every 2 --stop-after 6" + model + tail, dir).code, 0);
  const std::string victim = read_file_text((dir / "victim" / "metrics.jsonl").string());
  CliRun r = run("train --resume src/checkpoint --out victim --stop-after 7" + tail, dir);
  expect_error(r, "--resume src/checkpoint: output directory victim already holds a run");
  EXPECT_NE(r.err.find("give --out a new directory"), std::string::npos) << r.err;
  EXPECT_EQ(read_file_text((dir / "victim" / "metrics.jsonl").string()), victim);
  r = run("train --resume src/best --stop-after 7" + tail, dir);
  expect_error(r, "--resume src/best: output directory src already holds a run");
  EXPECT_EQ(count_lines(dir / "src" / "metrics.jsonl"), 6);
  // Branching from best into a new directory, and continuing the run itself, both go on.
  EXPECT_EQ(run("train --resume src/best --out branch --stop-after 7" + tail, dir).code, 0);
  EXPECT_EQ(run("train --resume src/checkpoint --out src --stop-after 7" + tail, dir).code, 0);
  EXPECT_EQ(count_lines(dir / "src" / "metrics.jsonl"), 7);
}

// --force replaces a run only once the new one's data has passed its checks: a text too short for the batch used
// to be written over OUT/data first, and the old run then resumed on the new data.
TEST_F(Cli, ForceThatFailsItsDataCheckLeavesTheRunAsItWas) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu --d-model 32 --n-layers 1 --n-heads 2";
  ASSERT_EQ(run("train --out r --steps 6 --batch 2 --seq 16 --stop-after 2" + tail, dir).code, 0);
  const std::string shard = read_file_text((dir / "r" / "data" / "train_000000.bin").string());
  // One byte more than a batch of 200 x 16 needs (3201 tokens): the text passes, its train split does not.
  write_file_atomic((dir / "short.txt").string(), std::string(3202, 'x'));
  const CliRun r = run("train --out r --force --steps 2 --batch 200 --seq 16 --data short.txt" + tail, dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("data short.txt: its train split holds"), std::string::npos) << r.err;
  EXPECT_TRUE(read_file_text((dir / "r" / "data" / "train_000000.bin").string()) == shard) << "the old data changed";
  EXPECT_FALSE(fs::exists(dir / "r" / ".data.new"));
  EXPECT_EQ(run("train --resume r/checkpoint --stop-after 3 --no-progress --sample-tokens 0", dir).code, 0);
}

// SIGHUP (the terminal closed) and SIGPIPE (the output pipe closed) killed a run with no checkpoint; they now stop
// it as SIGTERM does.
TEST_F(Cli, SighupCheckpointsAndResumes) { interrupt_and_resume(SIGHUP); }
// Under nohup, which ignores SIGHUP, a SIGHUP does not stop the run: train keeps an ignored SIGHUP ignored.
TEST_F(Cli, SighupIgnoredByTheLauncherStaysIgnored) {
  const fs::path out = dir / "o", metrics = out / "metrics.jsonl";
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGHUP, &ignore, &old);  // the child inherits it through exec, as nohup's does
  Child c = spawn(small_train(out) + " --steps 1000000 --ckpt-every 0", dir);
  ::sigaction(SIGHUP, &old, nullptr);
  ASSERT_TRUE(wait_for_steps(metrics, 3, c.pid)) << read_file_text(c.err.string());
  ASSERT_EQ(::kill(c.pid, SIGHUP), 0);
  const int at = count_lines(metrics);
  EXPECT_TRUE(wait_for_steps(metrics, at + 5, c.pid)) << "the SIGHUP stopped it: " << read_file_text(c.err.string());
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGTERM);
}

TEST_F(Cli, ClosedOutputPipeStopsWithACheckpoint) {
  const fs::path out = dir / "o", script = dir / "pipe.sh";
  // With the progress bar on (a line every 400 / 20 steps off a terminal), a write after `head` has gone.
  write_file_atomic(script.string(), test::binary() + " train --out " + out.string() +
                                         " --batch 2 --seq 16 --d-model 32 --n-layers 1 --sample-tokens 0 --device cpu "
                                         "--steps 400 --ckpt-every 0 2>&1 | head -c 1 > /dev/null\n"
                                         "exit ${PIPESTATUS[0]}\n");
  const int status = std::system(("bash '" + script.string() + "'").c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGPIPE);
  ASSERT_TRUE(fs::exists(out / "checkpoint"));
  const int64_t step = checkpoint_step(out / "checkpoint");
  EXPECT_LT(step, 400);
  EXPECT_EQ(count_lines(out / "metrics.jsonl"), step);
}

// An output path the file system refuses (root may "access" /proc, which takes no files) is refused before the
// work, not after the run or the benchmark.
TEST_F(Cli, OutputFilesThatCannotBeWrittenAreRefusedFirst) {
  expect_error(run("train --out o --steps 2 --trace /proc/tessera_x.json --no-progress", dir),
               "--trace /proc/tessera_x.json: cannot write there", dir / "o");
  // train's text goes to OUT/data, replacing what is there: a data/ with other files in it is refused.
  fs::create_directories(dir / "keep" / "data");
  write_file_atomic((dir / "keep" / "data" / "notes.txt").string(), std::string("mine"));
  expect_error(run("train --out keep --steps 2 --no-progress --device cpu", dir),
               "output directory keep: its data/ holds notes.txt, not a shard train writes");
  EXPECT_EQ(read_file_text((dir / "keep" / "data" / "notes.txt").string()), "mine");
  // The hidden file of a prepare that was killed there is the run's own: the prepare removes it.
  const fs::path leftover = dir / "killed" / "data" / ".train_000000.bin.tmp.2147483646";
  fs::create_directories(leftover.parent_path());
  write_file_atomic(leftover.string(), std::string("half a shard"));
  const CliRun resumed = run("train --out killed --steps 1 --no-progress --device cpu --sample-tokens 0", dir);
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_FALSE(fs::exists(leftover));
  if (::geteuid() == 0)  // others meet the permission check first, with its own words
    expect_error(run("bench kernels --device cpu --iters 1 --out /proc/tessera_x.md"),
                 "--out /proc/tessera_x.md: cannot write there");
  expect_error(run("bench kernels --device cpu --iters 1 --out ''"), "--out needs a file name");
}

// A run without validation said nothing of it: no val_loss, no best/, and no line saying why.
TEST_F(Cli, ARunWithoutValidationSaysWhy) {
  const std::string data = data_with("good_train_000000.bin");
  CliRun r = run(train_args(data + "/train_000000.bin", dir / "o1") + " --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("validation: none (--data " + data + "/train_000000.bin is one shard file, with no val split)"),
            std::string::npos)
      << r.out;
  // A directory with train shards alone trains too (it was refused: "no val shards").
  const fs::path only_train = dir / "only_train";
  fs::create_directories(only_train);
  fs::copy_file(data + "/train_000000.bin", only_train / "train_000000.bin");
  r = run(train_args(only_train.string(), dir / "o0") + " --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("validation: none (--data " + only_train.string() + " holds no val shards (val_*.bin))"),
            std::string::npos)
      << r.out;
  write_shard(data + "/val_000000.bin", std::vector<uint16_t>(16, 7));
  r = run(train_args(data, dir / "o2") + " --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("validation: none (the val split holds 16 tokens, not more than one sequence of --seq 16)"),
            std::string::npos)
      << r.out;
  r = run(train_args(data, dir / "o3") + " --device cpu --seq 8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("validation: none"), std::string::npos) << r.out;
}

TEST_F(Cli, EveryCheckBeforeAnyWrite) {
  // Each of these, with the default data, used to prepare OUT/data before failing.
  const fs::path out = dir / "o";
  const std::string base = "train --out " + out.string() + " --no-progress ";
  expect_error(run(base + "--steps -5"), "--steps must be positive", out);
  expect_error(run(base + "--batch 0"), "--batch must be positive", out);
  expect_error(run(base + "--seq 128"), "--seq 128 is longer than the model's max_seq 64", out);
  expect_error(run(base + "--seq 0"), "--seq must be positive", out);
  expect_error(run(base + "--warmup -1"), "--warmup must be >= 0", out);
  expect_error(run(base + "--lr 0"), "--lr must be a positive number", out);
  expect_error(run(base + "--lr -1e-3"), "--lr must be a positive number", out);
  expect_error(run(base + "--lr nan"), "--lr expects a number", out);
  expect_error(run(base + "--lr 0x10"), "--lr expects a number, got '0x10'", out);  // strtod: hex 16
  expect_error(run(base + "--accum 0"), "--accum must be positive", out);
  expect_error(run(base + "--accum 2147483647"), "--accum 2147483647 is more than 1048576 micro-batches a step", out);
  expect_error(run(base + "--min-lr-ratio 2"), "--min-lr-ratio must be in [0, 1]", out);
  expect_error(run(base + "--val-batches -1"), "--val-batches must be >= 0", out);
  expect_error(run(base + "--ckpt-every -2"), "--ckpt-every must be >= 0", out);
  expect_error(run(base + "--ckpt-minutes 0"), "--ckpt-minutes must be positive", out);
  expect_error(run(base + "--resume " + (dir / "nope").string()),
               "--resume: " + (dir / "nope").string() + " does not exist", out);
  write_file_atomic((dir / "afile").string(), std::string("x"));
  expect_error(run(base + "--resume " + (dir / "afile").string()), "is not a checkpoint directory", out);
  expect_error(run(base + "--vocab 100"), "--data is required", out);
  expect_error(run(base + "--device tpu"), "--device: unknown device 'tpu'", out);
  expect_error(run(base + "--precision f8"), "--precision: unknown precision 'f8'", out);
  expect_error(run(base + "--device cpu --loss-scale-init 1024"), "--loss-scale-init applies to --precision f16", out);
  expect_error(run(base + "--device cpu --master-weights off"), "--master-weights off applies to bf16 or f16", out);
  expect_error(run(base + "--master-weights maybe"), "--master-weights must be on or off", out);
  expect_error(run(base + "--device cpu --loss-scale-interval 10"), "--loss-scale-interval applies to --precision f16",
               out);
}

// Device and precision: refused with a reason where they cannot run (this machine class has no GPU; on a GPU
// machine the CUDA tests train there instead).
TEST_F(Cli, DeviceAndPrecisionNeedAGpu) {
  if (probe_gpu().available) GTEST_SKIP() << "a GPU is visible: tests/cuda covers training on it";
  const fs::path out = dir / "o";
  const std::string base = "train --out " + out.string() + " --no-progress ";
  expect_error(run(base + "--device cuda"), built_with_cuda() ? "no GPU is visible" : "built without CUDA", out);
  expect_error(run(base + "--precision bf16"), "--precision bf16 needs a GPU", out);
  expect_error(run(base + "--precision f16"), "--precision f16 needs a GPU", out);
  // The CPU is always there.
  const CliRun ok = run("train --out " + out.string() +
                        " --no-progress --device cpu --precision f32 --steps 2 "
                        "--sample-tokens 0");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("on the CPU"), std::string::npos) << ok.out;
}

TEST_F(Cli, SamplingFlagsAreCheckedNotChanged) {
  const std::string ck = " --checkpoint " + (dir / "nope").string();
  expect_error(run("generate --temperature -0.5" + ck), "--temperature must be >= 0");
  expect_error(run("generate --top-p 0" + ck), "--top-p must be in (0, 1]");
  expect_error(run("generate --top-p 1.5" + ck), "--top-p must be in (0, 1]");
  expect_error(run("generate --top-k -1" + ck), "--top-k must be >= 0");
  // --greedy overrode a --temperature given with it, without a word.
  expect_error(run("generate --greedy --temperature 0.8" + ck),
               "--greedy takes the most likely token, and --temperature 0.8 samples: give one of them");
  // And a --top-k or --top-p given with it, as a greedy --temperature 0 did.
  expect_error(run("generate --greedy --top-k 5" + ck),
               "--greedy takes the most likely token, and --top-k 5 limits what is sampled: give one of them");
  expect_error(run("generate --greedy --top-p 0.9" + ck),
               "--greedy takes the most likely token, and --top-p 0.9 limits what is sampled: give one of them");
  expect_error(run("generate --temperature 0 --top-k 5" + ck),
               "--temperature 0 takes the most likely token, and --top-k 5 limits what is sampled");
  // And a --seed, which greedy decoding never uses.
  expect_error(run("generate --greedy --seed 5" + ck),
               "--greedy takes the most likely token, and --seed 5 seeds sampling: give one of them");
  expect_error(run("generate --temperature 0 --seed 5" + ck),
               "--temperature 0 takes the most likely token, and --seed 5");
}

TEST_F(Cli, TextDataIsTokenizedBinaryIsRefused) {
  std::string text;
  for (int i = 0; i < 30; ++i) text += "Caf\xC3\xA9 \xE2\x80\x94 it is easy to despise what you cannot get. ";
  write_file_atomic((dir / "t.txt").string(), text);
  const fs::path out = dir / "o";
  CliRun r = run("train --data " + (dir / "t.txt").string() + " --out " + out.string() +
                 " --steps 2 --batch 2 --seq 16 --d-model 32 --n-layers 1 --no-progress");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "data" / "train_000000.bin"));
  EXPECT_TRUE(fs::exists(out / "data" / "val_000000.bin"));
  // The default sample is short: the prompt and 100 tokens.
  const std::string head = "sample (temperature 0.7, top-k 40):\n";
  const size_t at = r.out.find(head);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.size() - at - head.size(), 4u + 100u + 1u);
  // --temperature 0 is greedy, as --greedy is.
  const std::string gen = "generate --checkpoint " + (out / "checkpoint").string() + " --tokens 20";
  const CliRun greedy = run(gen + " --greedy"), zero = run(gen + " --temperature 0");
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  EXPECT_EQ(greedy.out, zero.out);

  // Neither a shard nor text: refused, naming tessera prepare, and nothing written.
  std::string binary_bytes =
      "\x7f"
      "ELF";
  for (int i = 0; i < 4000; ++i) binary_bytes += static_cast<char>(i * 37 % 256);
  write_file_atomic((dir / "blob").string(), binary_bytes);
  expect_error(run("train --data " + (dir / "blob").string() + " --out " + (dir / "o2").string()), "tessera prepare",
               dir / "o2");
  // prepare refuses non-text too; the tessera binary itself was once accepted.
  expect_error(run("prepare --text " + (dir / "blob").string() + " --out " + (dir / "d").string()), "is not plain text",
               dir / "d");
  expect_error(run("prepare --text " + binary() + " --out " + (dir / "d").string()), "is not plain text", dir / "d");
}

TEST_F(Cli, UnknownFlagSuggestsTheNearestAndVersion) {
  expect_error(run("train --stpes 3"), "unknown flag --stpes (did you mean --steps?)");
  expect_error(run("generate --temprature 1"), "(did you mean --temperature?)");
  expect_error(run("train --no-progress=1"), "--no-progress takes no value");
  expect_error(run("train --d_model"), "--d-model needs a value");
  const CliRun r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("tessera ", 0), 0u) << r.out;
  // In a git checkout the commit is the one the binary was built from (the header is remade at every build;
  // it used to be fixed at configure time and went stale after a commit).
  std::string head;
  if (std::FILE* p = ::popen("git -C " TESSERA_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, p)) head = buf;
    ::pclose(p);
  }
  while (!head.empty() && (head.back() == '\n' || head.back() == '\r')) head.pop_back();
  if (!head.empty()) EXPECT_NE(r.out.find("(commit " + head + ")"), std::string::npos) << r.out << " vs HEAD " << head;
  else EXPECT_NE(r.out.find("(commit unknown)"), std::string::npos) << r.out;
}

TEST_F(Cli, HelpOnEveryCommand) {
  for (const char* c : {"", "train", "generate", "prepare", "info"}) {
    const CliRun r = run(std::string(c) + " --help");
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("usage: tessera"), std::string::npos) << c;
  }
  const std::string help = run("train --help").out;
  for (const char* f : {"--force", "--ckpt-minutes", "--ckpt-every", "--val-batches", "--sample-tokens"})
    EXPECT_NE(help.find(f), std::string::npos) << f;
}

TEST_F(Cli, PrepareTrainGenerateInfo) {
  std::string text;
  for (int i = 0; i < 30; ++i) text += "It is easy to despise what you cannot get. ";
  write_file_atomic((dir / "t.txt").string(), text);
  CliRun r = run("prepare --text " + (dir / "t.txt").string() + " --out " + (dir / "d").string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("train --data " + (dir / "d").string() + " --out " + (dir / "o").string() +
          " --steps 3 --batch 2 --seq 16 --d-model 32 --n-layers 1 --sample-tokens 5 --no-progress");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
  std::ifstream metrics(dir / "o" / "metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(metrics, l);) {
    ++lines;
    for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"tokens_per_s\""})
      EXPECT_NE(l.find(key), std::string::npos);
  }
  EXPECT_EQ(lines, 3);
  r = run("generate --checkpoint " + (dir / "o" / "checkpoint").string() + " --prompt Hi --tokens 7 --greedy");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.size(), 2u + 7u + 1u);
  EXPECT_EQ(r.out.substr(0, 2), "Hi");
  r = run("info --checkpoint " + (dir / "o" / "checkpoint").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("d_model 32"), std::string::npos);
  r = run("info --preset cs336-small");
  EXPECT_NE(r.out.find("128625408"), std::string::npos);
}

// A prepare into the shards a running train reads (its own OUT/data, or its --data) replaced them under it, and
// the run's resume then failed. The train holds its data directory shared, a prepare takes it exclusively: the
// prepare is refused while the train runs, and leaves the shards alone; another train may read them meanwhile.
TEST_F(Cli, PrepareIntoTheShardsOfARunningTrainIsRefused) {
  const fs::path out = dir / "o";
  Child c = spawn(small_train(out) + " --steps 1000000 --ckpt-every 0", dir);
  ASSERT_TRUE(wait_for_steps(out / "metrics.jsonl", 1, c.pid)) << read_file_text(c.err.string());
  const std::string shard = read_file_text((out / "data" / "train_000000.bin").string());
  write_file_atomic((dir / "other.txt").string(), std::string(4000, 'x'));
  // A run's own data is refused as such; --force, which would replace it, is refused while the train runs.
  expect_error(run("prepare --text other.txt --out o/data", dir),
               "--out o/data holds the data of the training run "
               "in o, which that run's --resume checks: replaced, the run could not be resumed; give another --out, "
               "or --force to replace them");
  const CliRun r = run("prepare --text other.txt --out o/data --force", dir);
  expect_error(r, "shard directory o/data is in use by another tessera process");
  EXPECT_EQ(read_file_text((out / "data" / "train_000000.bin").string()), shard);
  const CliRun reader =
      run("train --data o/data --out p --steps 1 --batch 2 --seq 16 --d-model 32 --n-layers 1 "
          "--no-progress --sample-tokens 0 --device cpu",
          dir);
  EXPECT_EQ(reader.code, 0) << reader.err;
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGTERM);
  // Once it has ended the prepare goes through, and the run's resume refuses the other data as such.
  ASSERT_EQ(run("prepare --text other.txt --out o/data --force", dir).code, 0);
  const std::string next = std::to_string(checkpoint_step(out / "checkpoint") + 1);  // bounded, should it train
  expect_error(run("train --resume o/checkpoint --stop-after " + next + " --no-progress --sample-tokens 0", dir),
               "o/data no longer holds the data this run trained on");
}

// A stop while train reads its --data text (seconds for gigabytes) killed it without a word; it now says so and
// exits 128 + the signal, with nothing written. A FIFO whose writer stays open keeps the read waiting: once its
// bytes are gone from the pipe, the reader is in the read (the data checks before it never read a FIFO).
TEST_F(Cli, AStopWhileTrainReadsItsTextSaysSoAndWritesNothing) {
  const fs::path fifo = dir / "t.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const int w = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // a writer that stays
  ASSERT_GE(w, 0);
  ASSERT_EQ(::write(w, "some text\n", 10), 10);
  Child c =
      spawn("train --data " + fifo.string() + " --out " + (dir / "o").string() + " --no-progress --device cpu", dir);
  int left = 10;
  for (int i = 0; i < 2000 && left > 0; ++i) {  // up to 20 s
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(::ioctl(w, FIONREAD, &left), 0);
  }
  ASSERT_EQ(left, 0) << "train never read its text";
  ::kill(c.pid, SIGINT);
  EXPECT_EQ(wait_exit(c.pid), 128 + SIGINT);
  ::close(w);
  EXPECT_EQ(read_file_text(c.err.string()),
            "tessera: interrupted while reading " + fifo.string() + ": nothing written\n");
  EXPECT_FALSE(fs::exists(dir / "o"));
}

// Between the read of a --data text, its prepare and the training's handlers the default action of a stop was in
// force: a Ctrl-C there (about a second, for 400 MiB of text) killed train without a word. TESSERA_FAULT_INJECT
// raises SIGINT at each gap. After the read: nothing written, said as a stop while reading. After the prepare: the
// training stops at its first step boundary with a checkpoint, as a stop during the prepare's last shard does.
TEST_F(Cli, AStopBetweenTrainsReadAndItsTrainingIsSaid) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "It is easy to despise what you cannot get. ";
  write_file_atomic((dir / "t.txt").string(), text);
  const CliRun read = test::run_after("TESSERA_FAULT_INJECT=train-stop-after-read ",
                                      test::small_train_args(dir / "a", "--data t.txt"), dir);
  EXPECT_EQ(read.code, 128 + SIGINT) << read.err;
  EXPECT_EQ(read.err, "tessera: interrupted while reading t.txt: nothing written\n");
  EXPECT_FALSE(fs::exists(dir / "a"));
  const CliRun prepared = test::run_after("TESSERA_FAULT_INJECT=train-stop-after-prepare ",
                                          test::small_train_args(dir / "b", "--data t.txt"), dir);
  EXPECT_EQ(prepared.code, 128 + SIGINT) << prepared.err;
  EXPECT_NE(prepared.out.find("prepared t.txt"), std::string::npos) << prepared.out;
  // Said when the training takes it over, as a stop during the training is (unsaid, a second Ctrl-C abandoned the
  // checkpoint).
  EXPECT_EQ(prepared.err.rfind("tessera: stopping after this step, with a checkpoint", 0), 0u) << prepared.err;
  EXPECT_TRUE(fs::is_directory(dir / "b" / "checkpoint")) << prepared.out << prepared.err;
  EXPECT_TRUE(fs::exists(dir / "b" / "data" / "train_000000.bin"));
  // After the checks, just before the prepare (its scope starts its own flag at 0, which once wiped the stop): the
  // prepare is undone and nothing is left.
  const CliRun before = test::run_after("TESSERA_FAULT_INJECT=train-stop-before-prepare ",
                                        test::small_train_args(dir / "c", "--data t.txt"), dir);
  EXPECT_EQ(before.code, 128 + SIGINT) << before.err;
  EXPECT_NE(before.err.find("interrupted while preparing t.txt"), std::string::npos) << before.err;
  EXPECT_FALSE(fs::exists(dir / "c"));
}

// A prepare into a run's directory or a checkpoint mixed its shards in with them, without a word.
TEST_F(Cli, PrepareRefusesARunOrACheckpointUnlessForced) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  ASSERT_EQ(run("train --out o --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 2" + tail, dir).code, 0);
  write_file_atomic((dir / "t.txt").string(), std::string(3000, 'y'));
  expect_error(run("prepare --text t.txt --out o", dir),
               "--out o holds a training run (metrics.jsonl, checkpoint/): "
               "give the shards a directory of their own, or --force");
  expect_error(run("prepare --text t.txt --out o/checkpoint/", dir),
               "--out o/checkpoint/ is a checkpoint: give the "
               "shards a directory of their own, or --force");
  EXPECT_FALSE(fs::exists(dir / "o" / "train_000000.bin"));
  EXPECT_FALSE(fs::exists(dir / "o" / "checkpoint" / "train_000000.bin"));
  const CliRun forced = run("prepare --text t.txt --out o/checkpoint --force", dir);
  EXPECT_EQ(forced.code, 0) << forced.err;
  EXPECT_TRUE(fs::exists(dir / "o" / "checkpoint" / "train_000000.bin"));
  // Before a run exists its data directory is an ordinary one: prepare it there, then train.
  EXPECT_EQ(run("prepare --text t.txt --out n/data", dir).code, 0);
}

// The other way round: a train whose --data a prepare is writing (here the test holds the lock as a prepare does)
// is refused before it writes anything, and trains once the prepare is done.
TEST_F(Cli, ATrainIsRefusedWhileAPrepareWritesItsData) {
  const std::string data = data_with("good_train_000000.bin");
  {
    const DirectoryLock prepare(data, "shard directory", "(test)");
    expect_error(run(train_args(data, dir / "o")),
                 "data directory " + data + " is in use by another tessera process (a prepare writes its shards)",
                 dir / "o");
  }
  const CliRun r = run(train_args(data, dir / "o"));
  EXPECT_EQ(r.code, 0) << r.err;
}

// --resume through a symbolic link to a checkpoint (a "latest" link beside other files) was refused: the run's
// directory was taken to be the link's, which holds other files. The run is the one the link leads to, and it
// continues there.
TEST_F(Cli, ResumeThroughASymlinkContinuesTheRunItLeadsTo) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  ASSERT_EQ(
      run("train --out runs/o --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 4 --stop-after 2" + tail, dir).code,
      0);
  fs::create_directory_symlink("runs/o/checkpoint", dir / "latest");
  write_file_atomic((dir / "notes.txt").string(), std::string("not a run"));
  const CliRun r = run("train --resume latest" + tail, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  EXPECT_EQ(count_lines(dir / "runs" / "o" / "metrics.jsonl"), 4);
  EXPECT_EQ(checkpoint_step(dir / "runs" / "o" / "checkpoint"), 4);
  EXPECT_FALSE(fs::exists(dir / "metrics.jsonl"));
  EXPECT_TRUE(fs::is_symlink(dir / "latest"));
}

// A run's own checkpoint/ that is itself a link to an archived copy (RUN/checkpoint -> ../arch/step2) was taken to
// belong to arch/, and the resume failed there on arch/data. It names RUN, which continues; the archive is kept.
TEST_F(Cli, ResumeOfARunWhoseCheckpointIsALinkContinuesThatRun) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  ASSERT_EQ(run("train --out o --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 4 --stop-after 2" + tail, dir).code,
            0);
  fs::create_directory(dir / "arch");
  fs::rename(dir / "o" / "checkpoint", dir / "arch" / "step2");
  fs::create_directory_symlink("../arch/step2", dir / "o" / "checkpoint");
  const CliRun r = run("train --resume o/checkpoint" + tail, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
  EXPECT_EQ(count_lines(dir / "o" / "metrics.jsonl"), 4);
  EXPECT_EQ(checkpoint_step(dir / "o" / "checkpoint"), 4);
  EXPECT_EQ(checkpoint_step(dir / "arch" / "step2"), 2);
  EXPECT_FALSE(fs::exists(dir / "arch" / "metrics.jsonl"));
  // Through a "latest" link to that checkpoint link: the run met on the way, o, not the archive.
  fs::rename(dir / "o" / "checkpoint", dir / "arch" / "step4");
  fs::create_directory_symlink("../arch/step4", dir / "o" / "checkpoint");
  fs::create_directory_symlink("o/checkpoint", dir / "latest");
  const CliRun r2 = run("train --resume latest --steps 6" + tail, dir);
  ASSERT_EQ(r2.code, 0) << r2.err;
  EXPECT_EQ(count_lines(dir / "o" / "metrics.jsonl"), 6);
  EXPECT_EQ(checkpoint_step(dir / "o" / "checkpoint"), 6);
  EXPECT_EQ(checkpoint_step(dir / "arch" / "step4"), 4);
}

// A run that diverges with no checkpoint keeps its metrics (how it went), so the same command is then refused as
// one into a run. The error says so, and how to train there again.
TEST_F(Cli, ADivergedRunSaysHowToTrainThereAgain) {
  const std::string args =
      "train --out o --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 20 --warmup 0 "
      "--no-progress --sample-tokens 0 --device cpu";
  const CliRun r = run(args + " --lr 1e30", dir);
  expect_error(r, "training diverged: ");
  EXPECT_NE(r.err.find("; no checkpoint was written; o/metrics.jsonl keeps the losses: train into o again with "
                       "--force)"),
            std::string::npos)
      << r.err;
  EXPECT_GE(count_lines(dir / "o" / "metrics.jsonl"), 1);
  EXPECT_EQ(run(args, dir).code, 2);
  const CliRun again = run(args + " --force", dir);
  EXPECT_EQ(again.code, 0) << again.err;
}

// A resumed run's metrics.jsonl that is not a file failed after the run had printed its startup lines.
TEST_F(Cli, ResumeChecksItsMetricsBeforeItStarts) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  ASSERT_EQ(run("train --out o --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 4 --stop-after 2" + tail, dir).code,
            0);
  fs::remove(dir / "o" / "metrics.jsonl");
  fs::create_directory(dir / "o" / "metrics.jsonl");
  const CliRun r = run("train --resume o/checkpoint" + tail, dir);
  expect_error(r, "output directory o: its metrics.jsonl is not a file");
  EXPECT_EQ(r.out, "");
}

// A metrics.jsonl cut short (a copy that stopped, an edit) was repaired without a word, the steps it lost missing
// from the run's record for good. The resume says which.
TEST_F(Cli, ResumeWarnsOfStepsMissingFromItsMetrics) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  const auto train = [&](const std::string& out, int stop_after) {
    ASSERT_EQ(run("train --out " + out + " --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 8 --stop-after " +
                      std::to_string(stop_after) + tail,
                  dir)
                  .code,
              0);
  };
  const auto lines_of = [](const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) lines.push_back(l + "\n");
    return lines;
  };
  // Cut short: steps 1 and 2, and a torn third line (the torn last line of a run killed mid-write is dropped
  // without a word; the steps after it are missing).
  train("o", 5);
  const fs::path metrics = dir / "o" / "metrics.jsonl";
  std::vector<std::string> lines = lines_of(read_file_text(metrics.string()));
  ASSERT_EQ(lines.size(), 5u);
  write_file_atomic(metrics.string(), lines[0] + lines[1] + lines[2].substr(0, 10));
  const CliRun r = run("train --resume o/checkpoint --stop-after 6" + tail, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err,
            "tessera: warning: o/metrics.jsonl: no record of 3 of steps 1 to 5, the first missing step 3; cut "
            "short or edited; the resumed run's records follow step 5 without them\n");
  EXPECT_EQ(count_lines(metrics), 3);  // 1, 2, 6
  // Warned once: the next resume, with no more steps missing, says nothing; one more line cut, it warns again.
  // The note sits on the record of the highest step kept (step 2 here) in the writer's key order.
  EXPECT_EQ(lines_of(read_file_text(metrics.string()))[1].rfind("{\"step\":2,", 0), 0u);
  EXPECT_NE(read_file_text(metrics.string()).find("\"missing_steps\":3"), std::string::npos);
  const CliRun again = run("train --resume o/checkpoint --stop-after 7" + tail, dir);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.err, "");
  lines = lines_of(read_file_text(metrics.string()));
  ASSERT_EQ(lines.size(), 4u);  // 1, 2, 6, 7
  write_file_atomic(metrics.string(), lines[0] + lines[1] + lines[3]);
  const CliRun more = run("train --resume o/checkpoint --stop-after 8" + tail, dir);
  ASSERT_EQ(more.code, 0) << more.err;
  EXPECT_EQ(more.err,
            "tessera: warning: o/metrics.jsonl: no record of 4 of steps 1 to 7, the first missing step 3; "
            "cut short or edited; the resumed run's records follow step 7 without them\n");
  // Damaged: a line among whole ones is counted.
  train("d", 3);
  lines = lines_of(read_file_text((dir / "d" / "metrics.jsonl").string()));
  ASSERT_EQ(lines.size(), 3u);
  write_file_atomic((dir / "d" / "metrics.jsonl").string(), lines[0] + "{\"step\": 2, \"lo\n" + lines[2]);
  const CliRun damaged = run("train --resume d/checkpoint --stop-after 4" + tail, dir);
  ASSERT_EQ(damaged.code, 0) << damaged.err;
  EXPECT_EQ(damaged.err,
            "tessera: warning: d/metrics.jsonl: no record of 1 of steps 1 to 3, the first missing step "
            "2; 1 unreadable line dropped; the resumed run's records follow step 3 without them\n");
  // Whole, or with only a torn last line: no warning. Nor a hand-edited field that is not a number: the record is
  // kept (it was counted as an unreadable line, and the warning came back at every resume).
  train("w", 2);
  const std::string whole = read_file_text((dir / "w" / "metrics.jsonl").string());
  write_file_atomic((dir / "w" / "metrics.jsonl").string(), whole + "{\"step\": 3, \"lo");
  const CliRun quiet = run("train --resume w/checkpoint --stop-after 3" + tail, dir);
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  EXPECT_EQ(count_lines(dir / "w" / "metrics.jsonl"), 3);
  lines = lines_of(read_file_text((dir / "w" / "metrics.jsonl").string()));
  write_file_atomic((dir / "w" / "metrics.jsonl").string(),
                    "{\"missing_steps\": \"x\", \"val_loss\": null, " + lines[0].substr(1) + lines[1] + lines[2]);
  const CliRun edited = run("train --resume w/checkpoint --stop-after 4" + tail, dir);
  ASSERT_EQ(edited.code, 0) << edited.err;
  EXPECT_EQ(edited.err, "");
  EXPECT_EQ(count_lines(dir / "w" / "metrics.jsonl"), 4);
  // Emptied or deleted: every step is missing, which a count from the first record kept never saw. A run branched
  // into a new --out has no metrics of its own to miss.
  train("e", 3);
  const CliRun branch = run("train --resume e/checkpoint --out br --stop-after 4" + tail, dir);
  ASSERT_EQ(branch.code, 0) << branch.err;
  EXPECT_EQ(branch.err, "");
  write_file_atomic((dir / "e" / "metrics.jsonl").string(), "");
  const CliRun emptied = run("train --resume e/checkpoint --stop-after 4" + tail, dir);
  ASSERT_EQ(emptied.code, 0) << emptied.err;
  EXPECT_EQ(emptied.err,
            "tessera: warning: e/metrics.jsonl: no record of steps 1 to 3 (the file is empty); the "
            "resumed run's records follow step 3 without them\n");
  fs::remove(dir / "e" / "metrics.jsonl");
  const CliRun deleted = run("train --resume e/checkpoint --stop-after 5" + tail, dir);
  ASSERT_EQ(deleted.code, 0) << deleted.err;
  EXPECT_EQ(deleted.err,
            "tessera: warning: e/metrics.jsonl: no record of steps 1 to 4 (the file is missing); the "
            "resumed run's records follow step 4 without them\n");
  const CliRun after = run("train --resume e/checkpoint --stop-after 6" + tail, dir);  // warned once
  ASSERT_EQ(after.code, 0) << after.err;
  EXPECT_EQ(after.err, "");
}

// A run under a symbolic link (home/x, home -> real), once resumed, compared its data's resolved path (real/x/data,
// as the resume finds it) with the link's, found it outside the run and saved no data_in_run: moved, the run then
// sought its old data ("real/x/data does not exist").
TEST_F(Cli, ARunUnderASymbolicLinkFindsItsOwnDataWhenMoved) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  fs::create_directories(dir / "real");
  fs::create_directory_symlink("real", dir / "home");
  ASSERT_EQ(
      run("train --out home/x --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 4 --stop-after 2" + tail, dir).code,
      0);
  const CliRun first = run("train --resume home/x/checkpoint --stop-after 3" + tail, dir);
  ASSERT_EQ(first.code, 0) << first.err;
  fs::rename(dir / "real" / "x", dir / "real" / "y");
  const CliRun r = run("train --resume home/y/checkpoint" + tail, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_lines(dir / "real" / "y" / "metrics.jsonl"), 4);
}

// A branch (--resume A/checkpoint --out B, B made beforehand) that fails before its first step left an empty
// B/metrics.jsonl, which made B a run: the same command was then refused ("continue it with --resume
// B/checkpoint", which does not exist). Here the checkpoint's weights are NaN, so the first step diverges.
TEST_F(Cli, ABranchThatFailsAtOnceLeavesNoEmptyMetrics) {
  const std::string tail = " --no-progress --sample-tokens 0 --device cpu";
  ASSERT_EQ(run("train --out a --batch 2 --seq 16 --d-model 32 --n-layers 1 --steps 4 --stop-after 2" + tail, dir).code,
            0);
  const fs::path model = dir / "a" / "checkpoint" / "model.safetensors";
  std::string bytes = read_file_text(model.string());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  std::fill(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), bytes.end(), '\xff');  // every weight NaN
  write_file_atomic(model.string(), bytes);
  fs::create_directories(dir / "b");
  const std::string branch = "train --resume a/checkpoint --out b" + tail;
  const CliRun r = run(branch, dir);
  expect_error(r, "training diverged: ");
  EXPECT_NE(r.err.find("no checkpoint was written, and a/checkpoint is as it was)"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_directory(dir / "b"));
  EXPECT_FALSE(fs::exists(dir / "b" / "metrics.jsonl"));
  expect_error(run(branch, dir), "training diverged: ");  // the same again, not "already holds a run"
}

}  // namespace
}  // namespace tessera
