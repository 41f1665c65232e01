// The tessera binary end to end: each bad input is one line on stderr, exit code 2, and no partial file.
#include <algorithm>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessera/core/file_io.h"
#include "tessera/train/checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string out, err;
};

CliRun run(const std::string& args) {
  const fs::path err_file = fs::temp_directory_path() / ("tessera_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " 2>" + err_file.string() + " </dev/null";
  CliRun r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file_text(err_file.string());
  fs::remove(err_file);
  return r;
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

  // One line, exit 2, naming `what`, and nothing left in the output directory.
  void expect_error(const CliRun& r, const std::string& what, const fs::path& out = {}) {
    EXPECT_EQ(r.code, 2) << r.err;
    std::string e = r.err;
    while (!e.empty() && e.front() == '\n') e.erase(e.begin());
    EXPECT_EQ(e.rfind("tessera: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_NE(e.find(what), std::string::npos) << "expected '" << what << "' in: " << r.err;
    if (!out.empty() && fs::exists(out)) {
      for (const auto& f : fs::recursive_directory_iterator(out)) {
        const std::string name = f.path().filename().string();
        EXPECT_TRUE(name == "metrics.jsonl" ? fs::file_size(f.path()) == 0 : false) << "left behind: " << f.path();
      }
    }
  }
  std::string train_args(const std::string& data, const fs::path& out) {
    return "train --data " + data + " --out " + out.string() + " --steps 2 --batch 2 --seq 16 --no-progress --sample-tokens 0";
  }
};

TEST_F(Cli, MissingShard) {
  expect_error(run(train_args((dir / "nope").string(), dir / "o")), "does not exist", dir / "o");
}
TEST_F(Cli, TruncatedShard) { expect_error(run(train_args(data_with("truncated.bin"), dir / "o")), "truncated", dir / "o"); }
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
  expect_error(run("train --seq 65 --out " + (dir / "o").string() + " --no-progress"), "longer than the model's max_seq");
  expect_error(run("generate --checkpoint x --tokens -1"), "--tokens must be >= 0");
  expect_error(run("generate --checkpoint x"), "does not exist");
}
TEST_F(Cli, HeadsDoNotDivideWidth) { expect_error(run("info --n-heads 3"), "not divisible by n_heads 3"); }
TEST_F(Cli, UnknownPreset) { expect_error(run("info --preset gpt5"), "unknown preset 'gpt5'"); }
TEST_F(Cli, UnknownFlagAndCommand) {
  expect_error(run("train --bogus 1"), "unknown flag --bogus");
  expect_error(run("info --d-model"), "--d-model needs a value");
  expect_error(run("info --d-model 12x"), "expects an integer");
  CliRun r = run("fly");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command 'fly'"), std::string::npos);
}
TEST_F(Cli, CorruptSafetensors) {
  fs::create_directories(dir / "ck");
  write_file_atomic((dir / "ck" / "model.safetensors").string(), std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
  expect_error(run("generate --checkpoint " + (dir / "ck").string()), "safetensors");
  write_file_atomic((dir / "ck" / "model.safetensors").string(), std::string("abc"));
  expect_error(run("info --checkpoint " + (dir / "ck").string()), "truncated");
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
TEST_F(Cli, UnwritableOutput) {
  write_file_atomic((dir / "file").string(), std::string("x"));
  expect_error(run("train --out " + (dir / "file" / "sub").string()), "cannot create output directory");
  expect_error(run("prepare --text " + std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt --out " +
                   (dir / "file" / "sub").string()),
               "cannot create output directory");
}

TEST_F(Cli, ModelTooLargeForMemory) {
  // About 43B parameters: 16 bytes each for f32 training is far beyond any test machine.
  expect_error(run(train_args(data_with("good_train_000000.bin"), dir / "o") + " --preset cs336-2.7b --n-layers 400"),
               "out of memory: training this model needs", dir / "o");
}

TEST_F(Cli, HelpOnEveryCommand) {
  for (const char* c : {"", "train", "generate", "prepare", "info"}) {
    const CliRun r = run(std::string(c) + " --help");
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("usage: tessera"), std::string::npos) << c;
  }
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
    for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"tokens_per_s\""}) EXPECT_NE(l.find(key), std::string::npos);
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

}  // namespace
}  // namespace tessera
