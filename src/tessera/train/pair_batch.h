// tessera/train/pair_batch.h — token-based batching over a paired shard, for the encoder-decoder.
//
// A batch is as many pairs as fit `max_tokens` padded tokens, as fairseq's --max-tokens counts them: a batch of n
// pairs costs n · max(S, T), where S is its longest source and T its longest decoder sequence (the target's tokens
// + 1: the decoder reads BOS + target and predicts target + EOS). A pair that alone costs more than max_tokens is
// an Error naming it.
//
// An epoch (plan_pair_batches), deterministic for (seed, epoch):
//   1. the pairs are shuffled (SplitMix64, core/splitmix.h: the same on every platform);
//   2. cut into windows of sort_window pairs, each sorted by length (the cost max(source, target + 1), then the
//      source's length, then the target's; ties keep the shuffled order), so that pairs of similar length share a
//      batch and little of it is padding;
//   3. the windows, one after the other, are cut greedily into batches that fit max_tokens (only the batch that
//      straddles two windows mixes lengths; with sort_window 1 nothing is sorted, and the batches are as unsorted
//      batching makes them);
//   4. the batches are shuffled, so that an epoch does not run from short pairs to long.
// Every pair is in exactly one batch of the epoch.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/train/pair_data.h"

namespace tessera {

// Pairs sorted together: a window this many times larger than a batch leaves next to no padding, and the shuffle
// before it still varies which pairs meet from one epoch to the next.
constexpr size_t kPairSortWindow = size_t{1} << 16;

struct PairBatchParams {
  int64_t max_tokens = 4096;
  size_t sort_window = kPairSortWindow;  // pairs; 0: the whole epoch is one window, 1: no sorting
  uint64_t seed = 0;
  // The model's ids: padding, the decoder's start token (BOS, or BART's decoder-start), and EOS.
  int32_t pad_id = 0, bos_id = 1, eos_id = 2;
};

// The epoch's batches, each the indices of its pairs (in length order), in the order they are to run.
// source_len[i] and target_len[i] are pair i's token counts (each >= 1).
std::vector<std::vector<uint32_t>> plan_pair_batches(std::span<const uint32_t> source_len,
                                                     std::span<const uint32_t> target_len,
                                                     const PairBatchParams& params, uint64_t epoch);

// A padded batch of B pairs, row-major:
//   source  (B, S): pair b's source, then pad_id;     source_len (B): its tokens
//   dec_in  (B, T): bos_id, pair b's target, then pad_id
//   dec_out (B, T): pair b's target, eos_id, then pad_id;  target_len (B): its target's tokens + 1 (BOS or EOS)
// with S the longest source and T the longest target + 1.
struct PairBatch {
  int B = 0, S = 0, T = 0;
  std::vector<uint32_t> pairs;  // the shard's index of each row
  std::vector<int32_t> source, source_len;
  std::vector<int32_t> dec_in, dec_out, target_len;
  // B · max(S, T): what max_tokens bounds.
  int64_t padded_tokens() const { return static_cast<int64_t>(B) * (S > T ? S : T); }
};
PairBatch make_pair_batch(const PairShard& shard, std::span<const uint32_t> pairs, const PairBatchParams& params);

// The batches of a shard, epoch after epoch (the shard must outlive it). The position (epoch, batch) is the
// resumable data state.
class PairBatcher {
 public:
  PairBatcher(const PairShard& shard, const PairBatchParams& params);
  // The next batch; after an epoch's last, the next epoch is planned.
  PairBatch next();
  uint64_t epoch() const { return epoch_; }
  size_t batch_index() const { return index_; }
  size_t batches_in_epoch() const { return plan_.size(); }
  void set_position(uint64_t epoch, size_t batch);

 private:
  const PairShard& shard_;
  PairBatchParams params_;
  std::vector<uint32_t> source_len_, target_len_;
  std::vector<std::vector<uint32_t>> plan_;
  uint64_t epoch_ = 0;
  size_t index_ = 0;
};

}  // namespace tessera
