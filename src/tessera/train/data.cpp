#include "tessera/train/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {

namespace fs = std::filesystem;

std::vector<uint16_t> read_shard(const std::string& path, int vocab) {
  const std::vector<uint8_t> bytes = read_file_bytes(path, "shard");
  const size_t header_bytes = kShardHeaderInts * sizeof(int32_t);
  TS_CHECK(bytes.size() >= header_bytes, "shard ", path, ": truncated header (", bytes.size(), " of ", header_bytes,
           " bytes)");
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof header);
  TS_CHECK(header[0] == kShardMagic, "shard ", path, ": bad magic ", header[0], " (expected ", kShardMagic, ")");
  TS_CHECK(header[1] == kShardVersion, "shard ", path, ": unsupported version ", header[1], " (expected ",
           kShardVersion, ")");
  TS_CHECK(header[2] >= 0, "shard ", path, ": negative token count ", header[2]);
  const size_t count = static_cast<size_t>(header[2]);
  const size_t expect = header_bytes + count * sizeof(uint16_t);
  TS_CHECK(bytes.size() >= expect, "shard ", path, ": truncated (header says ", count, " tokens, file holds ",
           (bytes.size() - header_bytes) / 2, ")");
  TS_CHECK(bytes.size() == expect, "shard ", path, ": ", bytes.size() - expect, " bytes beyond the ", count,
           " tokens its header declares");
  std::vector<uint16_t> tokens(count);
  std::memcpy(tokens.data(), bytes.data() + header_bytes, count * sizeof(uint16_t));
  if (vocab > 0) {
    for (size_t i = 0; i < count; ++i)
      TS_CHECK(tokens[i] < vocab, "shard ", path, ": token id ", tokens[i], " at position ", i,
               " is not below the model's vocab ", vocab);
  }
  return tokens;
}

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  TS_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "shard ", path, ": too many tokens");
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  write_file_atomic(path, [&](std::FILE* f) {
    bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
    ok = ok && (tokens.empty() || std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size());
    TS_CHECK(ok, "cannot write ", path);
  });
}

std::vector<uint16_t> byte_encode(const std::string& text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string byte_decode(const std::vector<int32_t>& tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (int32_t t : tokens) s.push_back(static_cast<char>(t & 0xff));
  return s;
}

std::pair<size_t, size_t> prepare_text(const std::string& text, const std::string& out_dir, double val_fraction) {
  TS_CHECK(text.size() >= 2, "prepare: the text has ", text.size(), " bytes; at least 2 are needed");
  TS_CHECK(val_fraction > 0 && val_fraction < 1, "prepare: val fraction must be in (0, 1)");
  ensure_writable_dir(out_dir);
  const std::vector<uint16_t> all = byte_encode(text);
  // Every period-th block of kBlock bytes goes to val, so val samples the whole text rather than its end.
  // A text too short for that holds out its last val_fraction instead.
  constexpr size_t kBlock = 1024;
  const size_t period = std::max<size_t>(2, static_cast<size_t>(std::lround(1.0 / val_fraction)));
  std::vector<uint16_t> train, val;
  if (all.size() >= period * kBlock) {
    for (size_t b = 0; b * kBlock < all.size(); ++b) {
      auto first = all.begin() + b * kBlock, last = all.begin() + std::min(all.size(), (b + 1) * kBlock);
      (b % period == period - 1 ? val : train).insert(b % period == period - 1 ? val.end() : train.end(), first, last);
    }
  } else {
    const size_t n_val = std::max<size_t>(1, static_cast<size_t>(all.size() * val_fraction));
    train.assign(all.begin(), all.end() - n_val);
    val.assign(all.end() - n_val, all.end());
  }
  write_shard((fs::path(out_dir) / "train_000000.bin").string(), train);
  write_shard((fs::path(out_dir) / "val_000000.bin").string(), val);
  return {train.size(), val.size()};
}

std::vector<std::string> find_shards(const std::string& data, const std::string& split) {
  TS_CHECK(fs::exists(data), "data: ", data, " does not exist");
  if (!fs::is_directory(data)) return {data};
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(data)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.find(split + "_") != std::string::npos && name.ends_with(".bin"))
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  TS_CHECK(!out.empty(), "data: no ", split, " shards (*", split, "_*.bin) in ", data);
  return out;
}

TokenStream::TokenStream(const std::vector<std::string>& shards, int vocab) {
  for (const auto& path : shards) {
    const auto t = read_shard(path, vocab);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
  }
  name_ = shards.empty() ? "" : shards.front();
}

void TokenStream::next_batch(int B, int T, int32_t* inputs, int32_t* targets) {
  const size_t need = static_cast<size_t>(B) * T + 1;
  TS_CHECK(tokens_.size() >= need, "data ", name_, ": holds ", tokens_.size(), " tokens, fewer than batch x seq + 1 = ",
           need);
  if (pos_ + need > tokens_.size()) pos_ = 0;
  for (size_t i = 0; i + 1 < need; ++i) {
    inputs[i] = tokens_[pos_ + i];
    targets[i] = tokens_[pos_ + i + 1];
  }
  pos_ += need - 1;
}

void TokenStream::set_position(uint64_t pos) {
  TS_CHECK(pos <= tokens_.size(), "data: resume position ", pos, " is beyond the ", tokens_.size(), " tokens");
  pos_ = pos;
}

}  // namespace tessera
