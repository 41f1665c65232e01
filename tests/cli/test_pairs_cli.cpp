// make-task and prepare --source/--target/--pairs through the binary: the same seed gives the same file, the round
// trip make-task -> prepare -> PairShard gives back each line's tokens (bytes, and through a BPE tokenizer), and each
// bad input is one line, exit code 2, and nothing written.
#include <gtest/gtest.h>

#include <fstream>

#include "cli/cli_run.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/text_codec.h"
#include "tessera/train/pair_data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::run;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

void expect_error(const test::CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

class PairsCli : public ::testing::Test {
 protected:
  void SetUp() override { d_ = test::temp_dir("pairs_cli"); }
  void TearDown() override { fs::remove_all(d_); }
  std::string at(const std::string& name) const { return (d_ / name).string(); }
  fs::path d_;
};

TEST_F(PairsCli, MakeTaskIsDeterministicAndEachTaskLooksRight) {
  const test::CliRun a = run("make-task --task reverse --pairs 300 --seed 7 --out " + at("a.tsv"));
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, "wrote 300 pairs of reverse to " + at("a.tsv") + "\n");
  ASSERT_EQ(run("make-task --task reverse --pairs 300 --seed 7 --out " + at("b.tsv")).code, 0);
  ASSERT_EQ(run("make-task --task reverse --pairs 300 --seed 8 --out " + at("c.tsv")).code, 0);
  const std::string text = read_file_text(at("a.tsv"));
  EXPECT_EQ(text, read_file_text(at("b.tsv")));
  EXPECT_NE(text, read_file_text(at("c.tsv")));
  const std::vector<std::string> lines = lines_of(text);
  ASSERT_EQ(lines.size(), 300u);
  for (const std::string& line : lines) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    std::string src = line.substr(0, tab);
    std::reverse(src.begin(), src.end());  // single letters with single spaces: reversing the text reverses them
    EXPECT_EQ(src, line.substr(tab + 1)) << line;
  }
  ASSERT_EQ(run("make-task --task digits-to-words --pairs 50 --min-len 3 --max-len 3 --out " + at("d.tsv")).code, 0);
  for (const std::string& line : lines_of(read_file_text(at("d.tsv")))) {
    ASSERT_EQ(line.find('\t'), 3u) << line;
    EXPECT_NE(line.find(" hundred"), std::string::npos) << line;
  }
}

TEST_F(PairsCli, MakeTaskBadInputIsOneLineAndWritesNothing) {
  expect_error(run("make-task --task rev --pairs 3 --out " + at("x.tsv")), "unknown task 'rev'");
  expect_error(run("make-task --task copy --pairs 0 --out " + at("x.tsv")), "--pairs must be in [1, ");
  expect_error(run("make-task --task copy --pairs 3 --min-len 0 --out " + at("x.tsv")), "--min-len must be at least 1");
  expect_error(run("make-task --task copy --pairs 3 --min-len 5 --max-len 4 --out " + at("x.tsv")),
               "--min-len 5 is more than --max-len 4");
  expect_error(run("make-task --task digits-to-words --pairs 3 --max-len 19 --out " + at("x.tsv")), "at most 18");
  expect_error(run("make-task --task copy --pairs 3 --out " + at("no/such/x.tsv")), "does not exist");
  expect_error(run("make-task --pairs 3 --out " + at("x.tsv")), "--task NAME is required");
  EXPECT_FALSE(fs::exists(at("x.tsv")));
}

TEST_F(PairsCli, MakeTaskPrepareReaderRoundTripOfBytes) {
  ASSERT_EQ(run("make-task --task digits-to-words --pairs 40 --seed 2 --out " + at("d.tsv")).code, 0);
  const test::CliRun p = run("prepare --pairs " + at("d.tsv") + " --out " + at("data"));
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("wrote 36 train and 4 val pairs to " + at("data")), std::string::npos) << p.out;
  EXPECT_EQ(test::names_in(d_ / "data"), (std::vector<std::string>{"train_000000.pairs", "val_000000.pairs"}));
  const PairShard train = open_pair_split(at("data"), "train"), val = open_pair_split(at("data"), "val");
  ASSERT_EQ(train.size() + val.size(), 40u);
  const std::vector<std::string> lines = lines_of(read_file_text(at("d.tsv")));
  size_t t = 0, v = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool is_val = (i + 1) % 10 == 0;  // --val-fraction 0.1: pairs 9, 19, 29, 39
    const PairShard& s = is_val ? val : train;
    const size_t k = is_val ? v++ : t++;
    const std::vector<int32_t> src = s.source(k), tgt = s.target(k);
    EXPECT_EQ(std::string(src.begin(), src.end()) + "\t" + std::string(tgt.begin(), tgt.end()), lines[i]) << i;
  }
}

TEST_F(PairsCli, SourceAndTargetThroughATokenizerRoundTrip) {
  const std::string corpus = read_file_text(std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt");
  write_text(d_ / "slice.txt", corpus.substr(0, 6000));
  ASSERT_EQ(run("tokenizer train --text " + at("slice.txt") + " --vocab-size 300 --threads 1 --no-progress --out " +
                at("tok"))
                .code,
            0);
  // Sentences of the corpus, and a shuffled copy of each as its "translation".
  std::string src, tgt;
  std::vector<std::string> sources, targets;
  for (const std::string& line : lines_of(corpus.substr(0, 4000))) {
    if (line.empty()) continue;
    sources.push_back(line);
    targets.push_back(std::string(line.rbegin(), line.rend()));
    src += sources.back() + "\n";
    tgt += targets.back() + "\n";
  }
  write_text(d_ / "s.txt", src);
  write_text(d_ / "t.txt", tgt);
  const test::CliRun p = run("prepare --source " + at("s.txt") + " --target " + at("t.txt") + " --tokenizer " +
                             at("tok") + " --val-fraction 0.5 --out " + at("data"));
  ASSERT_EQ(p.code, 0) << p.err;
  ASSERT_TRUE(fs::exists(d_ / "data" / "tokenizer.json"));
  const TextCodec codec = TextCodec::for_checkpoint(at("data"), 300);
  ASSERT_FALSE(codec.byte_level());
  const PairShard train = open_pair_split(at("data"), "train", 300), val = open_pair_split(at("data"), "val", 300);
  ASSERT_EQ(train.size() + val.size(), sources.size());
  for (size_t i = 0, t = 0, v = 0; i < sources.size(); ++i) {
    const bool is_val = (i + 1) % 2 == 0;
    const PairShard& s = is_val ? val : train;
    const size_t k = is_val ? v++ : t++;
    EXPECT_EQ(s.source(k), codec.encode(sources[i])) << i;
    EXPECT_EQ(codec.decode(s.source(k)), sources[i]) << i;
    EXPECT_EQ(codec.decode(s.target(k)), targets[i]) << i;
  }
  size_t tokens = 0, bytes = 0;
  for (size_t i = 0; i < train.size(); ++i) tokens += train.source_len(i);
  for (size_t i = 0; i < sources.size(); i += 2) bytes += sources[i].size();
  EXPECT_LT(tokens, bytes);  // the merges took: fewer tokens than bytes
  // A byte-level prepare into the same directory removes the tokenizer.json: its ids are bytes now.
  ASSERT_EQ(run("prepare --source " + at("s.txt") + " --target " + at("t.txt") + " --out " + at("data")).code, 0);
  EXPECT_FALSE(fs::exists(d_ / "data" / "tokenizer.json"));
}

TEST_F(PairsCli, EachBadInputIsOneLineAndWritesNothing) {
  write_text(d_ / "s.txt", "a b\nc d\ne f\n");
  write_text(d_ / "t2.txt", "x\ny\n");
  write_text(d_ / "t3.txt", "x\n\nz\n");
  write_text(d_ / "t.txt", "x\ny\nabcdefghij\n");
  write_text(d_ / "tabs.tsv", "a\tb\nc\td\te\n");
  write_text(d_ / "notab.tsv", "a\tb\ncd\n");
  const std::string out = " --out " + at("data");
  expect_error(run("prepare --source " + at("s.txt") + " --target " + at("t2.txt") + out),
               "source " + at("s.txt") + " has 3 lines and target " + at("t2.txt") + " has 2");
  expect_error(run("prepare --source " + at("s.txt") + " --target " + at("t3.txt") + out),
               "target " + at("t3.txt") + ": line 2 is empty");
  expect_error(run("prepare --pairs " + at("tabs.tsv") + out), "pairs " + at("tabs.tsv") + ": line 2 has 2 tabs");
  expect_error(run("prepare --pairs " + at("notab.tsv") + out), "pairs " + at("notab.tsv") + ": line 2 has 0 tabs");
  expect_error(run("prepare --source " + at("s.txt") + " --target " + at("t.txt") + " --max-positions 8" + out),
               "target " + at("t.txt") +
                   ": line 3 is 10 tokens long; with the decoder's start token that is 11, "
                   "more than --max-positions 8");
  expect_error(run("prepare --source " + at("missing.txt") + " --target " + at("t.txt") + out),
               "source " + at("missing.txt") + " does not exist");
  expect_error(run("prepare --source " + at("s.txt") + out), "--source needs --target FILE");
  expect_error(run("prepare --pairs " + at("tabs.tsv") + " --source " + at("s.txt") + out), "not both");
  expect_error(run("prepare --text " + at("s.txt") + " --max-positions 8" + out), "--max-positions is for paired");
  EXPECT_FALSE(fs::exists(d_ / "data"));
}

}  // namespace
}  // namespace tessera
