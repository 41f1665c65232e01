// tessera tokenizer train: the files it writes, and its one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/tokenizer/formats.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const std::string kCorpus = std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt";

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("tessera_bpe_cli_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

TEST(BpeTrainCli, WritesTheSameModelAsTokenizerJson) {
  TempDir tmp;
  const std::string other = (tmp.path / "other.txt").string();
  write_file_atomic(other, std::string("caf\xc3\xa9 \xe2\x82\xac\x01\x02 <|endoftext|> tabs\t\tand\n\n\nlines"));
  for (bool first : {false, true}) {
    const fs::path out = tmp.path / (first ? "first" : "after");
    const auto r = test::run("tokenizer train --text " + kCorpus + " " + other + " --vocab-size 320 --special " +
                             "'<|endoftext|>' --special '<pad>' --threads 2 --no-progress --out " + out.string() +
                             (first ? " --special-first" : ""));
    ASSERT_EQ(r.code, 0) << r.err;
    BpeTrainParams p;
    p.vocab_size = 320;
    p.special_tokens = {"<|endoftext|>", "<pad>"};
    p.special_first = first;
    const BpeModel want = bpe_train_files({kCorpus, other}, p);
    ASSERT_EQ(want.merges.size(), 320u - 258u);
    const BpeModel got = read_hf_tokenizer_json((out / "tokenizer.json").string());
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.merges, want.merges);
    EXPECT_EQ(got.special_ids, want.special_ids);
    EXPECT_EQ(want.special_ids, first ? std::vector<int32_t>({0, 1}) : std::vector<int32_t>({256, 257}));
  }
}

TEST(BpeTrainCli, BadFlagsAreOneLineAndExitTwo) {
  TempDir tmp;
  const std::string file = (tmp.path / "a_file").string();
  write_file_atomic(file, std::string("x"));
  const std::string out = " --out " + (tmp.path / "out").string();
  const std::string ok = " --text " + kCorpus + " --vocab-size 300" + out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--vocab-size 300" + out, "--text FILE... is required"},
      {"--text" + out + " --vocab-size 300", "--text needs at least one FILE"},
      {"--text " + kCorpus + out, "--vocab-size N is required"},
      {"--text " + kCorpus + " --vocab-size 300", "--out DIR is required"},
      {"--text " + kCorpus + " --vocab-size 100" + out, "vocab size 100 is below the 256 bytes"},
      {"--text " + kCorpus + " --vocab-size 257 --special a --special b" + out, "at least 258"},
      {"--text " + kCorpus + " --vocab-size many" + out, "--vocab-size"},
      {"--text " + (tmp.path / "missing.txt").string() + " --vocab-size 300" + out, "cannot read"},
      {"--text " + tmp.path.string() + " --vocab-size 300" + out, "is a directory"},
      {ok + " --special ''", "--special is empty"},
      {ok + " --special x --special x", "given twice"},
      {ok + " --special \"$(printf '\\377')\"", "not valid UTF-8"},
      {ok + " --threads -1", "--threads must be >= 0"},
      {ok + " --special", "--special needs a value"},
      {"--text " + kCorpus + " --vocab-size 300 --out " + file, "is not a directory"},
      {ok + " --vocab-sise 3", "did you mean --vocab-size"},
      {ok + " --special a", "is also the text of an ordinary token"},
  };
  for (const auto& [args, want] : cases) {
    const auto r = test::run_after("", "tokenizer train " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("tessera: error: "), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(tmp.path / "out" / "tokenizer.json"));
}

// The file loads in Hugging Face tokenizers, decodes what it encodes, and keeps the special token whole.
TEST(BpeTrainCli, HuggingFaceLoadsTheFiles) {
  TempDir tmp;
  const auto r = test::run("tokenizer train --text " + kCorpus +
                           " --vocab-size 400 --special '<|endoftext|>' "
                           "--no-progress --out " +
                           tmp.path.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string script = tmp.path.string() + "/check.py";
  write_file_atomic(script, std::string(R"(
import sys
try:
    from tokenizers import Tokenizer
except ImportError:
    print("skip"); sys.exit(0)
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
text = open(sys.argv[2], encoding="utf-8").read()
ids = tok.encode(text).ids
assert tok.decode(ids) == text, "round trip"
assert tok.get_vocab_size() == 400, tok.get_vocab_size()
assert len(ids) < len(text.encode()) * 0.8, len(ids)
assert tok.encode("a<|endoftext|>b").ids == [ord("a"), 256, ord("b")], tok.encode("a<|endoftext|>b").ids
print("ok", len(ids))
)"));
  const std::string log = tmp.path.string() + "/check.log";
  const int code = std::system(
      (std::string(TESSERA_PYTHON) + " " + script + " " + tmp.path.string() + " " + kCorpus + " > " + log + " 2>&1")
          .c_str());
  const std::string said = read_file_text(log);
  if (said.rfind("skip", 0) == 0) GTEST_SKIP() << "tokenizers is not installed";
  EXPECT_EQ(code, 0) << said;
  EXPECT_EQ(said.rfind("ok", 0), 0u) << said;
}

}  // namespace
}  // namespace tessera
