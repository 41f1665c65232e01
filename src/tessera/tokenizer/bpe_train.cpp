// tessera/tokenizer/bpe_train.cpp — stage 2 of BPE training: the merges, with incremental pair counts (see
// bpe_train.h for the rules).
#include "tessera/tokenizer/bpe_train.h"

#include <algorithm>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "tessera/core/error.h"

namespace tessera {

void bpe_train_check_params(const BpeTrainParams& p) {
  std::unordered_set<std::string> seen;
  for (const std::string& s : p.special_tokens) {
    TS_CHECK(!s.empty(), "BPE training: a special token is empty");
    TS_CHECK(seen.insert(s).second, "BPE training: the special token '", s, "' is given twice");
  }
  const int64_t min_vocab = 256 + static_cast<int64_t>(p.special_tokens.size());
  TS_CHECK(p.vocab_size >= min_vocab, "BPE training: vocab size ", p.vocab_size, " is below the 256 bytes",
           p.special_tokens.empty() ? "" : " and the special tokens", " (at least ", min_vocab, ")");
  TS_CHECK(p.threads >= 0, "BPE training: threads must be >= 0 (0: every core), got ", p.threads);
  TS_CHECK(p.block_bytes > 0, "BPE training: the block size must be > 0");
}

namespace {

// An open-addressing table from a pair (x, y) of symbol ids to a dense pair index (linear probing, power-of-two
// capacity, kept at most half full). Pairs are never removed: a pair whose count fell to 0 keeps its index.
class PairIndex {
 public:
  PairIndex() : keys_(1024, kEmpty), vals_(1024, -1) {}
  // The pair's index; a new pair gets `next` (the caller's table size) and *added is set.
  int32_t find_or_add(int32_t x, int32_t y, int32_t next, bool* added) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    const uint64_t key = pack(x, y);
    size_t i = slot(key);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == key) {
        *added = false;
        return vals_[i];
      }
      i = (i + 1) & (keys_.size() - 1);
    }
    keys_[i] = key;
    vals_[i] = next;
    ++size_;
    *added = true;
    return next;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair packs to it: ids are < 2^31
  static uint64_t pack(int32_t x, int32_t y) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(x)) << 32) | static_cast<uint32_t>(y);
  }
  size_t slot(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return static_cast<size_t>(h) & (keys_.size() - 1);
  }
  void grow() {
    std::vector<uint64_t> keys(keys_.size() * 2, kEmpty);
    std::vector<int32_t> vals(keys_.size() * 2, -1);
    keys.swap(keys_);
    vals.swap(vals_);
    for (size_t j = 0; j < keys.size(); ++j) {
      if (keys[j] == kEmpty) continue;
      size_t i = slot(keys[j]);
      while (keys_[i] != kEmpty) i = (i + 1) & (keys_.size() - 1);
      keys_[i] = keys[j];
      vals_[i] = vals[j];
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> vals_;
  size_t size_ = 0;
};

// A heap entry: the pair's count when it was pushed. It is current while it equals the pair's count; every change
// of a count pushes a new entry, so the current entries hold every pair with a count > 0, and the first current
// entry popped is the best pair.
struct HeapEntry {
  int64_t count;
  int32_t pair;
};

// The merge state: the words (symbol sequences in one flat array, shrinking in place), the pairs and the heap.
class Merger {
 public:
  explicit Merger(std::vector<WordCount> words);
  // Merges until `target` ordinary tokens exist or no pair is left; on_merge(tokens so far) after each merge.
  void run(size_t target, const std::function<void(size_t)>& on_merge);

  std::vector<std::string> tokens;                  // ordinary tokens by internal id: 0..255 the bytes
  std::vector<std::pair<int32_t, int32_t>> merges;  // internal ids

 private:
  // Greater in heap order: the higher count, then the greater (bytes(left), bytes(right)).
  bool heap_less(const HeapEntry& u, const HeapEntry& v) const {
    if (u.count != v.count) return u.count < v.count;
    const std::string& ul = tokens[pair_left_[u.pair]];
    const std::string& vl = tokens[pair_left_[v.pair]];
    if (ul != vl) return ul < vl;  // std::string compares as unsigned char, as Python compares bytes
    return tokens[pair_right_[u.pair]] < tokens[pair_right_[v.pair]];
  }
  // count(x, y) += delta; a positive delta records `word` in the pair's word list.
  void change(int32_t x, int32_t y, int64_t delta, int32_t word);
  // Replaces every (a, b) in `word` by c, left to right, updating the pair counts of its neighbours.
  void merge_word(int32_t word, int32_t a, int32_t b, int32_t c);
  void push_changed();

  std::vector<int32_t> symbols_;
  std::vector<size_t> word_start_;
  std::vector<int32_t> word_len_;
  std::vector<int64_t> word_count_;
  std::vector<int32_t> word_stamp_;  // the merge step that last visited the word (a word list may repeat a word)

  PairIndex pair_index_;
  std::vector<int32_t> pair_left_, pair_right_;
  std::vector<int64_t> pair_count_;
  std::vector<std::vector<int32_t>> pair_words_;  // the words that held the pair at some point (a superset)
  std::vector<int32_t> pair_stamp_;               // the step that last recorded the pair in changed_
  std::vector<int32_t> changed_;
  int32_t step_ = 0;

  std::unordered_map<std::string, int32_t> token_ids_;  // bytes -> internal id, for reuse
  struct HeapLess {
    const Merger* m;
    bool operator()(const HeapEntry& u, const HeapEntry& v) const { return m->heap_less(u, v); }
  };
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapLess> heap_;
};

Merger::Merger(std::vector<WordCount> words) : heap_(HeapLess{this}) {
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    token_ids_.emplace(tokens.back(), b);
  }
  // Sorted, with repeats summed: the word order (and so every tie in the tables below) is fixed by the bytes.
  std::sort(words.begin(), words.end(), [](const WordCount& u, const WordCount& v) { return u.bytes < v.bytes; });
  size_t n_words = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    TS_CHECK(words[i].count > 0, "BPE training: the pre-token count of '", words[i].bytes, "' is ", words[i].count,
             " (must be > 0)");
    if (words[i].bytes.empty()) continue;
    if (n_words > 0 && words[n_words - 1].bytes == words[i].bytes) words[n_words - 1].count += words[i].count;
    else if (n_words++ != i) words[n_words - 1] = std::move(words[i]);
  }
  words.resize(n_words);
  TS_CHECK(n_words < (size_t{1} << 31), "BPE training: more than 2^31 distinct pre-tokens");
  for (const WordCount& w : words) {
    word_start_.push_back(symbols_.size());
    word_len_.push_back(static_cast<int32_t>(w.bytes.size()));
    word_count_.push_back(w.count);
    for (unsigned char ch : w.bytes) symbols_.push_back(ch);
  }
  word_stamp_.assign(n_words, -1);
  for (size_t w = 0; w < n_words; ++w) {
    const int32_t* s = &symbols_[word_start_[w]];
    for (int32_t i = 0; i + 1 < word_len_[w]; ++i) change(s[i], s[i + 1], word_count_[w], static_cast<int32_t>(w));
  }
  push_changed();
}

void Merger::change(int32_t x, int32_t y, int64_t delta, int32_t word) {
  bool added = false;
  const int32_t p = pair_index_.find_or_add(x, y, static_cast<int32_t>(pair_count_.size()), &added);
  if (added) {
    pair_left_.push_back(x);
    pair_right_.push_back(y);
    pair_count_.push_back(0);
    pair_words_.emplace_back();
    pair_stamp_.push_back(-1);
  }
  pair_count_[p] += delta;
  if (delta > 0 && (pair_words_[p].empty() || pair_words_[p].back() != word)) pair_words_[p].push_back(word);
  if (pair_stamp_[p] != step_) {
    pair_stamp_[p] = step_;
    changed_.push_back(p);
  }
}

void Merger::push_changed() {
  for (int32_t p : changed_)
    if (pair_count_[p] > 0) heap_.push({pair_count_[p], p});
  changed_.clear();
}

// Each occurrence at i (s[i] = a, s[i+1] = b) turns (prev, a) into (prev, c) and (b, next) into (c, next), prev
// being the symbol already written (a c when the occurrence before was adjacent) and next the old s[i+2]: over
// "a b a b" that nets (b, a) -1, (c, c) +1, (a, b) -2, which is the old pairs against the new "c c".
void Merger::merge_word(int32_t word, int32_t a, int32_t b, int32_t c) {
  int32_t* s = &symbols_[word_start_[word]];
  const int32_t len = word_len_[word];
  const int64_t n = word_count_[word];
  int32_t out = 0;
  for (int32_t i = 0; i < len;) {
    if (i + 1 < len && s[i] == a && s[i + 1] == b) {
      if (out > 0) {
        change(s[out - 1], a, -n, word);
        change(s[out - 1], c, n, word);
      }
      if (i + 2 < len) {
        change(b, s[i + 2], -n, word);
        change(c, s[i + 2], n, word);
      }
      change(a, b, -n, word);
      s[out++] = c;
      i += 2;
    } else {
      s[out++] = s[i++];
    }
  }
  word_len_[word] = out;
}

void Merger::run(size_t target, const std::function<void(size_t)>& on_merge) {
  while (tokens.size() < target && !heap_.empty()) {
    const HeapEntry top = heap_.top();
    heap_.pop();
    if (top.count != pair_count_[top.pair]) continue;  // stale
    const int32_t pair = top.pair;
    const int32_t a = pair_left_[pair], b = pair_right_[pair];
    std::string bytes = tokens[a] + tokens[b];
    auto [it, is_new] = token_ids_.emplace(bytes, static_cast<int32_t>(tokens.size()));
    if (is_new) tokens.push_back(std::move(bytes));
    const int32_t c = it->second;
    merges.emplace_back(a, b);

    ++step_;
    // Moved out and emptied: this merge adds no word to (a, b)'s list (it makes only pairs with c), and a later one
    // that reuses a token's id may make (a, b) again, in words that the list then records afresh.
    const std::vector<int32_t> words = std::move(pair_words_[pair]);
    pair_words_[pair].clear();
    for (int32_t w : words) {
      if (word_stamp_[w] == step_) continue;
      word_stamp_[w] = step_;
      merge_word(w, a, b, c);
    }
    TS_CHECK(pair_count_[pair] == 0, "BPE training: internal error: the merged pair's count is ", pair_count_[pair],
             " after the merge");
    push_changed();
    if (on_merge) on_merge(tokens.size());
  }
}

}  // namespace

BpeModel bpe_train_counts(std::vector<WordCount> words, const BpeTrainParams& params) {
  bpe_train_check_params(params);
  const size_t n_special = params.special_tokens.size();
  const size_t target = static_cast<size_t>(params.vocab_size) - n_special;  // ordinary tokens wanted
  Merger m(std::move(words));
  const uint64_t to_make = target - 256;
  uint64_t shown = 0;
  auto report = [&](size_t n_tokens) {
    const uint64_t done = n_tokens - 256;
    if (!params.progress || (done < to_make && done - shown < std::max<uint64_t>(1, to_make / 1000))) return;
    shown = done;
    params.progress({.stage = BpeTrainProgress::Stage::Merging, .done = done, .total = to_make});
  };
  m.run(target, report);
  if (params.progress && shown != m.tokens.size() - 256)
    params.progress({.stage = BpeTrainProgress::Stage::Merging, .done = m.tokens.size() - 256, .total = to_make});

  // Internal ids: 0..255 the bytes, then the merged tokens. Final ids put the specials after the bytes, or first.
  const int32_t k = static_cast<int32_t>(n_special);
  auto final_id = [&](int32_t internal) {
    if (params.special_first) return internal + k;
    return internal < 256 ? internal : internal + k;
  };
  BpeModel model;
  model.tokens.resize(m.tokens.size() + n_special);
  for (size_t i = 0; i < m.tokens.size(); ++i) model.tokens[final_id(static_cast<int32_t>(i))] = m.tokens[i];
  for (int32_t i = 0; i < k; ++i) {
    const int32_t id = params.special_first ? i : 256 + i;
    model.tokens[id] = params.special_tokens[i];
    model.special_ids.push_back(id);
  }
  for (const auto& [a, b] : m.merges) model.merges.emplace_back(final_id(a), final_id(b));
  return model;
}

}  // namespace tessera
