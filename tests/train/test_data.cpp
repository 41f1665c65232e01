#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/signals.h"
#include "tessera/train/data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::names_in;
using test::temp_dir;

// Shards written by an independent Python script (tests/tools/write_shards.py).
TEST(Shards, ReadsFilesWrittenIndependently) {
  const fs::path d = temp_dir("shards");
  const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR +
                          "/tests/tools/write_shards.py --out " + d.string() + " --count 1001 --modulus 256";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto tokens = read_shard((d / "good_train_000000.bin").string(), 256);
  ASSERT_EQ(tokens.size(), 1001u);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(tokens[i], (i * 7919 + 13) % 256) << i;

  EXPECT_NE(error_of([&] { read_shard((d / "bad_magic.bin").string()); }).find("bad magic 20240521"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "bad_version.bin").string()); }).find("unsupported version 7"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "truncated.bin").string()); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { read_shard((d / "short_header.bin").string()); }).find("truncated header"),
            std::string::npos);
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

// A run's directory given as data (a new user's `train --data RUN`): its shards are in RUN/data, and the message
// says so; a directory with neither says only what is missing.
TEST(Shards, ARunDirectoryGivenAsDataNamesItsDataDirectory) {
  const fs::path d = temp_dir("run_as_data");
  fs::create_directories(d / "data");
  write_shard((d / "data" / "train_000000.bin").string(), std::vector<uint16_t>(100, 1));
  const std::string e = error_of([&] { find_shards(d.string(), "train"); });
  EXPECT_NE(e.find("no train shards (train_*.bin) in " + d.string() + "; " + (d / "data").string() + " holds them"),
            std::string::npos)
      << e;
  const std::string v = error_of([&] { find_shards(d.string(), "val"); });
  EXPECT_EQ(v.find("holds them"), std::string::npos) << "RUN/data has no val shards: " << v;
  fs::remove_all(d);
}

// The split is a whole word of the shard's name: "interval" is not "val".
TEST(Shards, FindShardsMatchesTheSplitNotASubstring) {
  const fs::path d = temp_dir("find");
  for (const char* name : {"train_000000.bin", "val_000000.bin", "interval_000.bin", "retrain_000.bin",
                           "fineweb_val_000001.bin", "tiny_shakespeare_train.bin", "val_notes.txt"})
    write_shard((d / name).string(), {1, 2, 3});
  auto names = [](const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const auto& p : paths) out.push_back(fs::path(p).filename().string());
    return out;
  };
  EXPECT_EQ(names(find_shards(d.string(), "val")),
            (std::vector<std::string>{"fineweb_val_000001.bin", "val_000000.bin"}));
  EXPECT_EQ(names(find_shards(d.string(), "train")),
            (std::vector<std::string>{"tiny_shakespeare_train.bin", "train_000000.bin"}));
  fs::remove_all(d);
}

// An entry named as a shard that is not a regular file was skipped: the run trained on fewer shards without a word,
// and a dangling symlink that was the only shard read as "no train shards". A symlink to a shard is one.
TEST(Shards, AnEntryNamedAsAShardThatIsNoFileIsRefusedByName) {
  const fs::path d = temp_dir("find_odd");
  write_shard((d / "train_000000.bin").string(), {1, 2, 3});
  fs::create_symlink("train_000000.bin", d / "train_000002.bin");
  EXPECT_EQ(find_shards(d.string(), "train").size(), 2u);
  fs::create_symlink("nowhere.bin", d / "train_000001.bin");
  EXPECT_NE(error_of([&] { find_shards(d.string(), "train"); })
                .find("data: " + (d / "train_000001.bin").string() +
                      " is named as a train shard but is a symlink "
                      "to nothing: remove it, or point it at a shard"),
            std::string::npos);
  fs::remove(d / "train_000001.bin");
  fs::create_directory(d / "val_000000.bin");
  EXPECT_NE(error_of([&] { list_shards(d.string(), "val"); }).find("is named as a val shard but is a directory"),
            std::string::npos);
  fs::remove(d / "val_000000.bin");
  ASSERT_EQ(::mkfifo((d / "val_000001.bin").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { list_shards(d.string(), "val"); }).find("is named as a val shard but is not a regular file"),
            std::string::npos);
  fs::remove(d / "val_000001.bin");
  EXPECT_EQ(list_shards(d.string(), "val"), std::vector<std::string>{});  // none: empty, where find_shards refuses
  EXPECT_THROW(find_shards(d.string(), "val"), Error);
  fs::remove_all(d);
}

// What prepare replaces or removes must be a shard: a text named train_notes.bin in --out, even the text being
// prepared, was removed as an earlier shard.
TEST(Shards, PrepareRefusesToRemoveAFileNamedAsAShardThatIsNotOne) {
  const fs::path d = temp_dir("prepare_not_shard");
  fs::create_directories(d);
  const std::string text = "hello world, hello tessera";
  for (const char* name : {"train_notes.bin", "train_000000.bin"}) {
    write_file_atomic((d / name).string(), text);
    EXPECT_NE(error_of([&] {
                prepare_text(text, d.string(), 0.2);
              }).find("prepare: " + d.string() + " holds " + name + ", which is named as a shard but is not one"),
              std::string::npos)
        << name;
    EXPECT_EQ(read_file_text((d / name).string()), text) << name;
    EXPECT_EQ(names_in(d), std::vector<std::string>{name});
    fs::remove(d / name);
  }
  prepare_text(text, d.string(), 0.2);
  write_shard((d / "train_000001.bin").string(), {1, 2, 3});  // a shard: removed with the next prepare
  prepare_text(text, d.string(), 0.2);
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
  fs::remove_all(d);
}

// Shards of 37, 0, 50 and 13 tokens read as one stream: every batch, including those that span a shard
// boundary (and the empty shard), equals the same batch cut from the concatenation, with the same wrap.
TEST(Shards, StreamReadsAcrossShardBoundaries) {
  const fs::path d = temp_dir("multi");
  std::mt19937_64 rng(test::test_seed());
  std::uniform_int_distribution<int> tok(0, 99);
  std::vector<uint16_t> all;
  std::vector<std::string> paths;
  int i = 0;
  for (size_t n : {37, 0, 50, 13}) {
    std::vector<uint16_t> t(n);
    for (auto& x : t) x = static_cast<uint16_t>(tok(rng));
    all.insert(all.end(), t.begin(), t.end());
    paths.push_back((d / ("train_00000" + std::to_string(i++) + ".bin")).string());
    write_shard(paths.back(), t);
  }
  TokenStream s(find_shards(d.string(), "train"), 100);
  ASSERT_EQ(s.size(), all.size());
  const int B = 2, T = 7;  // 15 tokens a batch: batches start at 0, 14, 28 (spans 37), 42, ..., 84 (spans 87)
  std::vector<int32_t> x(B * T), y(B * T);
  uint64_t pos = 0;
  int crossed = 0;
  for (int b = 0; b < 20; ++b) {
    if (pos + B * T + 1 > all.size()) pos = 0;
    s.next_batch(B, T, x.data(), y.data());
    for (int k = 0; k < B * T; ++k) {
      ASSERT_EQ(x[k], all[pos + k]) << "batch " << b << " token " << k;
      ASSERT_EQ(y[k], all[pos + k + 1]) << "batch " << b << " token " << k;
    }
    crossed += (pos < 37 && pos + B * T >= 37) + (pos < 87 && pos + B * T >= 87);
    pos += B * T;
    ASSERT_EQ(s.position(), pos);
  }
  EXPECT_GE(crossed, 4);
  // Resuming right before a boundary reads across it.
  s.set_position(86);
  s.next_batch(1, 3, x.data(), y.data());
  EXPECT_EQ((std::vector<int32_t>(x.begin(), x.begin() + 3)), (std::vector<int32_t>{all[86], all[87], all[88]}));
  EXPECT_EQ(y[2], all[89]);
  EXPECT_THROW(s.set_position(all.size() + 1), Error);
  fs::remove_all(d);
}

// is_shard_file: a shard by its magic; a short or foreign file is not one; a file whose read fails is an error, not
// "no shard header" (/proc/self/mem is a regular file whose read at offset 0 fails with EIO).
TEST(Shards, IsShardFileReadsTheMagicAndReportsAFailedRead) {
  const fs::path d = temp_dir("isshard");
  const std::string shard = (d / "train_000000.bin").string(), text = (d / "text.txt").string();
  write_shard(shard, {1, 2});
  write_file_atomic(text, std::string("hi"));
  EXPECT_TRUE(is_shard_file(shard));
  EXPECT_FALSE(is_shard_file(text));
  EXPECT_FALSE(is_shard_file(d.string()));
  EXPECT_NE(error_of([] { (void)is_shard_file("/proc/self/mem"); }).find("cannot read /proc/self/mem"),
            std::string::npos);
  fs::remove_all(d);
}

// A bad shard anywhere in the stream is a one-line error naming that file, found when the stream opens.
TEST(Shards, StreamRejectsBadShardsWhenItOpens) {
  const fs::path d = temp_dir("badstream");
  const std::string good = (d / "train_000000.bin").string(), bad = (d / "train_000001.bin").string();
  write_shard(good, {1, 2, 3, 4});
  auto one_line = [](const std::string& msg) { return !msg.empty() && msg.find('\n') == std::string::npos; };
  // A token id beyond the vocab in the second shard.
  write_shard(bad, {5, 6, 300, 7});
  std::string msg = error_of([&] { TokenStream({good, bad}, 256); });
  EXPECT_TRUE(one_line(msg)) << msg;
  EXPECT_NE(msg.find(bad + ": token id 300 at position 2"), std::string::npos) << msg;
  EXPECT_NO_THROW(TokenStream({good, bad}, 301));
  // Truncated: the header promises more tokens than the file holds.
  const auto bytes = read_file_bytes(bad);
  write_file_atomic(bad, bytes.data(), bytes.size() - 3);
  msg = error_of([&] { TokenStream({good, bad}, 256); });
  EXPECT_TRUE(one_line(msg)) << msg;
  EXPECT_NE(msg.find(bad + ": truncated (header says 4 tokens, file holds 2)"), std::string::npos) << msg;
  // One token, said in the singular (it said "1 tokens"), and a stream too short for one batch.
  write_shard(bad, {9});
  std::vector<uint8_t> longer = read_file_bytes(bad);
  longer.push_back(0);
  write_file_atomic(bad, longer.data(), longer.size());
  EXPECT_NE(error_of([&] { TokenStream({bad}, 256); }).find(bad + ": 1 byte beyond the 1 token its header declares"),
            std::string::npos);
  write_shard(bad, {9});
  TokenStream one({bad}, 256);
  std::vector<int32_t> in(2), tg(2);
  EXPECT_NE(error_of([&] { one.next_batch(1, 2, in.data(), tg.data()); })
                .find("holds 1 token, fewer than batch x "
                      "seq + 1 = 3"),
            std::string::npos);
  // Empty, missing, and a directory.
  write_file_atomic(bad, std::string());
  EXPECT_NE(error_of([&] {
              TokenStream({good, bad}, 256);
            }).find("truncated header (0 of 1024 bytes)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TokenStream({good, (d / "nope.bin").string()}, 256);
            }).find("shard: cannot read"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TokenStream({good, d.string()}, 256); }).find("is a directory"), std::string::npos);
  fs::remove_all(d);
}

// An id that is no byte was masked to its low byte: 50256 printed as 'P', text that the model never wrote.
TEST(Shards, ByteDecodeWritesIdsThatAreNoBytesVisibly) {
  EXPECT_EQ(byte_decode({72, 105, 0, 255}), std::string("Hi\0\xff", 4));
  EXPECT_EQ(byte_decode({72, 256, 105, 50256, 10, -1}), "H<id 256>i<id 50256>\n<id -1>");
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

// The split held out every round(1/f)-th block, at least every 2nd: on the bundled corpus f = 0.1 gave 7.4% val,
// 0.4 gave 33% and 0.6 and 0.9 both 48%. Now the val share is f to within one block, and f = 0.1 keeps its blocks
// (9, 19, ...: README's quick start prepares the bundled corpus with it and publishes the losses that follow).
TEST(Shards, PrepareHoldsOutTheFractionAskedToWithinOneBlock) {
  const fs::path d = temp_dir("prepare_fraction");
  const std::string text = read_file_text(std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt");
  ASSERT_EQ(text.size(), 27799u);
  for (double f : {0.05, 0.1, 0.2, 0.25, 1.0 / 3, 0.4, 0.5, 0.6, 2.0 / 3, 0.75, 0.9, 0.95}) {
    const auto [tr, va] = prepare_text(text, d.string(), f);
    EXPECT_EQ(tr + va, text.size());
    EXPECT_LE(std::abs(static_cast<double>(va) - f * static_cast<double>(text.size())), 1024.0)
        << "f " << f << ": " << va << " val tokens of " << text.size();
    // Val is the blocks the rule picks, in order, so the split is the same on every run.
    std::string want;
    for (size_t b = 0; b * 1024 < text.size(); ++b)
      if (std::floor((b + 1) * f + 1e-9) > std::floor(b * f + 1e-9)) want += text.substr(b * 1024, 1024);
    const auto v = read_shard((d / "val_000000.bin").string());
    EXPECT_EQ(std::string(v.begin(), v.end()), want) << "f " << f;
  }
  EXPECT_EQ(prepare_text(text, d.string(), 0.1), std::make_pair(size_t{25751}, size_t{2048}));  // as README shows
  fs::remove_all(d);
}

// A prepare that fails or is stopped part way takes back what it did: its temporary shards, and the directories
// it made (the ones asked for, and the parents made on the way); a directory that was there keeps its shards.
TEST(Shards, PrepareThatFailsOrIsStoppedUndoesItself) {
  const fs::path d = temp_dir("prepare_undo");
  std::string text;
  for (int i = 0; i < 40 * 1024; ++i) text.push_back(static_cast<char>('a' + i % 26));
  // Stopped (a signal's number in the flag): nothing made, PrepareInterrupted carries the signal.
  const volatile std::sig_atomic_t stop = SIGTERM;
  try {
    prepare_shards(text, (d / "new" / "sub").string(), {.val_fraction = 0.1, .stop = &stop});
    ADD_FAILURE() << "not stopped";
  } catch (const PrepareInterrupted& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
  }
  EXPECT_EQ(names_in(d), std::vector<std::string>{});
  // A directory with the previous shards: stopped, and failing to write the val shard (a directory in the way of
  // its temporary file), it keeps them as they were and holds no temporary file.
  const fs::path out = d / "out";
  prepare_text("hello world, hello tessera", out.string(), 0.2);
  const std::vector<std::string> before = names_in(out);
  EXPECT_THROW(prepare_shards(text, out.string(), {.val_fraction = 0.1, .stop = &stop}), PrepareInterrupted);
  EXPECT_EQ(names_in(out), before);
  const fs::path blocker = out / (".val_000000.bin.tmp." + std::to_string(::getpid()));
  fs::create_directory(blocker);
  const std::string err = error_of([&] { prepare_text(text, out.string(), 0.1); });
  EXPECT_NE(err.find("cannot write " + (out / "val_000000.bin").string()), std::string::npos) << err;
  fs::remove(blocker);
  EXPECT_EQ(names_in(out), before);
  EXPECT_EQ(read_shard((out / "val_000000.bin").string()).size(), 5u);
  // And one that finishes leaves the two shards and nothing else.
  EXPECT_EQ(prepare_text(text, out.string(), 0.1), std::make_pair(size_t{36 * 1024}, size_t{4 * 1024}));
  EXPECT_EQ(names_in(out), before);
  fs::remove_all(d);
}

// A val shard that cannot go into place (a directory in the way of its name) after the train shard did: the earlier
// train shard is put back, so that the new train shard never stands beside the old val; with no earlier train
// shard, the new one goes. Nothing hidden is left either way.
TEST(Shards, PrepareWhoseValShardCannotGoInPlaceKeepsTheEarlierTrainShard) {
  const fs::path d = temp_dir("prepare_second_rename");
  std::string text;
  for (int i = 0; i < 40 * 1024; ++i) text.push_back(static_cast<char>('a' + i % 26));
  const fs::path out = d / "out";
  prepare_text("hello world, hello tessera", out.string(), 0.2);
  const auto earlier = read_shard((out / "train_000000.bin").string());
  const std::vector<std::string> names = {"train_000000.bin", "val_000000.bin"};
  // The train shard's own rename failing (its temporary file gone by then): both earlier shards stay.
  PrepareParams params{.val_fraction = 0.1};
  params.before_renames = [&] { fs::remove(out / (".train_000000.bin.tmp." + std::to_string(::getpid()))); };
  std::string err = error_of([&] { prepare_shards(text, out.string(), params); });
  EXPECT_NE(err.find("cannot write " + (out / "train_000000.bin").string()), std::string::npos) << err;
  EXPECT_EQ(names_in(out), names);
  EXPECT_EQ(read_shard((out / "train_000000.bin").string()), earlier);
  EXPECT_EQ(read_shard((out / "val_000000.bin").string()).size(), 5u);
  // The val shard's failing after the train shard's went (a directory in the way of its name).
  fs::remove(out / "val_000000.bin");
  fs::create_directories(out / "val_000000.bin" / "x");
  ASSERT_EQ(names_in(out), names);
  err = error_of([&] { prepare_text(text, out.string(), 0.1); });
  EXPECT_NE(err.find("cannot write " + (out / "val_000000.bin").string()), std::string::npos) << err;
  EXPECT_EQ(names_in(out), names);
  EXPECT_EQ(read_shard((out / "train_000000.bin").string()), earlier);
  fs::remove(out / "train_000000.bin");
  EXPECT_NE(error_of([&] { prepare_text(text, out.string(), 0.1); }).find("cannot write"), std::string::npos);
  EXPECT_EQ(names_in(out), std::vector<std::string>{"val_000000.bin"});
  fs::remove_all(d);
}

// A prepare killed outright (SIGKILL) leaves its hidden working files; the next prepare into that directory removes
// those whose process is gone (train --text refused an OUT/data holding one), and leaves a live process's alone.
TEST(Shards, PrepareRemovesTheHiddenFilesOfAKilledPrepare) {
  const fs::path d = temp_dir("prepare_leftovers");
  const std::vector<std::string> dead = {".train_000000.bin.tmp.2147483646", ".val_000000.bin.tmp.99999999",
                                         ".train_000000.bin.old.2147483646"};
  const std::string live = ".val_000000.bin.tmp.1";  // pid 1 runs as long as the machine does
  for (const std::string& name : dead) EXPECT_TRUE(is_prepare_leftover(name)) << name;
  EXPECT_TRUE(is_prepare_leftover(live));
  for (const char* name : {"train_000000.bin", ".train_000000.bin.tmp.", ".train_000000.bin.tmp.12x",
                           ".val_000000.bin.old.5", "x.train_000000.bin.tmp.5", ".train_000000.bin.tmp.12345678901"})
    EXPECT_FALSE(is_prepare_leftover(name)) << name;
  fs::create_directories(d);
  for (const std::string& name : dead) write_file_atomic((d / name).string(), std::string("old"));
  write_file_atomic((d / live).string(), std::string("in use"));
  write_file_atomic((d / ".train_000000.bin.tmp.12x").string(), std::string("not prepare's"));
  prepare_text("hello world, hello tessera", d.string(), 0.2);
  EXPECT_EQ(names_in(d),
            (std::vector<std::string>{".train_000000.bin.tmp.12x", live, "train_000000.bin", "val_000000.bin"}));
  fs::remove_all(d);
}

// A signal that comes while the shards are renamed into place is held off until they are, then reported in
// PrepareReport::stopped: the shards are whole, and the caller stops as the signal asked (tessera prepare exits
// 128 + it). Before, prepare's handler recorded it after the renames and nobody looked: prepare exited 0.
TEST(Shards, ASignalDuringTheRenamesIsHeldOffThenReported) {
  const fs::path d = temp_dir("prepare_held_signal");
  std::string text;
  for (int i = 0; i < 40 * 1024; ++i) text.push_back(static_cast<char>('a' + i % 26));
  SignalFlag stop = 0;
  PrepareReport r;
  {
    const ScopedSignals signals({SIGTERM}, &stop);
    PrepareParams params{.val_fraction = 0.1, .stop = &stop};
    params.before_renames = [&] {
      ::raise(SIGTERM);
      EXPECT_EQ(stop, 0) << "delivered before the renames";
    };
    r = prepare_shards(text, d.string(), params);
  }
  EXPECT_EQ(r.stopped, SIGTERM);
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
  EXPECT_EQ(read_shard((d / "val_000000.bin").string()).size(), 4u * 1024);
  // Without a signal, none is reported.
  stop = 0;
  EXPECT_EQ(prepare_shards(text, d.string(), {.val_fraction = 0.1, .stop = &stop}).stopped, 0);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
