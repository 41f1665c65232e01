// Paired shards (train/pair_data.h): the format round trip in both widths, the reader's checks, the text readers'
// bad input, and prepare_pair_shards' split, --max-positions and all-or-nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "tessera/core/file_io.h"
#include "tessera/train/data.h"
#include "tessera/train/pair_data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::names_in;
using test::temp_dir;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

LineEncoder byte_encoder() {
  return [](std::string_view line, std::vector<int32_t>& ids) {
    for (const unsigned char c : line) ids.push_back(c);
  };
}

PairTokens sample_pairs(int32_t hi) {
  PairTokens p;
  p.add(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{hi - 1});
  p.add(std::vector<int32_t>{0}, std::vector<int32_t>{5, 6});
  p.add(std::vector<int32_t>{7, hi - 1, 9, 10, 11}, std::vector<int32_t>{12, 13, 14});
  return p;
}

TEST(PairShard, RoundTripsInBothWidths) {
  const fs::path d = temp_dir("pair_shard");
  for (const int64_t vocab : {int64_t{256}, int64_t{70000}}) {
    const PairTokens p = sample_pairs(static_cast<int32_t>(vocab));
    const std::string path = (d / ("w" + std::to_string(vocab) + ".pairs")).string();
    write_pair_shard(path, p, vocab);
    const PairShard s(path);
    EXPECT_EQ(s.token_bytes(), vocab == 256 ? 2 : 4);
    EXPECT_EQ(s.vocab(), vocab);
    ASSERT_EQ(s.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const std::vector<int32_t> src(p.source.begin() + p.source_offsets[i],
                                     p.source.begin() + p.source_offsets[i + 1]);
      const std::vector<int32_t> tgt(p.target.begin() + p.target_offsets[i],
                                     p.target.begin() + p.target_offsets[i + 1]);
      EXPECT_EQ(s.source(i), src) << i;
      EXPECT_EQ(s.target(i), tgt) << i;
    }
  }
  fs::remove_all(d);
}

// Rewrites the int32 at byte `at` of a file.
void poke(const std::string& path, size_t at, int32_t v) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(reinterpret_cast<const char*>(&v), 4);
}

TEST(PairShard, RefusesBrokenFilesInOneLine) {
  const fs::path d = temp_dir("pair_shard_bad");
  const std::string good = (d / "good.pairs").string();
  write_pair_shard(good, sample_pairs(256), 256);
  const auto broken = [&](const std::function<void(const std::string&)>& edit) {
    const std::string p = (d / "bad.pairs").string();
    fs::copy_file(good, p, fs::copy_options::overwrite_existing);
    edit(p);
    return error_of([&] { PairShard s(p); });
  };
  EXPECT_NE(broken([](const std::string& p) { poke(p, 0, 20240520); }).find("this is a token shard"),
            std::string::npos);
  EXPECT_NE(broken([](const std::string& p) { poke(p, 4, 9); }).find("unsupported version 9"), std::string::npos);
  EXPECT_NE(broken([](const std::string& p) { fs::resize_file(p, fs::file_size(p) - 4); }).find("where its header"),
            std::string::npos);
  // source_offsets[2] (pair 1's end) set to pair 1's start: an empty source.
  EXPECT_NE(broken([](const std::string& p) { poke(p, 1024 + 2 * 4, 3); }).find("pair 1 has an empty source"),
            std::string::npos);
  // target_offsets[3], the end, past the count.
  EXPECT_NE(broken([](const std::string& p) { poke(p, 1024 + 7 * 4, 9); }).find("target offsets end at 9"),
            std::string::npos);
  EXPECT_NE(error_of([&] { PairShard s(good, 100); })
                .find("source token id 255 at position 5 is not below the "
                      "model's vocab 100"),
            std::string::npos);
  EXPECT_NE(error_of([&] { PairShard s((d / "none.pairs").string()); }).find("cannot read"), std::string::npos);
  EXPECT_NE(error_of([&] { open_pair_split(d.string(), "train"); }).find("prepare --source FILE --target FILE"),
            std::string::npos);
  fs::remove_all(d);
}

TEST(PairText, ReadersNameTheFileTheLineAndTheCounts) {
  const fs::path d = temp_dir("pair_text");
  write_text(d / "s.txt", "a b\r\nc d\nlast");
  write_text(d / "t.txt", "x\ny\nz\n");
  const PairLines ok = read_parallel_files((d / "s.txt").string(), (d / "t.txt").string());
  EXPECT_EQ(ok.source, (std::vector<std::string>{"a b", "c d", "last"}));
  EXPECT_EQ(ok.target, (std::vector<std::string>{"x", "y", "z"}));
  write_text(d / "t2.txt", "x\ny\n");
  EXPECT_NE(error_of([&] {
              read_parallel_files((d / "s.txt").string(), (d / "t2.txt").string());
            }).find("has 3 lines and target " + (d / "t2.txt").string() + " has 2"),
            std::string::npos);
  write_text(d / "t3.txt", "x\n\nz\n");
  EXPECT_NE(error_of([&] {
              read_parallel_files((d / "s.txt").string(), (d / "t3.txt").string());
            }).find("target " + (d / "t3.txt").string() + ": line 2 is empty"),
            std::string::npos);
  write_text(d / "p.tsv", "a\tb\nc\td\te\n");
  EXPECT_NE(error_of([&] { read_pairs_tsv((d / "p.tsv").string()); }).find("line 2 has 2 tabs"), std::string::npos);
  write_text(d / "p.tsv", "a\tb\ncd\n");
  EXPECT_NE(error_of([&] { read_pairs_tsv((d / "p.tsv").string()); }).find("line 2 has 0 tabs"), std::string::npos);
  write_text(d / "p.tsv", "a\tb\n\tz\n");
  EXPECT_NE(error_of([&] { read_pairs_tsv((d / "p.tsv").string()); }).find("line 2 has an empty source"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_pairs_tsv((d / "missing.tsv").string()); }).find("does not exist"), std::string::npos);
  fs::remove_all(d);
}

TEST(PairPrepare, SplitsEvenlyAndRoundTripsTheBytes) {
  const fs::path d = temp_dir("pair_prepare");
  PairLines lines{.source_name = "source s", .target_name = "target t"};
  for (int i = 0; i < 20; ++i) {
    lines.source.push_back("src " + std::to_string(i));
    lines.target.push_back("tgt " + std::to_string(i * 7));
  }
  const std::string out = (d / "pairs").string();
  const PairPrepareReport r = prepare_pair_shards(lines, byte_encoder(), out, {.val_fraction = 0.1});
  EXPECT_EQ(r.n_train, 18u);
  EXPECT_EQ(r.n_val, 2u);
  EXPECT_EQ(names_in(out), (std::vector<std::string>{"train_000000.pairs", "val_000000.pairs"}));
  const PairShard train = open_pair_split(out, "train"), val = open_pair_split(out, "val");
  // Pairs 9 and 19 (⌊(i+1)·0.1⌋ > ⌊i·0.1⌋) are val; the rest train, in order.
  const auto text = [](const std::vector<int32_t>& ids) { return std::string(ids.begin(), ids.end()); };
  EXPECT_EQ(text(val.source(0)), "src 9");
  EXPECT_EQ(text(val.target(1)), "tgt 133");
  EXPECT_EQ(text(train.source(9)), "src 10");
  EXPECT_EQ(text(train.target(17)), "tgt 126");
  fs::remove_all(d);
}

TEST(PairPrepare, MaxPositionsAndFewPairsWriteNothing) {
  const fs::path d = temp_dir("pair_prepare_bad");
  PairLines lines{.source = {"abc", "abcdefgh", "ab"},
                  .target = {"x", "y", "zzzzzzz"},
                  .source_name = "source s.txt",
                  .target_name = "target t.txt"};
  const std::string out = (d / "new" / "pairs").string();
  EXPECT_EQ(error_of([&] { prepare_pair_shards(lines, byte_encoder(), out, {.max_positions = 7}); }),
            "source s.txt: line 2 is 8 tokens long, more than --max-positions 7");
  lines.source[1] = "abc";
  EXPECT_EQ(error_of([&] { prepare_pair_shards(lines, byte_encoder(), out, {.max_positions = 7}); }),
            "target t.txt: line 3 is 7 tokens long; with the decoder's start token that is 8, more than "
            "--max-positions 7");
  const PairLines one{.source = {"a"}, .target = {"b"}, .source_name = "pairs p.tsv", .target_name = "pairs p.tsv"};
  EXPECT_NE(error_of([&] { prepare_pair_shards(one, byte_encoder(), out, {}); }).find("at least 2 are needed"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d / "new"));
  // Token shards in the directory: refused, untouched.
  fs::create_directories(d / "lm");
  write_shard((d / "lm" / "train_000000.bin").string(), {1, 2, 3});
  EXPECT_NE(error_of([&] { prepare_pair_shards(lines, byte_encoder(), (d / "lm").string(), {}); }).find("holds token"),
            std::string::npos);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
