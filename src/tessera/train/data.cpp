#include "tessera/train/data.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/hold_signals.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
// The largest id in n tokens of type T, and the index of the first at or past `vocab` (n when none).
template <typename T>
std::pair<int64_t, size_t> scan_tokens(const T* tokens, size_t n, int64_t vocab) {
  T max_id = 0;
  for (size_t i = 0; i < n; ++i) max_id = std::max(max_id, tokens[i]);  // vectorizes; no branch per token
  if (static_cast<int64_t>(max_id) < vocab) return {max_id, n};
  const size_t i = static_cast<size_t>(
      std::find_if(tokens, tokens + n, [&](T t) { return static_cast<int64_t>(t) >= vocab; }) - tokens);
  return {max_id, i};
}

// Maps a shard and checks it (see read_shard). Returns the mapping; its tokens start at kShardHeaderInts * 4 and
// are *width_out bytes each.
MappedFile map_shard(const std::string& path, int vocab, size_t* count_out, int* max_out = nullptr,
                     int* width_out = nullptr) {
  MappedFile file(path, "shard");
  const size_t size = file.size();
  const size_t header_bytes = kShardHeaderInts * sizeof(int32_t);
  TS_CHECK(size >= header_bytes, "shard ", path, ": truncated header (", size, " of ", header_bytes, " bytes)");
  int32_t header[4];
  std::memcpy(header, file.data(), sizeof header);
  TS_CHECK(header[0] == kShardMagic, "shard ", path, ": bad magic ", header[0], " (expected ", kShardMagic, ")");
  TS_CHECK(header[1] == kShardVersion || header[1] == kShardVersionU32, "shard ", path, ": unsupported version ",
           header[1], " (expected ", kShardVersion, ", uint16 tokens, or ", kShardVersionU32, ", uint32 tokens)");
  const int width = header[1] == kShardVersion ? 2 : 4;
  TS_CHECK(header[1] == kShardVersion || header[3] == 4, "shard ", path, ": a version-2 shard declares ", header[3],
           " bytes a token (expected 4)");
  TS_CHECK(header[2] >= 0, "shard ", path, ": negative token count ", header[2]);
  const size_t count = static_cast<size_t>(header[2]);
  const size_t expect = header_bytes + count * width;
  TS_CHECK(size >= expect, "shard ", path, ": truncated (header says ", counted(count, "token"), ", file holds ",
           (size - header_bytes) / width, ")");
  TS_CHECK(size == expect, "shard ", path, ": ", counted(size - expect, "byte"), " beyond the ",
           counted(count, "token"), " its header declares");
  int max_token = -1;
  if (vocab > 0 && count > 0) {
    // The mapping is page-aligned and the header 1 KiB, so the tokens are aligned.
    const unsigned char* tokens = file.data() + header_bytes;
    file.advise_sequential();
    const auto [max_id, bad] = width == 2 ? scan_tokens(reinterpret_cast<const uint16_t*>(tokens), count, vocab)
                                          : scan_tokens(reinterpret_cast<const uint32_t*>(tokens), count, vocab);
    if (bad < count) {
      const int64_t id = width == 2 ? reinterpret_cast<const uint16_t*>(tokens)[bad]
                                    : reinterpret_cast<const uint32_t*>(tokens)[bad];
      TS_THROW("shard ", path, ": token id ", id, " at position ", bad, " is not below the model's vocab ", vocab);
    }
    max_token = static_cast<int>(max_id);
  }
  *count_out = count;
  if (max_out) *max_out = max_token;
  if (width_out) *width_out = width;
  return file;
}

std::vector<int32_t> shard_header(int32_t version, size_t count) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);
  if (version == kShardVersionU32) header[3] = 4;
  return header;
}
}  // namespace

std::vector<uint16_t> read_shard(const std::string& path, int vocab) {
  size_t count = 0;
  int width = 2;
  const MappedFile file = map_shard(path, vocab, &count, nullptr, &width);
  TS_CHECK(width == 2, "shard ", path, ": a version-2 shard (uint32 tokens), where uint16 tokens were expected");
  std::vector<uint16_t> tokens(count);
  if (count) std::memcpy(tokens.data(), file.data() + kShardHeaderInts * sizeof(int32_t), count * sizeof(uint16_t));
  return tokens;
}

std::vector<int32_t> read_shard_tokens(const std::string& path, int vocab) {
  size_t count = 0;
  int width = 2;
  const MappedFile file = map_shard(path, vocab, &count, nullptr, &width);
  const unsigned char* p = file.data() + kShardHeaderInts * sizeof(int32_t);
  std::vector<int32_t> tokens(count);
  for (size_t i = 0; i < count; ++i)
    tokens[i] = width == 2 ? reinterpret_cast<const uint16_t*>(p)[i]
                           : static_cast<int32_t>(reinterpret_cast<const uint32_t*>(p)[i]);
  return tokens;
}

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  TS_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "shard ", path, ": too many tokens");
  const std::vector<int32_t> header = shard_header(kShardVersion, tokens.size());
  write_file_atomic(path, [&](std::FILE* f) {
    bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
    ok = ok && (tokens.empty() || std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size());
    TS_CHECK(ok, "cannot write ", path);
  });
}

void write_shard_tokens(const std::string& path, std::span<const int32_t> tokens, int64_t vocab) {
  TS_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "shard ", path, ": too many tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    TS_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "shard ", path, ": token id ", tokens[i], " at position ", i,
             " is not in the vocab of ", vocab);
  if (shard_token_bytes(vocab) == 2) {
    write_shard(path, std::vector<uint16_t>(tokens.begin(), tokens.end()));
    return;
  }
  const std::vector<int32_t> header = shard_header(kShardVersionU32, tokens.size());
  write_file_atomic(path, [&](std::FILE* f) {
    bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
    ok = ok && (tokens.empty() || std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), f) == tokens.size());
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
  for (int32_t t : tokens) {
    if (t >= 0 && t < kByteVocab) s.push_back(static_cast<char>(t));
    else s.append("<id ").append(std::to_string(t)).append(">");
  }
  return s;
}

namespace {
// A <split> shard is a .bin file whose name has <split> as a whole '_'-separated word: tessera's
// train_000000.bin, and llm.c's fineweb_train_000001.bin or tiny_shakespeare_val.bin. A word that merely
// contains it (interval_000.bin) does not count.
bool is_shard_of(const std::string& name, const std::string& split) {
  if (!name.ends_with(".bin")) return false;
  std::string words = "_", word = "_";  // appended, not "_" + std::string&& (GCC 12 -Wrestrict false positive)
  words.append(name, 0, name.size() - 4).append("_");
  word.append(split).append("_");
  return words.find(word) != std::string::npos;
}

constexpr size_t kSplitBlock = 1024;
constexpr size_t kWriteChunk = size_t{1} << 20;  // tokens a write: 2 MiB, so a stop is seen within milliseconds

// ⌊n·f⌋: the val blocks among the first n. The margin keeps exact multiples exact where f is stored below its
// value: 1/3 is, and 3·(1/3) must give 1, not 0.99999... (it is far below any fraction's step for n < 2^32).
size_t val_blocks_in(size_t n, double f) { return static_cast<size_t>(std::floor(static_cast<double>(n) * f + 1e-9)); }
bool is_val_block(size_t b, double f) { return val_blocks_in(b + 1, f) > val_blocks_in(b, f); }

// The split of a text of `size` bytes (see data.h): 1 KiB blocks, or, for a short text, its tail.
struct Split {
  size_t size = 0;
  double f = 0;
  bool blocks = false;
  size_t tail = 0;  // without blocks: val is [size - tail, size)

  Split(size_t n, double fraction) : size(n), f(fraction), blocks(val_blocks_in(n / kSplitBlock, fraction) > 0) {
    // At least one val byte (none for an empty text), and never more than the text: for an empty text the train
    // split would otherwise be size - 1 bytes (2^64 - 1), which passes train --data's check of its length.
    if (!blocks)
      tail = std::min<size_t>(n, std::max<size_t>(1, static_cast<size_t>(static_cast<double>(n) * fraction)));
  }
  // Calls fn(begin, end) for each byte range of the split `val` (true) or train (false), in order.
  template <typename Fn>
  void for_each_range(bool val, Fn&& fn) const {
    if (!blocks) {
      if (val) fn(size - tail, size);
      else fn(size_t{0}, size - tail);
      return;
    }
    for (size_t b = 0; b * kSplitBlock < size; ++b)
      if (is_val_block(b, f) == val) fn(b * kSplitBlock, std::min(size, (b + 1) * kSplitBlock));
  }
  size_t count(bool val) const {
    size_t n = 0;
    for_each_range(val, [&](size_t b, size_t e) { n += e - b; });
    return n;
  }
};

void throw_if_stopped(const volatile std::sig_atomic_t* stop) {
  if (stop && *stop != 0) throw PrepareInterrupted(*stop);
}

// Writes the shard of one side of the split to `tmp`, encoding the text a chunk at a time (no copy of the whole
// text as tokens), and flushes it to disk. Polls `stop` after every chunk.
// `written(n)` (may be empty) is told after each chunk the tokens of this shard written so far.
void write_shard_from_text(const std::string& tmp, const std::string& shown, const std::string& text,
                           const Split& split, bool val, size_t count, const volatile std::sig_atomic_t* stop,
                           const std::function<void(size_t)>& written) {
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TS_CHECK(f, "cannot write ", shown, ": ", std::strerror(errno));
  bool ok = true;
  try {
    std::vector<int32_t> header(kShardHeaderInts, 0);
    header[0] = kShardMagic;
    header[1] = kShardVersion;
    header[2] = static_cast<int32_t>(count);
    ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
    std::vector<uint16_t> buf;
    buf.reserve(kWriteChunk);
    size_t done = 0;
    auto flush = [&] {
      ok = ok && (buf.empty() || std::fwrite(buf.data(), sizeof(uint16_t), buf.size(), f) == buf.size());
      TS_CHECK(ok, "cannot write ", shown, ": ", std::strerror(errno));
      done += buf.size();
      buf.clear();
      throw_if_stopped(stop);
      if (written) written(done);
    };
    split.for_each_range(val, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) buf.push_back(static_cast<unsigned char>(text[i]));
      if (buf.size() + kSplitBlock > kWriteChunk) flush();
    });
    flush();
    ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    TS_CHECK(ok, "cannot write ", shown, ": ", std::strerror(errno));
  } catch (...) {
    std::fclose(f);
    throw;
  }
  TS_CHECK(std::fclose(f) == 0, "cannot write ", shown, ": ", std::strerror(errno));
}

// The shards of a token stream (prepare_token_shards): block b of 1 Ki ids goes to val when is_val_block(b, f),
// each id written as it comes, 2 or 4 bytes (shard_token_bytes). A stream that ends with no whole val block takes
// the short-text split instead: its last ⌊n·f⌋ ids (at least one) go to val. Every val id is then in the stream's
// last block (the one partial block may have gone to val), so the fix-up moves fewer than 1 Ki + ⌊n·f⌋ ids, a few
// thousand, between the ends of the two files.
class TokenSplitWriter {
 public:
  TokenSplitWriter(const std::string (&paths)[2], const std::array<std::string, 2>& shown, double f, int64_t vocab)
      : f_(f), width_(shard_token_bytes(vocab)) {
    for (int k = 0; k < 2; ++k) {
      out_[k].shown = shown[k];
      out_[k].f = std::fopen(paths[k].c_str(), "w+b");
      TS_CHECK(out_[k].f, "cannot write ", shown[k], ": ", std::strerror(errno));
      write_header(out_[k]);  // the count is written at finish()
    }
  }
  ~TokenSplitWriter() {
    for (Out& o : out_)
      if (o.f) std::fclose(o.f);
  }
  TokenSplitWriter(const TokenSplitWriter&) = delete;
  TokenSplitWriter& operator=(const TokenSplitWriter&) = delete;

  void append(std::span<const int32_t> ids) {
    size_t i = 0;
    while (i < ids.size()) {
      const size_t block = n_ / kSplitBlock;
      const size_t take = std::min(ids.size() - i, (block + 1) * kSplitBlock - n_);
      Out& o = out_[is_val_block(block, f_) ? 1 : 0];
      for (size_t j = i; j < i + take; ++j) put(o, static_cast<uint32_t>(ids[j]));
      if (o.buf.size() >= kFlushBytes) flush(o);
      n_ += take;
      i += take;
    }
  }

  // Flushes, applies the short-stream split, writes the counts and syncs both files. Returns {train, val}.
  std::pair<size_t, size_t> finish() {
    for (Out& o : out_) flush(o);
    if (val_blocks_in(n_ / kSplitBlock, f_) == 0 && n_ > 0) move_tail_to_val();
    for (Out& o : out_) {
      TS_CHECK(o.count <= static_cast<size_t>(INT32_MAX), "prepare: ", o.shown, " would hold ", o.count,
               " tokens, more than a shard's header can count (", INT32_MAX, "); split the text");
      write_header(o);
      const bool ok = std::fflush(o.f) == 0 && ::fsync(::fileno(o.f)) == 0;
      TS_CHECK(ok, "cannot write ", o.shown, ": ", std::strerror(errno));
      const int closed = std::fclose(o.f);
      o.f = nullptr;
      TS_CHECK(closed == 0, "cannot write ", o.shown, ": ", std::strerror(errno));
    }
    return {out_[0].count, out_[1].count};
  }

 private:
  static constexpr size_t kFlushBytes = size_t{2} << 20;
  struct Out {
    std::FILE* f = nullptr;
    std::string shown;
    std::vector<unsigned char> buf;
    size_t count = 0;  // ids written or buffered
  };

  void put(Out& o, uint32_t id) {
    unsigned char b[4];
    std::memcpy(b, &id, 4);  // little-endian hosts only, as the shard format itself
    if (width_ == 2) {
      const auto id16 = static_cast<uint16_t>(id);
      std::memcpy(b, &id16, 2);
    }
    o.buf.insert(o.buf.end(), b, b + width_);
    ++o.count;
  }
  void flush(Out& o) {
    const bool ok = o.buf.empty() || std::fwrite(o.buf.data(), 1, o.buf.size(), o.f) == o.buf.size();
    TS_CHECK(ok, "cannot write ", o.shown, ": ", std::strerror(errno));
    o.buf.clear();
  }
  void write_header(Out& o) {
    const std::vector<int32_t> h = shard_header(width_ == 2 ? kShardVersion : kShardVersionU32, o.count);
    const bool ok = std::fseek(o.f, 0, SEEK_SET) == 0 &&
                    std::fwrite(h.data(), sizeof(int32_t), h.size(), o.f) == h.size();
    TS_CHECK(ok, "cannot write ", o.shown, ": ", std::strerror(errno));
  }
  // The ids [from, o.count) of o's file, read back.
  std::vector<uint32_t> read_back(Out& o, size_t from) {
    std::vector<unsigned char> raw((o.count - from) * width_);
    const long at = static_cast<long>(kShardHeaderInts * sizeof(int32_t) + from * width_);
    const bool ok = std::fseek(o.f, at, SEEK_SET) == 0 &&
                    (raw.empty() || std::fread(raw.data(), 1, raw.size(), o.f) == raw.size());
    TS_CHECK(ok, "cannot read back ", o.shown, ": ", std::strerror(errno));
    std::vector<uint32_t> ids(o.count - from);
    for (size_t i = 0; i < ids.size(); ++i) {
      uint16_t v16 = 0;
      uint32_t v32 = 0;
      if (width_ == 2) std::memcpy(&v16, &raw[i * 2], 2);
      else std::memcpy(&v32, &raw[i * 4], 4);
      ids[i] = width_ == 2 ? v16 : v32;
    }
    return ids;
  }
  // Cuts o's file back to its first `keep` ids, positioned to append after them.
  void truncate(Out& o, size_t keep) {
    const long end = static_cast<long>(kShardHeaderInts * sizeof(int32_t) + keep * width_);
    const bool ok = std::fflush(o.f) == 0 && ::ftruncate(::fileno(o.f), end) == 0 &&
                    std::fseek(o.f, end, SEEK_SET) == 0;
    TS_CHECK(ok, "cannot write ", o.shown, ": ", std::strerror(errno));
    o.count = keep;
  }
  void move_tail_to_val() {
    Out &train = out_[0], &val = out_[1];
    const size_t tail = std::min<size_t>(n_, std::max<size_t>(1, static_cast<size_t>(static_cast<double>(n_) * f_)));
    // The stream is train's ids, then val's (all of them in the last block): its last `tail` become val.
    std::vector<uint32_t> v = read_back(val, 0);
    std::vector<uint32_t> moved;  // from the end of train to the front of val
    if (tail >= v.size()) {
      moved = read_back(train, train.count - (tail - v.size()));
      truncate(train, train.count - moved.size());
    } else {
      truncate(train, train.count);
      for (size_t i = 0; i < v.size() - tail; ++i) put(train, v[i]);
      flush(train);
      v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() - tail));
    }
    truncate(val, 0);
    for (uint32_t id : moved) put(val, id);
    for (uint32_t id : v) put(val, id);
    flush(val);
  }

  double f_;
  int width_;
  Out out_[2];
  size_t n_ = 0;  // ids appended
};

// Undoes a prepare that does not finish: removes its temporary files, then the directories it created, innermost
// first and each only when empty (so that files another process put there meanwhile stay).
class PrepareUndo {
 public:
  ~PrepareUndo() {
    std::error_code ec;
    for (const auto& t : temps_) fs::remove(t, ec);
    if (done_) return;
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) fs::remove(*it, ec);
  }
  // Creates `dir`, remembering each directory on its path that this process's own mkdir made.
  void create(const std::string& dir) { created_ = create_dirs_recorded(dir); }
  void temp(const std::string& path) { temps_.push_back(path); }
  void done() { done_ = true; }

 private:
  std::vector<fs::path> created_;  // outermost first
  std::vector<std::string> temps_;
  bool done_ = false;
};

}  // namespace

bool is_shard_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  const int fd = open_for_reading(path, "data");
  int32_t magic = 0;
  ssize_t got;
  do got = ::read(fd, &magic, sizeof magic);
  while (got < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  // A read that fails is the file's fault, not a missing header: say so (EIO on a bad disk, not "not a shard").
  TS_CHECK(got >= 0, "data: cannot read ", path, ": ", std::strerror(err));
  return got == static_cast<ssize_t>(sizeof magic) && magic == kShardMagic;
}

bool is_prepare_leftover(std::string_view name) {
  for (const std::string_view kind :
       {".train_000000.bin.tmp.", ".val_000000.bin.tmp.", ".tokenizer.json.tmp.", ".train_000000.bin.old."}) {
    if (!name.starts_with(kind)) continue;
    const std::string_view pid = name.substr(kind.size());
    return !pid.empty() && pid.size() <= 10 && pid.find_first_not_of("0123456789") == std::string_view::npos;
  }
  return false;
}

namespace {
// Removes the hidden working files (is_prepare_leftover) of prepares that are gone: killed outright, they left
// them in `dir`. A live process's (another prepare writing here now) stay; this process's own are stale too.
void remove_prepare_leftovers(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_prepare_leftover(name) || !fs::is_regular_file(e.symlink_status(ec))) continue;  // prepare writes files
    const long long pid = std::stoll(name.substr(name.rfind('.') + 1));
    const bool gone = pid == ::getpid() || pid > INT32_MAX ||
                      (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
    if (gone) fs::remove(e.path(), ec);
  }
}
}  // namespace

namespace {
constexpr const char* kShardNames[2] = {"train_000000.bin", "val_000000.bin"};

// A hidden working file of this process in dir: ".<name>.tmp.<pid>".
std::string hidden_temp(const fs::path& dir, const char* name) {
  std::string hidden = ".";  // appended, not "." + std::string&& (GCC 12 -Wrestrict false positive)
  hidden.append(name).append(".tmp.").append(std::to_string(::getpid()));
  return (dir / hidden).string();
}

// Writes `text` to `path` and flushes it to disk (no rename: the caller renames it into place).
void write_synced(const std::string& path, const std::string& shown, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  TS_CHECK(f, "cannot write ", shown, ": ", std::strerror(errno));
  bool ok = text.empty() || std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int e = errno;
  ok = std::fclose(f) == 0 && ok;
  TS_CHECK(ok, "cannot write ", shown, ": ", std::strerror(e));
}

// Writes the train and val shards to temps[0] and temps[1], flushed to disk; returns their token counts.
using WriteTemps = std::function<std::pair<size_t, size_t>(const std::string (&temps)[2])>;

// What prepare_shards and prepare_token_shards share (data.h): the lock, the earlier shards, the temporary files
// and the renames. tokenizer_json, when given, is written as out_dir/tokenizer.json with the shards; without it an
// earlier tokenizer.json there is removed.
PrepareReport prepare_into(const std::string& out_dir, const PrepareParams& params, const WriteTemps& write,
                           const std::string* tokenizer_json) {
  PrepareReport report;
  const fs::path dir(out_dir);
  // The directory, made if missing, is locked before anything in it is read (PrepareParams::lock).
  PrepareUndo undo;
  undo.create(out_dir);
  std::optional<DirectoryLock> lock;
  if (params.lock) {
    // tests: time for another process to take the lock of the directory just made (the race two prepares started at
    // once run in microseconds)
    if (fault_injected("prepare-pause-before-lock")) ::sleep(2);
    try {
      lock.emplace(out_dir, "shard directory",
                   "(a train that reads shards there or writes its run there, or another prepare): wait for it to "
                   "end, or prepare into another directory");
    } catch (const DirectoryInUse&) {
      // Another process holds it: started at once into the same new directory, it works in the one this made.
      undo.done();
      throw;
    }
  }

  // The directory's other shards that train --data would read beside the new ones: tessera's own names
  // (train_*.bin, val_*.bin: an earlier prepare's, or copies) go with the renames; others (llm.c's
  // fineweb_train_000001.bin) may be downloads that took hours, and are not removed but refused.
  // What is replaced or removed must be a shard (its header's magic): a text named train_notes.bin, even the text
  // being prepared, would otherwise be removed as an earlier shard.
  std::vector<std::string> stale;
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      std::error_code ec;
      if (!e.is_regular_file(ec) || !(is_shard_of(name, "train") || is_shard_of(name, "val"))) continue;
      TS_CHECK(name.starts_with("train_") || name.starts_with("val_"), "prepare: ", out_dir, " holds ", name,
               ", a shard that train --data would read beside the new ones: move it, or prepare into another "
               "directory");
      TS_CHECK(is_shard_file(e.path().string()), "prepare: ", out_dir, " holds ", name,
               ", which is named as a shard but is not one (no shard header), and would be ",
               name == kShardNames[0] || name == kShardNames[1] ? "replaced" : "removed",
               ": move it, or prepare into another directory");
      if (name == kShardNames[0] || name == kShardNames[1]) continue;
      stale.push_back(name);
    }
  }
  std::sort(stale.begin(), stale.end());

  remove_prepare_leftovers(dir);
  std::string temps[2];
  for (int k = 0; k < 2; ++k) {
    temps[k] = hidden_temp(dir, kShardNames[k]);
    undo.temp(temps[k]);
  }
  std::string tok_temp;
  if (tokenizer_json) {
    tok_temp = hidden_temp(dir, kTokenizerFile);
    undo.temp(tok_temp);
    write_synced(tok_temp, (dir / kTokenizerFile).string(), *tokenizer_json);
  }
  const auto [n_train, n_val] = write(temps);
  throw_if_stopped(params.stop);
  {
    HoldSignals hold;
    if (params.before_renames) params.before_renames();
    // The earlier train shard is kept under a hidden name (a second link to it, or, on a file system without hard
    // links, the entry moved there) until the val shard is in place: when that rename fails, it is put back, so
    // that the new train shard never stands beside the old val shard. Any entry but a directory is kept (a
    // symlink too, dangling or not: link() links the symlink itself); a directory there fails the first rename.
    const std::string train = (dir / kShardNames[0]).string(), val = (dir / kShardNames[1]).string();
    const std::string keep =
        (dir / (std::string(".") + kShardNames[0] + ".old." + std::to_string(::getpid()))).string();
    std::error_code ec;
    const fs::file_status old_train = fs::symlink_status(train, ec);
    const bool kept = fs::exists(old_train) && !fs::is_directory(old_train);
    bool moved = false;
    if (kept) {
      moved = ::link(train.c_str(), keep.c_str()) != 0;
      TS_CHECK(!moved || std::rename(train.c_str(), keep.c_str()) == 0, "cannot write ", train, ": ",
               std::strerror(errno));
    }
    // Puts the earlier train shard back at `train` (over the new one, if that is there); on failure, the error
    // says where it is.
    const auto put_back = [&]() -> std::string {
      if (std::rename(keep.c_str(), train.c_str()) == 0) return "";
      return "; the earlier " + std::string(kShardNames[0]) + " is at " + keep + " (" + std::strerror(errno) + ")";
    };
    if (std::rename(temps[0].c_str(), train.c_str()) != 0) {
      const int e = errno;
      const std::string where = moved ? put_back() : "";
      if (kept && !moved) ::unlink(keep.c_str());
      TS_THROW("cannot write ", train, ": ", std::strerror(e), where);
    }
    if (std::rename(temps[1].c_str(), val.c_str()) != 0) {
      const int e = errno;
      std::string where;
      if (kept) where = put_back();  // the earlier train shard back over the new one
      else fs::remove(train, ec);
      TS_THROW("cannot write ", val, ": ", std::strerror(e), where);
    }
    if (kept) ::unlink(keep.c_str());
    // The tokenizer's file after the shards: a crash between the renames (signals are held off) leaves the new
    // shards beside the earlier tokenizer.json, never the new tokenizer.json beside the earlier shards' ids alone.
    const std::string tokenizer = (dir / kTokenizerFile).string();
    if (tokenizer_json) {
      if (std::rename(tok_temp.c_str(), tokenizer.c_str()) != 0) {
        const int e = errno;
        fs::remove(tokenizer, ec);  // no file that names another tokenizer beside these shards
        undo.done();
        TS_THROW("prepare: wrote ", out_dir, "'s shards, but cannot write ", tokenizer,
                 " beside them: ", std::strerror(e));
      }
    } else if (fs::is_regular_file(fs::symlink_status(tokenizer, ec))) {
      fs::remove(tokenizer, ec);  // an earlier prepare's: these shards hold bytes
    }
    undo.done();
    for (const std::string& name : stale) {
      fs::remove(dir / name, ec);
      TS_CHECK(!ec, "prepare: wrote ", out_dir, "'s shards, but cannot remove the earlier ", name,
               " beside them: ", ec.message());
    }
    fsync_dir(out_dir);
  }  // a signal held off since the renames began is delivered here, to the caller's handler
  report.n_train = n_train;
  report.n_val = n_val;
  report.removed = std::move(stale);
  report.stopped = params.stop ? static_cast<int>(*params.stop) : 0;
  return report;
}

}  // namespace

PrepareReport prepare_shards(const std::string& text, const std::string& out_dir, const PrepareParams& params) {
  const double val_fraction = params.val_fraction;
  TS_CHECK(!out_dir.empty(), "prepare: the output directory is empty");
  TS_CHECK(text.size() >= 2, "the text has ", counted(text.size(), "byte"),
           "; at least 2 are needed (a train token and a val token)");
  TS_CHECK(val_fraction > 0 && val_fraction < 1, "prepare: val fraction must be in (0, 1)");
  const Split split(text.size(), val_fraction);
  const fs::path dir(out_dir);
  const size_t counts[2] = {split.count(false), split.count(true)};
  for (int k = 0; k < 2; ++k)
    TS_CHECK(counts[k] <= static_cast<size_t>(INT32_MAX), "prepare: ", (dir / kShardNames[k]).string(), " would hold ",
             counts[k], " tokens, more than a shard's header can count (", INT32_MAX, "); split the text");
  const WriteTemps write = [&](const std::string(&temps)[2]) {
    for (int k = 0; k < 2; ++k) {
      const size_t before = k == 0 ? 0 : counts[0];  // one token a byte: train's tokens come first
      std::function<void(size_t)> written;
      if (params.progress) written = [&](size_t n) { params.progress(before + n, text.size()); };
      write_shard_from_text(temps[k], (dir / kShardNames[k]).string(), text, split, /*val=*/k == 1, counts[k],
                            params.stop, written);
    }
    return std::make_pair(counts[0], counts[1]);
  };
  return prepare_into(out_dir, params, write, nullptr);
}

PrepareReport prepare_token_shards(const TokenSource& source, const std::string& out_dir, const PrepareParams& params,
                                   const TokenShardParams& tokens) {
  TS_CHECK(!out_dir.empty(), "prepare: the output directory is empty");
  TS_CHECK(params.val_fraction > 0 && params.val_fraction < 1, "prepare: val fraction must be in (0, 1)");
  TS_CHECK(tokens.vocab > 0 && tokens.vocab <= INT32_MAX, "prepare: a vocab of ", tokens.vocab, " tokens");
  const fs::path dir(out_dir);
  const WriteTemps write = [&](const std::string(&temps)[2]) {
    TokenSplitWriter w(temps, {(dir / kShardNames[0]).string(), (dir / kShardNames[1]).string()}, params.val_fraction,
                       tokens.vocab);
    source([&](std::span<const int32_t> ids) {
      w.append(ids);
      throw_if_stopped(params.stop);
    });
    const auto counts = w.finish();
    TS_CHECK(counts.first + counts.second >= 2, "prepare: the text has ",
             counted(counts.first + counts.second, "token"), "; at least 2 are needed (a train token and a val token)");
    return counts;
  };
  return prepare_into(out_dir, params, write, &tokens.tokenizer_json);
}

std::pair<size_t, size_t> prepare_split_sizes(size_t text_bytes, double val_fraction) {
  const Split split(text_bytes, val_fraction);
  return {split.count(false), split.count(true)};
}

std::pair<size_t, size_t> prepare_text(const std::string& text, const std::string& out_dir, double val_fraction) {
  const PrepareReport r = prepare_shards(text, out_dir, {.val_fraction = val_fraction});
  return {r.n_train, r.n_val};
}

std::vector<std::string> list_shards(const std::string& data, const std::string& split) {
  TS_CHECK(fs::exists(data), "data: ", data, " does not exist", dangling_link_note(data));
  if (!fs::is_directory(data)) return {data};
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(data)) {
    const std::string name = e.path().filename().string();
    if (!is_shard_of(name, split)) continue;
    std::error_code ec;
    if (!e.is_regular_file(ec)) {  // through a symlink: a link to a shard is one
      const char* kind = e.is_symlink(ec) && !fs::exists(e.path(), ec) ? "a symlink to nothing"
                         : e.is_directory(ec)                          ? "a directory"
                                                                       : "not a regular file";
      TS_THROW("data: ", e.path().string(), " is named as a ", split, " shard but is ", kind,
               ": remove it, or point it at a shard");
    }
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> find_shards(const std::string& data, const std::string& split) {
  std::vector<std::string> out = list_shards(data, split);
  // A run's directory given as --data (its shards are in RUN/data): name the directory that holds them.
  const fs::path in_data = fs::path(data) / "data";
  bool nested = false;
  if (out.empty()) {
    std::error_code ec;  // only a hint: an unreadable RUN/data gives none, not another error
    try {
      nested = fs::is_directory(data, ec) && fs::is_directory(in_data, ec) &&
               !list_shards(in_data.string(), split).empty();
    } catch (...) {
      nested = false;
    }
  }
  TS_CHECK(!out.empty(), "data: no ", split, " shards (", split, "_*.bin) in ", data,
           nested ? "; " + in_data.string() + " holds them (a run directory's shards are in its data/)" : "");
  return out;
}

TokenStream::TokenStream(const std::vector<std::string>& shards, int vocab) {
  shards_.reserve(shards.size());
  for (const auto& path : shards) {
    size_t count = 0;
    Shard s;
    int shard_max = -1;
    s.file = map_shard(path, vocab, &count, &shard_max, &s.width);
    max_token_ = std::max(max_token_, shard_max);
    s.tokens = s.file.data() + kShardHeaderInts * sizeof(int32_t);
    s.file.advise_sequential();  // batches read the stream front to back
    size_ += count;
    s.end = size_;
    shards_.push_back(std::move(s));
  }
  name_ = shards.empty() ? "" : shards.front();
}

void TokenStream::next_batch(int B, int T, int32_t* inputs, int32_t* targets) {
  const size_t need = static_cast<size_t>(B) * T + 1;
  TS_CHECK(size_ >= need, "data ", name_, ": holds ", counted(size_, "token"), ", fewer than batch x seq + 1 = ", need);
  if (pos_ + need > size_) pos_ = 0;
  // The first shard that ends after pos_ (empty shards end where the one before does, and are passed over).
  size_t s = static_cast<size_t>(
      std::upper_bound(shards_.begin(), shards_.end(), pos_, [](uint64_t p, const Shard& sh) { return p < sh.end; }) -
      shards_.begin());
  uint64_t p = pos_;
  size_t j = 0;  // tokens copied so far
  while (j < need) {
    const Shard& sh = shards_[s];
    const uint64_t shard_begin = s ? shards_[s - 1].end : 0;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(need - j, sh.end - p));
    const auto copy = [&](const auto* src) {
      for (size_t i = 0; i < take; ++i, ++j) {
        const auto t = static_cast<int32_t>(src[i]);
        if (j + 1 < need) inputs[j] = t;
        if (j > 0) targets[j - 1] = t;
      }
    };
    const unsigned char* at = sh.tokens + (p - shard_begin) * sh.width;
    if (sh.width == 2) copy(reinterpret_cast<const uint16_t*>(at));
    else copy(reinterpret_cast<const uint32_t*>(at));
    p += take;
    ++s;
  }
  pos_ += need - 1;
}

void TokenStream::set_position(uint64_t pos) {
  TS_CHECK(pos <= size_, "data: resume position ", pos, " is beyond the ", counted(size_, "token"));
  pos_ = pos;
}

}  // namespace tessera
