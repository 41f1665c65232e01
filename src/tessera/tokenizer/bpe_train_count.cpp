// tessera/tokenizer/bpe_train_count.cpp — stage 1 of BPE training: the distinct pre-tokens of a streamed text and
// their counts, counted by several threads (see bpe_train.h).
//
// The text is read in blocks. A block is processed up to a cut, and what follows the cut is carried into the next
// block, so that no pre-token and no special token is ever split between two blocks. Only the matches of special
// tokens that start at least (longest special) bytes before the block's end are taken, as those are the whole
// text's matches. A cut is, latest first:
//   - the end of such a match (pre-tokens never cross a special), or
//   - a "safe point" p after the last such match: text[p] is ASCII whitespace and the code point that ends at
//     p - 1 is not whitespace, with p <= size + 1 - (longest special) so that no special straddles it.
// Why a safe point cuts the pre-tokens as the whole text does: the pattern has no lookbehind, so the pre-tokens
// from p on depend only on text[p..]; and every pre-token that starts before p ends at or before p in both, since
// one that holds text[p - 1] (a letter, number, other or contraction) cannot take a whitespace code point, and a
// whitespace run that starts before p stops before text[p - 1] (its lookahead (?!\S) then sees the same code
// point text[p - 1] in both). UTF-8 cannot join across p either: text[p] is ASCII, never a continuation byte.
// A block with no cut grows by another block (text with no special and no whitespace for 32 MiB is held whole).
// Within a block the same cuts split the pieces between specials into smaller pieces, which the threads take one
// at a time.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/tokenizer/pretokenize.h"
#include "tessera/tokenizer/unicode_classes.h"

namespace tessera {
namespace {

uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t k;
    std::memcpy(&k, p, 8);
    h = (h ^ k) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  if (n > 0) {
    uint64_t k = 0;
    std::memcpy(&k, p, n);
    h = (h ^ k) * 0x94d049bb133111ebull;
  }
  h ^= h >> 32;
  return h * 0xbf58476d1ce4e5b9ull;
}

// Distinct pre-tokens and their counts: open addressing with linear probing, at most half full; the bytes live
// in one arena.
class PretokenTable {
 public:
  PretokenTable() : slots_(1 << 12) {}
  void add(std::string_view s, int64_t n) {
    if (2 * (used_ + 1) > slots_.size()) grow();
    const uint64_t h = hash_bytes(s.data(), s.size());
    size_t i = h & (slots_.size() - 1);
    for (; slots_[i].len != 0; i = (i + 1) & (slots_.size() - 1)) {
      Slot& e = slots_[i];
      if (e.hash == h && e.len == s.size() && std::memcmp(arena_.data() + e.offset, s.data(), s.size()) == 0) {
        e.count += n;
        return;
      }
    }
    TS_CHECK(s.size() < (size_t{1} << 32), "BPE training: a pre-token of ", s.size(), " bytes (at most 4 GiB)");
    slots_[i] = {h, arena_.size(), static_cast<uint32_t>(s.size()), n};
    arena_.append(s);
    ++used_;
  }
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& e : slots_)
      if (e.len != 0) fn(std::string_view(arena_.data() + e.offset, e.len), e.count);
  }
  size_t size() const { return used_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint64_t offset = 0;
    uint32_t len = 0;  // 0: empty (pre-tokens are never empty)
    int64_t count = 0;
  };
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& e : old) {
      if (e.len == 0) continue;
      size_t i = e.hash & (slots_.size() - 1);
      while (slots_[i].len != 0) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = e;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t used_ = 0;
};

struct Match {
  size_t start, end;
};

// The special tokens' matches in a text, left to right without overlap, the longest at the leftmost start.
std::vector<Match> find_specials(std::string_view text, const std::vector<std::string>& specials) {
  std::vector<Match> out;
  if (specials.empty()) return out;
  std::vector<size_t> next(specials.size(), 0);  // each special's next occurrence at or after `from`
  std::vector<bool> known(specials.size(), false);
  for (size_t from = 0;;) {
    Match best{std::string_view::npos, 0};
    for (size_t i = 0; i < specials.size(); ++i) {
      if (!known[i] || (next[i] != std::string_view::npos && next[i] < from)) {
        next[i] = text.find(specials[i], from);
        known[i] = true;
      }
      if (next[i] == std::string_view::npos) continue;
      const size_t end = next[i] + specials[i].size();
      if (next[i] < best.start || (next[i] == best.start && end > best.end)) best = {next[i], end};
    }
    if (best.start == std::string_view::npos) return out;
    out.push_back(best);
    from = best.end;
  }
}

bool is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Whether the code point that ends at text[p - 1] (as the pre-tokenizer decodes it) is not whitespace. Any ASCII
// or lead byte starts a code point; a continuation byte is inside the valid sequence of the lead byte before it,
// or stands alone (an invalid byte: class Other).
bool ends_non_space(std::string_view text, size_t p) {
  const auto* t = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t last = t[p - 1];
  if (last < 0x80) return !is_ascii_space(last);
  for (size_t back = 1; back <= 4 && back <= p; ++back) {
    const uint8_t b = t[p - back];
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    uint32_t cp = 0;
    const size_t len = utf8_decode(t + p - back, back, &cp);
    if (len == back && cp != kInvalidCodePoint) return cp_class(cp) != CpClass::Space;
    break;
  }
  return true;
}

bool is_safe_cut(std::string_view text, size_t p) {
  return p > 0 && p < text.size() && is_ascii_space(static_cast<unsigned char>(text[p])) && ends_non_space(text, p);
}

// The last safe point in (lo, hi], or npos.
size_t last_safe_cut(std::string_view text, size_t lo, size_t hi) {
  for (size_t p = hi; p > lo; --p)
    if (is_safe_cut(text, p)) return p;
  return std::string_view::npos;
}

// Where to cut a block that is not the end of its text: after its last special match, a safe point that no
// special straddles; else the end of that match; else npos (the block needs more text).
size_t block_cut(std::string_view text, const std::vector<Match>& matches, size_t max_special) {
  const size_t last_end = matches.empty() ? 0 : matches.back().end;
  // No match after last_end: a special occurrence there runs past the block's end, so it starts after
  // size - max_special; p <= size + 1 - max_special puts any such one at or after p, never across it.
  size_t limit = text.empty() ? 0 : text.size() - 1;
  if (max_special > 1) limit = text.size() + 1 >= max_special ? std::min(limit, text.size() + 1 - max_special) : 0;
  if (limit > last_end) {
    const size_t p = last_safe_cut(text, last_end, limit);
    if (p != std::string_view::npos) return p;
  }
  return matches.empty() ? std::string_view::npos : last_end;
}

// The pieces of text[0, cut) between the special matches, split at safe points into pieces of about `piece`
// bytes (a piece with no safe point stays whole).
std::vector<std::string_view> split_pieces(std::string_view text, size_t cut, const std::vector<Match>& matches,
                                           size_t piece) {
  std::vector<std::string_view> out;
  auto add_segment = [&](size_t s, size_t e) {
    while (e - s > piece) {
      size_t p = s + piece;
      const std::string_view seg = text.substr(0, e);  // is_safe_cut sees the segment's end as the text's
      while (p < e && !is_safe_cut(seg, p)) ++p;
      if (p >= e) break;
      out.push_back(text.substr(s, p - s));
      s = p;
    }
    if (e > s) out.push_back(text.substr(s, e - s));
  };
  size_t at = 0;
  for (const Match& m : matches) {
    if (m.end > cut) break;
    add_segment(at, m.start);
    at = m.end;
  }
  add_segment(at, cut);
  return out;
}

void count_piece(std::string_view rest, PretokenTable& table) {
  while (!rest.empty()) {
    const size_t n = gpt2_pretoken_length(rest);
    table.add(rest.substr(0, n), 1);
    rest.remove_prefix(n);
  }
}

// The counting of one training run: a table per thread, kept across blocks and texts.
class Counter {
 public:
  explicit Counter(const BpeTrainParams& p, uint64_t total_bytes)
      : params_(p), threads_(p.threads > 0 ? p.threads : std::max(1u, std::thread::hardware_concurrency())),
        tables_(threads_), total_(total_bytes) {
    for (const std::string& s : p.special_tokens) max_special_ = std::max(max_special_, s.size());
  }

  // One text, read by `read(buffer, n)` (bytes read, 0 at its end) in blocks of params.block_bytes. `expect`: the
  // text's size where known (a regular file's), else SIZE_MAX; a block asks for at most one byte past it, so that
  // a small text does not allocate a whole block.
  template <typename Read>
  void count_text(Read&& read, size_t expect) {
    std::string cur, next;
    bool eof = false;
    size_t consumed = 0;
    auto fill = [&](std::string& buf) {
      const size_t left = expect > consumed ? expect - consumed : 0;
      const size_t want = std::min(params_.block_bytes, left == SIZE_MAX ? left : left + 1);
      const size_t old = buf.size();
      buf.resize(old + want);
      size_t got = 0;
      while (got < want) {
        const size_t n = read(buf.data() + old + got, want - got);
        if (n == 0) {
          eof = true;
          break;
        }
        got += n;
      }
      buf.resize(old + got);
      consumed += got;
    };
    fill(cur);
    for (;;) {
      std::vector<Match> matches = find_specials(cur, params_.special_tokens);
      // A match is the text's own only where a longer special at its start would be whole in the block ("<s>" at
      // the end may be the start of "<s>>"); then every occurrence that starts before it is whole too.
      if (!eof)
        while (!matches.empty() && matches.back().start + max_special_ > cur.size()) matches.pop_back();
      const size_t cut = eof ? cur.size() : block_cut(cur, matches, max_special_);
      if (cut == std::string::npos) {
        fill(cur);  // no cut yet: the block grows
        continue;
      }
      const std::vector<std::string_view> pieces =
          split_pieces(cur, cut, matches, std::max<size_t>(1, params_.block_bytes / 32));
      next.assign(cur, cut, std::string::npos);
      const bool last = eof;
      count_pieces(pieces, cut, [&] {
        if (!last) fill(next);  // overlaps the counting of this block
      });
      cur.swap(next);
      if (last) return;
    }
  }

  std::vector<WordCount> result() {
    for (size_t t = 1; t < tables_.size(); ++t) {
      tables_[t].for_each([&](std::string_view s, int64_t n) { tables_[0].add(s, n); });
      tables_[t] = PretokenTable();
    }
    std::vector<WordCount> out;
    out.reserve(tables_[0].size());
    tables_[0].for_each([&](std::string_view s, int64_t n) { out.push_back({std::string(s), n}); });
    std::sort(out.begin(), out.end(), [](const WordCount& u, const WordCount& v) { return u.bytes < v.bytes; });
    report(/*final=*/true);
    return out;
  }

 private:
  // Counts the pieces on the threads while `meanwhile` runs on this one; reports the bytes done as they go.
  template <typename Fn>
  void count_pieces(const std::vector<std::string_view>& pieces, size_t bytes, Fn&& meanwhile) {
    if (pieces.size() < 2) {  // no work to share: no threads to start
      for (std::string_view piece : pieces) count_piece(piece, tables_[0]);
      meanwhile();
      read_ += bytes;
      done_ = read_;
      report(/*final=*/false);
      return;
    }
    std::atomic<size_t> next_piece{0};
    size_t running = static_cast<size_t>(threads_);  // under mutex
    std::exception_ptr error;                        // under mutex
    std::mutex mutex;
    std::condition_variable all_done;
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) {
      workers.emplace_back([&, t] {
        try {
          for (size_t i; (i = next_piece.fetch_add(1)) < pieces.size();) {
            count_piece(pieces[i], tables_[t]);
            done_.fetch_add(pieces[i].size(), std::memory_order_relaxed);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex);
          if (!error) error = std::current_exception();
          next_piece = pieces.size();
        }
        std::lock_guard<std::mutex> lock(mutex);
        if (--running == 0) all_done.notify_one();
      });
    }
    try {
      meanwhile();
    } catch (...) {
      next_piece = pieces.size();
      for (auto& w : workers) w.join();
      throw;
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      while (!all_done.wait_for(lock, std::chrono::milliseconds(50), [&] { return running == 0; })) {
        lock.unlock();
        report(/*final=*/false);
        lock.lock();
      }
    }
    for (auto& w : workers) w.join();
    if (error) std::rethrow_exception(error);
    // The bytes between pieces (the special tokens) count as read too.
    read_ += bytes;
    done_ = read_;
    report(/*final=*/false);
  }

  void report(bool final) {
    if (!params_.progress) return;
    const uint64_t done = done_.load(std::memory_order_relaxed);
    if (!final && done - shown_ < std::max<uint64_t>(1, total_ / 1000)) return;
    shown_ = done;
    params_.progress({.stage = BpeTrainProgress::Stage::Counting, .done = done, .total = total_});
  }

  const BpeTrainParams& params_;
  int threads_;
  std::vector<PretokenTable> tables_;
  size_t max_special_ = 0;
  uint64_t total_ = 0, read_ = 0, shown_ = 0;
  std::atomic<uint64_t> done_{0};
};

}  // namespace

std::vector<WordCount> bpe_count_text(std::string_view text, const BpeTrainParams& params) {
  bpe_train_check_params(params);
  Counter counter(params, text.size());
  size_t at = 0;
  counter.count_text(
      [&](char* dst, size_t n) {
        n = std::min(n, text.size() - at);
        std::memcpy(dst, text.data() + at, n);
        at += n;
        return n;
      },
      text.size());
  return counter.result();
}

std::vector<WordCount> bpe_count_files(const std::vector<std::string>& paths, const BpeTrainParams& params) {
  bpe_train_check_params(params);
  uint64_t total = 0;
  for (const std::string& path : paths) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += static_cast<uint64_t>(st.st_size);
  }
  Counter counter(params, total);
  for (const std::string& path : paths) {
    const int fd = open_for_reading(path, "text", /*wait_for_writer=*/true);
    try {
      struct stat st {};
      const size_t expect = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : SIZE_MAX;
      counter.count_text(
          [&](char* dst, size_t n) {
            for (;;) {
              const ssize_t got = ::read(fd, dst, n);
              if (got >= 0) return static_cast<size_t>(got);
              TS_CHECK(errno == EINTR, "text: cannot read ", path, ": ", std::strerror(errno));
            }
          },
          expect);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  return counter.result();
}

BpeModel bpe_train_text(std::string_view text, const BpeTrainParams& params) {
  bpe_train_check_params(params);
  return bpe_train_counts(bpe_count_text(text, params), params);
}

BpeModel bpe_train_files(const std::vector<std::string>& paths, const BpeTrainParams& params) {
  bpe_train_check_params(params);
  return bpe_train_counts(bpe_count_files(paths, params), params);
}

}  // namespace tessera
