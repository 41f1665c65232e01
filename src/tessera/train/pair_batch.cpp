#include "tessera/train/pair_batch.h"

#include <algorithm>
#include <numeric>

#include "tessera/core/error.h"
#include "tessera/core/splitmix.h"

namespace tessera {

namespace {
// A pair's cost alone: its own padded tokens, max(source, target + 1).
int64_t pair_cost(uint32_t s, uint32_t t) { return std::max<int64_t>(s, int64_t{t} + 1); }
}  // namespace

std::vector<std::vector<uint32_t>> plan_pair_batches(std::span<const uint32_t> source_len,
                                                     std::span<const uint32_t> target_len,
                                                     const PairBatchParams& params, uint64_t epoch) {
  const size_t n = source_len.size();
  TS_CHECK(target_len.size() == n, "plan_pair_batches: ", n, " source lengths and ", target_len.size(),
           " target lengths");
  TS_CHECK(n <= UINT32_MAX, "plan_pair_batches: more than 2^32 - 1 pairs");
  TS_CHECK(params.max_tokens >= 1, "--max-tokens must be at least 1, got ", params.max_tokens);
  for (size_t i = 0; i < n; ++i)
    TS_CHECK(pair_cost(source_len[i], target_len[i]) <= params.max_tokens, "pair ", i, " (source ", source_len[i],
             " tokens, target ", target_len[i], " + 1) is longer than --max-tokens ", params.max_tokens,
             " alone: raise --max-tokens, or drop the pair");
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  SplitMix64 rng = splitmix_stream(params.seed, epoch);
  shuffle_splitmix(std::span<uint32_t>(order), rng);

  const size_t window = params.sort_window == 0 ? std::max<size_t>(n, 1) : params.sort_window;
  for (size_t w = 0; w < n; w += window) {
    const auto begin = order.begin() + static_cast<std::ptrdiff_t>(w);
    const auto end = order.begin() + static_cast<std::ptrdiff_t>(std::min(n, w + window));
    std::stable_sort(begin, end, [&](uint32_t a, uint32_t b) {
      const int64_t ca = pair_cost(source_len[a], target_len[a]), cb = pair_cost(source_len[b], target_len[b]);
      if (ca != cb) return ca < cb;
      if (source_len[a] != source_len[b]) return source_len[a] < source_len[b];
      return target_len[a] < target_len[b];
    });
  }
  // Greedy, in that order: a pair joins the batch while (rows + 1) · max(S, T) still fits.
  std::vector<std::vector<uint32_t>> batches;
  std::vector<uint32_t> batch;
  int64_t longest = 0;
  for (const uint32_t i : order) {
    const int64_t c = pair_cost(source_len[i], target_len[i]);
    if (!batch.empty() && static_cast<int64_t>(batch.size() + 1) * std::max(longest, c) > params.max_tokens) {
      batches.push_back(std::move(batch));
      batch.clear();
      longest = 0;
    }
    batch.push_back(i);
    longest = std::max(longest, c);
  }
  if (!batch.empty()) batches.push_back(std::move(batch));
  shuffle_splitmix(std::span<std::vector<uint32_t>>(batches), rng);
  return batches;
}

PairBatch make_pair_batch(const PairShard& shard, std::span<const uint32_t> pairs, const PairBatchParams& params) {
  PairBatch b;
  b.B = static_cast<int>(pairs.size());
  b.pairs.assign(pairs.begin(), pairs.end());
  for (const uint32_t i : pairs) {
    TS_CHECK(i < shard.size(), "make_pair_batch: pair ", i, " of a shard of ", shard.size());
    b.S = std::max<int>(b.S, static_cast<int>(shard.source_len(i)));
    b.T = std::max<int>(b.T, static_cast<int>(shard.target_len(i)) + 1);
  }
  const size_t rows = pairs.size();
  b.source.assign(rows * b.S, params.pad_id);
  b.dec_in.assign(rows * b.T, params.pad_id);
  b.dec_out.assign(rows * b.T, params.pad_id);
  b.source_len.resize(rows);
  b.target_len.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    const uint32_t i = pairs[r];
    const uint32_t s = shard.source_len(i), t = shard.target_len(i);
    shard.copy_source(i, &b.source[r * b.S]);
    int32_t* in = &b.dec_in[r * b.T];
    int32_t* out = &b.dec_out[r * b.T];
    in[0] = params.bos_id;
    shard.copy_target(i, in + 1);
    shard.copy_target(i, out);
    out[t] = params.eos_id;
    b.source_len[r] = static_cast<int32_t>(s);
    b.target_len[r] = static_cast<int32_t>(t + 1);
  }
  return b;
}

PairBatcher::PairBatcher(const PairShard& shard, const PairBatchParams& params) : shard_(shard), params_(params) {
  TS_CHECK(shard.size() > 0, "paired shard ", shard.path(), " holds no pairs");
  source_len_.resize(shard.size());
  target_len_.resize(shard.size());
  for (size_t i = 0; i < shard.size(); ++i) {
    source_len_[i] = shard.source_len(i);
    target_len_[i] = shard.target_len(i);
  }
  plan_ = plan_pair_batches(source_len_, target_len_, params_, epoch_);
}

PairBatch PairBatcher::next() {
  if (index_ == plan_.size()) set_position(epoch_ + 1, 0);
  return make_pair_batch(shard_, plan_[index_++], params_);
}

void PairBatcher::set_position(uint64_t epoch, size_t batch) {
  if (epoch != epoch_) plan_ = plan_pair_batches(source_len_, target_len_, params_, epoch);
  epoch_ = epoch;
  TS_CHECK(batch <= plan_.size(), "data position: batch ", batch, " of an epoch of ", plan_.size());
  index_ = batch;
}

}  // namespace tessera
