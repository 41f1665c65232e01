#include <cstdlib>
#include <filesystem>

#include "tessera/core/error.h"
#include "tessera/train/data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::temp_dir;

// Shards written by an independent Python script (tests/tools/write_shards.py).
TEST(Shards, ReadsFilesWrittenIndependently) {
  const fs::path d = temp_dir("shards");
  const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR + "/tests/tools/write_shards.py --out " +
                          d.string() + " --count 1001 --modulus 256";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto tokens = read_shard((d / "good_train_000000.bin").string(), 256);
  ASSERT_EQ(tokens.size(), 1001u);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(tokens[i], (i * 7919 + 13) % 256) << i;

  EXPECT_NE(error_of([&] { read_shard((d / "bad_magic.bin").string()); }).find("bad magic 20240521"), std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "bad_version.bin").string()); }).find("unsupported version 7"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "truncated.bin").string()); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "short_header.bin").string()); }).find("truncated header"), std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "big_token.bin").string(), 256); }).find("token id 300"), std::string::npos);
  EXPECT_NO_THROW(read_shard((d / "big_token.bin").string(), 301));
  EXPECT_NE(error_of([&] { read_shard((d / "missing.bin").string()); }).find("cannot read"), std::string::npos);
  fs::remove_all(d);
}

TEST(Shards, WriteReadRoundTripAndStream) {
  const fs::path d = temp_dir("stream");
  std::vector<uint16_t> t(100);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i);
  write_shard((d / "x_train_000000.bin").string(), t);
  EXPECT_EQ(read_shard((d / "x_train_000000.bin").string()), t);
  EXPECT_EQ(fs::file_size(d / "x_train_000000.bin"), 1024u + 200u);

  TokenStream s(find_shards(d.string(), "train"), 256);
  std::vector<int32_t> x(2 * 10), y(20);
  s.next_batch(2, 10, x.data(), y.data());
  EXPECT_EQ(x[0], 0);
  EXPECT_EQ(y[19], 20);
  EXPECT_EQ(s.position(), 20u);
  for (int i = 0; i < 3; ++i) s.next_batch(2, 10, x.data(), y.data());
  EXPECT_EQ(s.position(), 80u);
  s.next_batch(2, 10, x.data(), y.data());  // 80 + 21 > 100: wraps to the start
  EXPECT_EQ(x[0], 0);
  EXPECT_THROW(s.next_batch(10, 10, x.data(), y.data()), Error);  // needs 101 tokens
  EXPECT_THROW(find_shards(d.string(), "val"), Error);
  fs::remove_all(d);
}

TEST(Shards, PrepareSplitsText) {
  const fs::path d = temp_dir("prepare");
  const auto [n_train, n_val] = prepare_text("hello world, hello tessera", d.string(), 0.2);
  EXPECT_EQ(n_train + n_val, 26u);
  EXPECT_EQ(n_val, 5u);
  const auto val = read_shard((d / "val_000000.bin").string());
  EXPECT_EQ(byte_decode(std::vector<int32_t>(val.begin(), val.end())), "ssera");
  // A longer text: every 10th KiB block is val.
  std::string text;
  for (int i = 0; i < 25 * 1024; ++i) text.push_back(static_cast<char>('a' + (i / 1024) % 26));
  const auto [tr, va] = prepare_text(text, d.string(), 0.1);
  EXPECT_EQ(va, 2u * 1024u);  // blocks 9 and 19
  const auto v = read_shard((d / "val_000000.bin").string());
  EXPECT_EQ(v.front(), 'a' + 9);
  EXPECT_EQ(v.back(), 'a' + 19);
  EXPECT_EQ(tr, 23u * 1024u);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
