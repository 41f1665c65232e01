// tessera translate end to end through the binary: make-task reverse -> prepare -> train --preset tiny ->
// translate held-out sources, greedy and with beam 4, to >= 99% exact match, the outputs in the input's order; and
// its bad input: one line, exit 2, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "tessera/core/file_io.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

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

void expect_error(const test::CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

class TranslateCli : public ::testing::Test {
 protected:
  void SetUp() override { d_ = test::temp_dir("translate_cli"); }
  void TearDown() override { fs::remove_all(d_); }
  std::string at(const std::string& name) const { return (d_ / name).string(); }
  fs::path d_;
};

// train --preset tiny with no other flag (its shape, init and the encoder-decoder run's defaults) learns reverse.
TEST_F(TranslateCli, TinyLearnsReverseGreedyAndBeam) {
  using test::run;
  ASSERT_EQ(run("make-task --task reverse --pairs 4000 --seed 1 --out " + at("train.tsv")).code, 0);
  ASSERT_EQ(run("prepare --pairs " + at("train.tsv") + " --out " + at("data")).code, 0);
  const test::CliRun t = run("train --preset tiny --data " + at("data") + " --out " + at("run") + " --no-progress");
  ASSERT_EQ(t.code, 0) << t.err;
  // Held out: pairs of another seed, none of them a training pair.
  ASSERT_EQ(run("make-task --task reverse --pairs 200 --seed 2 --out " + at("test.tsv")).code, 0);
  const std::vector<std::string> train = lines_of(read_file_text(at("train.tsv")));
  std::vector<std::string> src, want;
  for (const std::string& line : lines_of(read_file_text(at("test.tsv")))) {
    if (line.empty() || std::find(train.begin(), train.end(), line) != train.end()) continue;
    const size_t tab = line.find('\t');
    src.push_back(line.substr(0, tab));
    want.push_back(line.substr(tab + 1));
  }
  ASSERT_GE(src.size(), 150u);
  {
    std::ofstream f(at("src.txt"), std::ios::binary);
    for (const std::string& s : src) f << s << '\n';
  }
  for (const char* beams : {"1", "4"}) {
    const std::string out = at(std::string("out") + beams + ".txt");
    const test::CliRun r = run("translate --checkpoint " + at("run/checkpoint") + " --input " + at("src.txt") +
                               " --output " + out + " --beams " + beams + " --batch 32 --max-len-a 1 --max-len-b 2");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::vector<std::string> got = lines_of(read_file_text(out));
    ASSERT_EQ(got.size(), src.size());
    size_t exact = 0;
    for (size_t i = 0; i < src.size(); ++i) exact += got[i] == want[i];
    EXPECT_GE(100.0 * static_cast<double>(exact) / static_cast<double>(src.size()), 99.0)
        << "beams " << beams << ": " << exact << " of " << src.size() << " exact";
  }
}

// A briefly trained model: the outputs of a batched run, sorted by length, equal each source translated alone, in
// the input's order, greedy and with beams; generate points at translate; bad input is one line and exit 2.
TEST_F(TranslateCli, BatchedEqualsAloneInOrderAndBadInputIsOneLine) {
  using test::run;
  ASSERT_EQ(run("make-task --task reverse --pairs 300 --seed 1 --out " + at("train.tsv")).code, 0);
  ASSERT_EQ(run("prepare --pairs " + at("train.tsv") + " --out " + at("data")).code, 0);
  const test::CliRun t =
      run("train --preset tiny --data " + at("data") + " --out " + at("run") + " --steps 30 --no-progress");
  ASSERT_EQ(t.code, 0) << t.err;
  const std::vector<std::string> src{"a b c d e f g", "q", "x y z", "m n o p q r s t u v", "k l", "d c b a"};
  {
    std::ofstream f(at("src.txt"), std::ios::binary);
    for (const std::string& s : src) f << s << '\n';
  }
  const std::string ckpt = " --checkpoint " + at("run/checkpoint");
  for (const char* beams : {"1", "3"}) {
    const std::string flags = std::string(" --beams ") + beams + " --max-len-a 0 --max-len-b 9";
    const test::CliRun all = run("translate" + ckpt + " --input " + at("src.txt") + " --batch 4" + flags);
    ASSERT_EQ(all.code, 0) << all.err;
    const std::vector<std::string> got = lines_of(all.out);
    ASSERT_EQ(got.size(), src.size()) << all.out;
    for (size_t i = 0; i < src.size(); ++i) {
      {
        std::ofstream f(at("one.txt"), std::ios::binary);
        f << src[i] << '\n';
      }
      const test::CliRun one = run("translate" + ckpt + " --input " + at("one.txt") + flags);
      ASSERT_EQ(one.code, 0) << one.err;
      EXPECT_EQ(got[i] + "\n", one.out) << "beams " << beams << " source " << i;
    }
  }
  // generate on an encoder-decoder checkpoint points at translate.
  expect_error(run("generate --checkpoint " + at("run/checkpoint") + " --prompt ab"), "tessera translate");
  // Bad input: an empty line, a source past the positions, a missing file; nothing written.
  {
    std::ofstream f(at("bad.txt"), std::ios::binary);
    f << "abc\n\ndef\n";
  }
  expect_error(run("translate --checkpoint " + at("run/checkpoint") + " --input " + at("bad.txt") + " --output " +
                   at("bad_out.txt")),
               "line 2");
  {
    std::ofstream f(at("long.txt"), std::ios::binary);
    f << std::string(5000, 'a') << '\n';
  }
  expect_error(run("translate --checkpoint " + at("run/checkpoint") + " --input " + at("long.txt") + " --output " +
                   at("bad_out.txt")),
               "positions");
  expect_error(run("translate --checkpoint " + at("run/checkpoint") + " --input " + at("none.txt")), "none.txt");
  expect_error(run("translate --checkpoint " + at("data") + " --input " + at("src.txt")), "encoder-decoder");
  expect_error(run("translate --checkpoint " + at("run/checkpoint") + " --input " + at("src.txt") + " --beams 0"),
               "--beams");
  EXPECT_FALSE(fs::exists(at("bad_out.txt")));
}

}  // namespace
}  // namespace tessera
