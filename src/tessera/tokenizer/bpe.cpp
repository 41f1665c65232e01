// Byte-level BPE: the merge loop, the pre-token cache and the special-token cut (bpe.h).
//
// Hot path, per pre-token: one cut (gpt2_pretoken_length), one hash of its bytes and a probe of the thread's cache;
// only a pre-token not seen before runs the merge loop, whose pair lookups probe an open-addressing table keyed by
// the id pair. Nothing on that path allocates once the cache's arenas have grown.
#include "tessera/tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "tessera/core/error.h"
#include "tessera/tokenizer/pretokenize.h"
#include "tessera/tokenizer/unicode_classes.h"

namespace tessera {
namespace {

inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

// A hash of a short byte string, 8 bytes a step.
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xc4ceb9fe1a85ec53ULL);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix(h ^ w);
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return mix(h ^ w);
}

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string show_bytes(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

constexpr int32_t kNoRank = INT32_MAX;
constexpr size_t kShortPiece = 64;            // pre-tokens up to this many bytes merge in arrays on the stack
constexpr size_t kCacheMaxPiece = 48;         // longer pre-tokens are rare and not cached
constexpr size_t kCacheFirstSlots = 1 << 10;  // open addressing, at most half full, doubled as it fills
constexpr size_t kCacheMaxSlots = 1 << 18;    // past half of these the cache starts again empty

}  // namespace

// The merges, as an open-addressing table: pair_key(left, right) -> (rank, merged id).
struct BpeTokenizer::Tables {
  struct PairSlot {
    uint64_t key = ~uint64_t{0};
    int32_t rank = kNoRank;
    int32_t merged = -1;
  };
  std::vector<PairSlot> pairs;
  uint64_t pair_mask = 0;
  int32_t byte_id[256];
  // Specials, longest first, so that the first to match at a position is the longest.
  std::vector<std::pair<std::string, int32_t>> specials;
  bool special_first_byte[256] = {};

  const PairSlot* find_pair(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (uint64_t i = mix(key) & pair_mask;; i = (i + 1) & pair_mask) {
      const PairSlot& s = pairs[i];
      if (s.key == key) return &s;
      if (s.key == ~uint64_t{0}) return nullptr;
    }
  }
  int32_t rank_of(int32_t left, int32_t right, int32_t* merged) const {
    const PairSlot* s = find_pair(left, right);
    if (!s) return kNoRank;
    *merged = s->merged;
    return s->rank;
  }
};

// The thread's cache: pre-token bytes -> ids, in arenas, with an open-addressing index; cleared whole when full.
struct BpeEncodeState::Impl {
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, ids_len = 0;  // key_len 0: empty
  };
  const void* owner = nullptr;  // the tables the cached ids belong to
  std::vector<Slot> slots;
  std::string keys;
  std::vector<int32_t> ids;
  size_t entries = 0;
  // The merge loop's scratch for long pre-tokens.
  std::vector<int32_t> tok, prev, next;
  struct HeapEntry {
    int32_t rank, pos, left, right;
    bool operator>(const HeapEntry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<HeapEntry> heap;

  void reset(const void* tables) {
    owner = tables;
    slots.assign(kCacheFirstSlots, Slot{});
    keys.clear();
    ids.clear();
    entries = 0;
  }
  size_t mask() const { return slots.size() - 1; }
  Slot& free_slot(uint64_t h) {
    size_t i = h & mask();
    while (slots[i].key_len != 0) i = (i + 1) & mask();
    return slots[i];
  }
  const Slot* find(std::string_view key, uint64_t h) const {
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots[i];
      if (s.key_len == 0) return nullptr;
      if (s.hash == h && s.key_len == key.size() && std::memcmp(keys.data() + s.key_off, key.data(), key.size()) == 0)
        return &s;
    }
  }
  void insert(std::string_view key, uint64_t h, const int32_t* v, size_t n) {
    if (2 * (entries + 1) > slots.size()) {
      if (slots.size() >= kCacheMaxSlots) {
        reset(owner);
      } else {
        std::vector<Slot> old(slots.size() * 2);
        old.swap(slots);
        for (const Slot& o : old)
          if (o.key_len != 0) free_slot(o.hash) = o;
      }
    }
    Slot& s = free_slot(h);
    s.hash = h;
    s.key_off = static_cast<uint32_t>(keys.size());
    s.key_len = static_cast<uint16_t>(key.size());
    s.ids_off = static_cast<uint32_t>(ids.size());
    s.ids_len = static_cast<uint16_t>(n);
    keys.append(key);
    ids.insert(ids.end(), v, v + n);
    ++entries;
  }
};

BpeEncodeState::BpeEncodeState() : impl_(new Impl) {}
BpeEncodeState::~BpeEncodeState() { delete impl_; }

BpeTokenizer::BpeTokenizer(BpeModel model, const std::string& source) : model_(std::move(model)) {
  auto t = std::make_unique<Tables>();
  const auto& tokens = model_.tokens;
  const auto n = static_cast<int64_t>(tokens.size());
  TS_CHECK(n > 0 && n < INT32_MAX, source, ": the vocab has ", n, " tokens");
  std::vector<bool> special(tokens.size(), false);
  for (int32_t id : model_.special_ids) {
    TS_CHECK(id >= 0 && id < n, source, ": special token id ", id, " is outside the vocab of ", n);
    TS_CHECK(!special[id], source, ": special token id ", id, " is listed twice");
    TS_CHECK(!tokens[id].empty(), source, ": special token ", id, " is empty");
    special[id] = true;
    t->specials.emplace_back(tokens[id], id);
  }
  // Ordinary tokens by bytes: each is distinct.
  std::unordered_map<std::string_view, int32_t> by_bytes;
  by_bytes.reserve(tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    if (special[id]) continue;
    TS_CHECK(!tokens[id].empty(), source, ": token ", id, " is empty");
    const auto [it, fresh] = by_bytes.emplace(tokens[id], id);
    TS_CHECK(fresh, source, ": tokens ", it->second, " and ", id, " are the same bytes '", show_bytes(tokens[id]), "'");
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const auto f = by_bytes.find(std::string_view(&c, 1));
    TS_CHECK(f != by_bytes.end(), source, ": byte 0x", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15],
             " is missing from the base vocab (byte-level BPE needs all 256 bytes as tokens)");
    t->byte_id[b] = f->second;
  }
  size_t cap = 16;
  while (cap < model_.merges.size() * 2) cap <<= 1;
  t->pairs.assign(cap, Tables::PairSlot{});
  t->pair_mask = cap - 1;
  for (size_t r = 0; r < model_.merges.size(); ++r) {
    const auto [l, rr] = model_.merges[r];
    TS_CHECK(l >= 0 && l < n && rr >= 0 && rr < n, source, ": merge ", r, " (", l, ", ", rr,
             ") names a token outside the vocab of ", n);
    TS_CHECK(!special[l] && !special[rr], source, ": merge ", r, " merges a special token");
    const std::string joined = tokens[l] + tokens[rr];
    const auto f = by_bytes.find(joined);
    TS_CHECK(f != by_bytes.end(), source, ": merge ", r, " makes '", show_bytes(joined),
             "', which is not in the vocab");
    const uint64_t key = pair_key(l, rr);
    uint64_t i = mix(key) & t->pair_mask;
    while (t->pairs[i].key != ~uint64_t{0} && t->pairs[i].key != key) i = (i + 1) & t->pair_mask;
    TS_CHECK(t->pairs[i].key != key, source, ": merge ", r, " ('", show_bytes(tokens[l]), "' '", show_bytes(tokens[rr]),
             "') repeats merge ", t->pairs[i].rank);
    t->pairs[i] = {key, static_cast<int32_t>(r), f->second};
  }
  std::stable_sort(t->specials.begin(), t->specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [text, id] : t->specials) t->special_first_byte[static_cast<uint8_t>(text[0])] = true;
  tables_ = t.release();
}

BpeTokenizer::~BpeTokenizer() { delete tables_; }
BpeTokenizer::BpeTokenizer(BpeTokenizer&& o) noexcept : model_(std::move(o.model_)), tables_(o.tables_) {
  o.tables_ = nullptr;
}
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&& o) noexcept {
  if (this != &o) {
    delete tables_;
    model_ = std::move(o.model_);
    tables_ = o.tables_;
    o.tables_ = nullptr;
  }
  return *this;
}

int32_t BpeTokenizer::special_id(std::string_view text) const {
  for (const auto& [t, id] : tables_->specials)
    if (t == text) return id;
  return -1;
}

namespace {

// Merges ids[0, m) in place (lowest rank first, leftmost first among equals); returns the new count. Arrays of
// kShortPiece on the caller's stack: ranks[i] is the rank of the pair (ids[i], ids[i + 1]), merged[i] its result.
template <typename Tables>
size_t merge_short(const Tables& t, int32_t* ids, size_t m) {
  int32_t ranks[kShortPiece], merged[kShortPiece];
  for (size_t i = 0; i + 1 < m; ++i) ranks[i] = t.rank_of(ids[i], ids[i + 1], &merged[i]);
  while (m > 1) {
    size_t best = 0;
    int32_t best_rank = ranks[0];
    for (size_t i = 1; i + 1 < m; ++i)
      if (ranks[i] < best_rank) best_rank = ranks[i], best = i;
    if (best_rank == kNoRank) break;
    ids[best] = merged[best];
    const size_t tail = m - best - 2;  // elements after best + 1
    std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(int32_t));
    std::memmove(ranks + best + 1, ranks + best + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
    std::memmove(merged + best + 1, merged + best + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
    --m;
    if (best + 1 < m) ranks[best] = t.rank_of(ids[best], ids[best + 1], &merged[best]);
    if (best > 0) ranks[best - 1] = t.rank_of(ids[best - 1], ids[best], &merged[best - 1]);
  }
  return m;
}

}  // namespace

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out, BpeEncodeState& state) const {
  const Tables& t = *tables_;
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(t.byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  BpeEncodeState::Impl& s = state.impl();
  if (s.owner != tables_) s.reset(tables_);
  uint64_t h = 0;
  if (n <= kCacheMaxPiece) {
    h = hash_bytes(piece.data(), n);
    if (const auto* hit = s.find(piece, h)) {
      out.insert(out.end(), s.ids.begin() + hit->ids_off, s.ids.begin() + hit->ids_off + hit->ids_len);
      return;
    }
  }
  if (n <= kShortPiece) {
    int32_t ids[kShortPiece];
    for (size_t i = 0; i < n; ++i) ids[i] = t.byte_id[static_cast<uint8_t>(piece[i])];
    const size_t m = merge_short(t, ids, n);
    out.insert(out.end(), ids, ids + m);
    if (n <= kCacheMaxPiece) s.insert(piece, h, ids, m);
    return;
  }
  // A long pre-token (a run of spaces, a long word): a linked list with a min-heap of (rank, position), entries
  // checked when popped, so the whole loop is O(n log n) rather than the O(n^2) of the scan above.
  s.tok.resize(n);
  s.prev.resize(n);
  s.next.resize(n);
  s.heap.clear();
  using E = BpeEncodeState::Impl::HeapEntry;
  const auto cmp = [](const E& a, const E& b) { return a > b; };
  const auto push_pair = [&](int32_t pos) {
    const int32_t nx = s.next[pos];
    if (nx < 0) return;
    int32_t merged = 0;
    const int32_t r = t.rank_of(s.tok[pos], s.tok[nx], &merged);
    if (r == kNoRank) return;
    s.heap.push_back({r, pos, s.tok[pos], s.tok[nx]});
    std::push_heap(s.heap.begin(), s.heap.end(), cmp);
  };
  for (size_t i = 0; i < n; ++i) {
    s.tok[i] = t.byte_id[static_cast<uint8_t>(piece[i])];
    s.prev[i] = static_cast<int32_t>(i) - 1;
    s.next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i));
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), cmp);
    const E e = s.heap.back();
    s.heap.pop_back();
    // Stale: the left element was merged away (tok -1) or changed, or its right neighbour did.
    const int32_t nx = s.next[e.pos];
    if (s.tok[e.pos] != e.left || nx < 0 || s.tok[nx] != e.right) continue;
    int32_t merged = 0;
    t.rank_of(e.left, e.right, &merged);
    s.tok[e.pos] = merged;
    s.tok[nx] = -1;
    s.next[e.pos] = s.next[nx];
    if (s.next[nx] >= 0) s.prev[s.next[nx]] = e.pos;
    if (s.prev[e.pos] >= 0) push_pair(s.prev[e.pos]);
    push_pair(e.pos);
  }
  for (int32_t i = 0; i >= 0; i = s.next[i]) out.push_back(s.tok[i]);
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out, BpeEncodeState& state) const {
  while (!text.empty()) {
    const size_t len = gpt2_pretoken_length(text);
    encode_piece(text.substr(0, len), out, state);
    text.remove_prefix(len);
  }
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out, BpeEncodeState& state) const {
  encode_text(text, out, state);
}

void BpeTokenizer::encode(std::string_view text, const AllowedSpecial& allowed, std::vector<int32_t>& out,
                          BpeEncodeState& state) const {
  const Tables& t = *tables_;
  if (t.specials.empty()) return encode_text(text, out, state);
  std::vector<bool> ok(t.specials.size(), allowed.all);
  for (const std::string& a : allowed.texts) {
    bool known = false;
    for (size_t k = 0; k < t.specials.size(); ++k)
      if (t.specials[k].first == a) ok[k] = known = true;
    TS_CHECK(known, "'", show_bytes(a), "' is not a special token of this tokenizer");
  }
  size_t start = 0;  // the text not yet encoded begins here
  for (size_t i = 0; i < text.size(); ++i) {
    if (!t.special_first_byte[static_cast<uint8_t>(text[i])]) continue;
    for (size_t k = 0; k < t.specials.size(); ++k) {
      const std::string& sp = t.specials[k].first;
      if (text.compare(i, sp.size(), sp) != 0) continue;
      TS_CHECK(ok[k], "the text holds the special token '", show_bytes(sp), "' at byte ", i,
               ", which is not allowed (allow it, or encode it as ordinary text)");
      encode_text(text.substr(start, i - start), out, state);
      out.push_back(t.specials[k].second);
      i += sp.size() - 1;
      start = i + 1;
      break;
    }
  }
  encode_text(text.substr(start), out, state);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, const AllowedSpecial& allowed) const {
  BpeEncodeState state;
  std::vector<int32_t> out;
  encode(text, allowed, out, state);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
  BpeEncodeState state;
  std::vector<int32_t> out;
  encode_ordinary(text, out, state);
  return out;
}

void BpeTokenizer::decode_append(int32_t id, std::string& out) const {
  TS_CHECK(id >= 0 && static_cast<size_t>(id) < model_.tokens.size(), "token id ", id, " is outside the vocab of ",
           model_.tokens.size());
  out += model_.tokens[id];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) decode_append(id, out);
  return out;
}

namespace {

// Whether p[0, n) is the start of a valid UTF-8 sequence that needs more bytes than n.
bool utf8_incomplete(const uint8_t* p, size_t n) {
  const uint8_t b0 = p[0];
  size_t need = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) need = 3;
  else if (b0 >= 0xF0 && b0 <= 0xF4) need = 4;
  if (need == 0 || n >= need) return false;
  for (size_t i = 1; i < n; ++i)
    if ((p[i] & 0xC0) != 0x80) return false;
  if (n >= 2) {
    if (b0 == 0xE0 && p[1] < 0xA0) return false;
    if (b0 == 0xED && p[1] > 0x9F) return false;
    if (b0 == 0xF0 && p[1] < 0x90) return false;
    if (b0 == 0xF4 && p[1] > 0x8F) return false;
  }
  return true;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
  tok_->decode_append(id, pending_);
  const auto* p = reinterpret_cast<const uint8_t*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    uint32_t cp = 0;
    const size_t len = utf8_decode(p + i, n - i, &cp);
    if (cp == kInvalidCodePoint && utf8_incomplete(p + i, n - i)) break;  // wait for the rest of the character
    i += len;
  }
  std::string ready = pending_.substr(0, i);
  pending_.erase(0, i);
  return ready;
}

std::string StreamDecoder::finish() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace tessera
