#include "tessera/train/pair_data.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/train/data.h"
#include "tessera/train/text.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
constexpr int kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

size_t padded4(size_t bytes) { return (bytes + 3) / 4 * 4; }

// The bytes of a shard of n pairs, s source and t target tokens of `width` bytes.
size_t pair_shard_bytes(size_t n, size_t s, size_t t, int width) {
  return kHeaderBytes + 2 * (n + 1) * sizeof(uint32_t) + padded4(s * width) + padded4(t * width);
}

}  // namespace

void write_pair_shard_to(std::FILE* f, const std::string& shown, const PairTokens& p, int64_t vocab) {
  const int width = shard_token_bytes(vocab);
  TS_CHECK(p.source.size() <= INT32_MAX && p.target.size() <= INT32_MAX && p.size() <= INT32_MAX, "paired shard ",
           shown, ": more tokens than a shard's header can count (", INT32_MAX, "); split the set");
  std::vector<int32_t> header(kHeaderInts, 0);
  header[0] = kPairShardMagic;
  header[1] = kPairShardVersion;
  header[2] = width;
  header[3] = static_cast<int32_t>(p.size());
  header[4] = static_cast<int32_t>(p.source.size());
  header[5] = static_cast<int32_t>(p.target.size());
  header[6] = static_cast<int32_t>(std::min<int64_t>(vocab, INT32_MAX));
  bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
  for (const auto* off : {&p.source_offsets, &p.target_offsets})
    ok = ok && std::fwrite(off->data(), sizeof(uint32_t), off->size(), f) == off->size();
  for (const auto* ids : {&p.source, &p.target}) {
    std::vector<unsigned char> bytes(padded4(ids->size() * width), 0);
    for (size_t i = 0; i < ids->size(); ++i) {
      const int32_t id = (*ids)[i];
      TS_CHECK(id >= 0 && id < vocab, "paired shard ", shown, ": token id ", id, " is not in the vocab of ", vocab);
      const uint32_t v = static_cast<uint32_t>(id);
      if (width == 2) {
        const auto v16 = static_cast<uint16_t>(v);
        std::memcpy(&bytes[i * 2], &v16, 2);
      } else {
        std::memcpy(&bytes[i * 4], &v, 4);
      }
    }
    ok = ok && (bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  }
  TS_CHECK(ok, "cannot write ", shown, ": ", std::strerror(errno));
}

namespace {
// Checks an offsets table of n + 1 entries over a stream of `count` tokens (see PairShard).
void check_offsets(const std::string& path, const char* side, const uint32_t* off, size_t n, size_t count) {
  TS_CHECK(off[0] == 0, "paired shard ", path, ": the ", side, " offsets start at ", off[0], ", not 0");
  for (size_t i = 0; i < n; ++i)
    TS_CHECK(off[i + 1] > off[i], "paired shard ", path, ": pair ", i, " has ",
             off[i + 1] < off[i] ? "a negative" : "an empty", " ", side);
  TS_CHECK(off[n] == count, "paired shard ", path, ": the ", side, " offsets end at ", off[n], ", but the header says ",
           counted(count, std::string(side) + " token"));
}

// The largest id of a stream of n tokens, and the index of the first at or past `vocab` (n when none).
std::pair<int64_t, size_t> scan_ids(const unsigned char* p, int width, size_t n, int64_t vocab) {
  int64_t max_id = -1;
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = width == 2 ? reinterpret_cast<const uint16_t*>(p)[i] : reinterpret_cast<const uint32_t*>(p)[i];
    max_id = std::max(max_id, id);
    if (id >= vocab) return {max_id, i};
  }
  return {max_id, n};
}
}  // namespace

void PairTokens::add(std::span<const int32_t> src, std::span<const int32_t> tgt) {
  source.insert(source.end(), src.begin(), src.end());
  target.insert(target.end(), tgt.begin(), tgt.end());
  source_offsets.push_back(static_cast<uint32_t>(source.size()));
  target_offsets.push_back(static_cast<uint32_t>(target.size()));
}

void write_pair_shard(const std::string& path, const PairTokens& pairs, int64_t vocab) {
  write_file_atomic(path, [&](std::FILE* f) { write_pair_shard_to(f, path, pairs, vocab); });
}

PairShard::PairShard(const std::string& path, int64_t vocab) : file_(path, "paired shard"), path_(path) {
  const size_t size = file_.size();
  TS_CHECK(size >= kHeaderBytes, "paired shard ", path, ": truncated header (", size, " of ", kHeaderBytes, " bytes)");
  int32_t h[7];
  std::memcpy(h, file_.data(), sizeof h);
  TS_CHECK(h[0] == kPairShardMagic, "paired shard ", path, ": bad magic ", h[0], " (expected ", kPairShardMagic,
           h[0] == kShardMagic ? "; this is a token shard, which prepare --text writes)" : ")");
  TS_CHECK(h[1] == kPairShardVersion, "paired shard ", path, ": unsupported version ", h[1], " (expected ",
           kPairShardVersion, ")");
  TS_CHECK(h[2] == 2 || h[2] == 4, "paired shard ", path, ": ", h[2], " bytes a token (expected 2 or 4)");
  TS_CHECK(h[3] >= 0 && h[4] >= 0 && h[5] >= 0 && h[6] > 0, "paired shard ", path, ": a negative count in the header");
  width_ = h[2];
  n_ = static_cast<size_t>(h[3]);
  vocab_ = h[6];
  TS_CHECK(width_ == shard_token_bytes(vocab_), "paired shard ", path, ": ", width_, " bytes a token for a vocab of ",
           vocab_, " (expected ", shard_token_bytes(vocab_), ")");
  const size_t s = static_cast<size_t>(h[4]), t = static_cast<size_t>(h[5]);
  const size_t expect = pair_shard_bytes(n_, s, t, width_);
  TS_CHECK(size == expect, "paired shard ", path, ": ", size, " bytes, where its header (", counted(n_, "pair"), ", ",
           s, " source and ", t, " target tokens) gives ", expect);
  // The mapping is page-aligned and every section a multiple of 4 bytes, so each is aligned for its type.
  src_off_ = reinterpret_cast<const uint32_t*>(file_.data() + kHeaderBytes);
  tgt_off_ = src_off_ + n_ + 1;
  src_ = reinterpret_cast<const unsigned char*>(tgt_off_ + n_ + 1);
  tgt_ = src_ + padded4(s * width_);
  check_offsets(path, "source", src_off_, n_, s);
  check_offsets(path, "target", tgt_off_, n_, t);
  const int64_t limit = vocab > 0 ? std::min(vocab, vocab_) : vocab_;
  for (const auto& [side, p, count] : {std::tuple{"source", src_, s}, std::tuple{"target", tgt_, t}}) {
    const auto [max_id, bad] = scan_ids(p, width_, count, limit);
    TS_CHECK(bad == count, "paired shard ", path, ": ", side, " token id ", max_id, " at position ", bad,
             " is not below ", vocab > 0 && vocab < vocab_ ? "the model's vocab " : "the shard's vocab ", limit);
  }
}

void PairShard::copy(const unsigned char* stream, uint32_t from, uint32_t n, int32_t* out) const {
  if (width_ == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(stream) + from;
    for (uint32_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(stream) + from;
    for (uint32_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
  }
}

std::vector<int32_t> PairShard::source(size_t i) const {
  std::vector<int32_t> v(source_len(i));
  copy_source(i, v.data());
  return v;
}

std::vector<int32_t> PairShard::target(size_t i) const {
  std::vector<int32_t> v(target_len(i));
  copy_target(i, v.data());
  return v;
}

PairShard open_pair_split(const std::string& dir, const std::string& split, int64_t vocab) {
  const fs::path path = fs::path(dir) / (split + "_000000.pairs");
  std::error_code ec;
  TS_CHECK(fs::exists(path, ec), "data ", dir, " has no ", path.filename().string(),
           " (make paired shards with tessera prepare --source FILE --target FILE, or --pairs FILE)");
  return PairShard(path.string(), vocab);
}

}  // namespace tessera
