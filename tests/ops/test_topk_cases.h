// The beam top-k's test matrix, shared by the CPU tests (tests/ops/test_topk.cpp) and the GPU tests
// (tests/cuda/test_topk_cuda.cpp): row kinds, V and k, f32 and bf16, and a full-sort check written plainly here.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/ops/topk/topk.h"

namespace tessera::test {

enum class RowKind { Random, Tied, Constant, AllNegative, OneHot, InfMasked, NanBearing, Adversarial };
inline constexpr RowKind kRowKinds[] = {RowKind::Random, RowKind::Tied,      RowKind::Constant,   RowKind::AllNegative,
                                        RowKind::OneHot, RowKind::InfMasked, RowKind::NanBearing, RowKind::Adversarial};
inline const char* row_kind_name(RowKind k) {
  static const char* names[] = {"random",  "tied",       "constant", "all-negative",
                                "one-hot", "inf-masked", "nan",      "adversarial"};
  return names[static_cast<int>(k)];
}
inline constexpr int kTopkKs[] = {1, 2, 3, 4, 8, 16, 32};
// V = k - 1 is added per k (a row with fewer columns than k).
inline constexpr int kTopkVs[] = {1, 31, 1023, 1025, 30000, 50257};

// The matrix, sampled so that the suite stays fast: every (kind, k) for V up to 1025, a rotating fifth of them for
// the vocab-sized rows.
inline bool topk_case_sampled(int v_index, int kind, int k_index) {
  return kTopkVs[v_index] <= 1025 || (kind + k_index + v_index) % 5 == 0;
}

struct TopkInput {
  BeamTopkParams p;
  DType dtype = DType::F32;
  std::vector<float> x;       // the logits as f32 (bf16-rounded when dtype is bf16), rows ld apart
  std::vector<uint16_t> x16;  // the bf16 storage when dtype is bf16
  std::vector<float> beam;    // beam_scores (B*K)
  const void* data() const { return dtype == DType::BF16 ? static_cast<const void*>(x16.data()) : x.data(); }
};

// Rows of `kind`; the padding columns [V, ld) hold a huge sentinel that would win if it were read.
inline TopkInput make_topk_input(BeamTopkParams p, RowKind kind, DType dtype, std::mt19937_64& rng) {
  TopkInput in;
  in.p = p;
  in.dtype = dtype;
  const int64_t ld = p.row_stride(), rows = static_cast<int64_t>(p.B) * p.K;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  in.x.assign(rows * ld, 1e30f);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int> col(0, p.V - 1), small(0, 3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const bool equal_beams = kind == RowKind::Tied || kind == RowKind::Constant || kind == RowKind::OneHot;
  in.beam.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = in.x.data() + r * ld;
    for (int j = 0; j < p.V; ++j) {
      switch (kind) {
        case RowKind::Random:
        case RowKind::InfMasked:
        case RowKind::NanBearing: row[j] = nd(rng); break;
        case RowKind::Tied: row[j] = 0.5f * small(rng); break;
        case RowKind::Constant: row[j] = 1.5f; break;
        case RowKind::AllNegative: row[j] = -100.0f - 10.0f * u(rng); break;
        case RowKind::OneHot: row[j] = 0.0f; break;
        case RowKind::Adversarial: row[j] = 0.01f * nd(rng); break;
      }
    }
    if (kind == RowKind::OneHot) row[col(rng)] = 10.0f;
    if (kind == RowKind::InfMasked) {  // a few finite columns, fewer than k for most k
      for (int j = 0; j < p.V; ++j) row[j] = -inf;
      for (int i = 0; i < 3; ++i) row[col(rng)] = nd(rng);
    }
    if (kind == RowKind::NanBearing) {  // NaN in place of the largest columns too
      for (int i = 0; i < 5 && p.V > 1; ++i) row[col(rng)] = nan;
      row[0] = nan;
      for (int j = 1; j < p.V; j += 97) row[j] = 50.0f;
      row[p.V - 1] = nan;
    }
    if (kind == RowKind::Adversarial)  // every winner in one group, for every power-of-two group count up to a block
      for (int i = 0; i * kTopkThreads < p.V && i < 40; ++i) row[i * kTopkThreads] = 20.0f + i;
    in.beam[r] = equal_beams ? 0.0f : nd(rng);
    // At step 0 only beam 0 expands: the other beams' scores are -inf.
    if (kind == RowKind::Random && r % p.K != 0 && (r / p.K) % 2 == 1) in.beam[r] = -inf;
  }
  if (dtype == DType::BF16) {
    in.x16.resize(in.x.size());
    for (size_t i = 0; i < in.x.size(); ++i) {
      in.x16[i] = f32_to_bf16(in.x[i]);
      in.x[i] = bf16_to_f32(in.x16[i]);
    }
  }
  return in;
}

// The check written plainly: every selectable key of entry b (recomputed from x, lse and the beam scores), sorted
// by key descending and index ascending; `scores` and `indices` (B, k) must equal its first k exactly, then pads.
// Also checks the multiset of scores alone (what any correct top-k shares under ties).
inline void expect_full_sort(const TopkInput& in, const std::vector<float>& lse, const std::vector<float>& scores,
                             const std::vector<int32_t>& indices, const std::string& what) {
  const BeamTopkParams& p = in.p;
  for (int b = 0; b < p.B; ++b) {
    std::vector<std::pair<float, int32_t>> all;
    for (int beam = 0; beam < p.K; ++beam) {
      const int64_t r = static_cast<int64_t>(b) * p.K + beam;
      for (int j = 0; j < p.V; ++j) {
        const float key = in.beam[r] + (in.x[r * p.row_stride() + j] - lse[r]);
        if (key > -std::numeric_limits<float>::infinity()) all.push_back({-key, beam * p.V + j});
      }
    }
    std::sort(all.begin(), all.end());
    std::vector<float> want_multiset, got_multiset;
    for (int i = 0; i < p.k; ++i) {
      const size_t o = static_cast<size_t>(b) * p.k + i;
      const bool has = i < static_cast<int>(all.size());
      const float want_s = has ? -all[i].first : -std::numeric_limits<float>::infinity();
      const int32_t want_i = has ? all[i].second : -1;
      ASSERT_EQ(scores[o], want_s) << what << " entry " << b << " rank " << i;
      ASSERT_EQ(indices[o], want_i) << what << " entry " << b << " rank " << i;
      want_multiset.push_back(want_s);
      got_multiset.push_back(scores[o]);
    }
    std::sort(want_multiset.begin(), want_multiset.end());
    std::sort(got_multiset.begin(), got_multiset.end());
    ASSERT_EQ(want_multiset, got_multiset) << what << " entry " << b;
  }
}

}  // namespace tessera::test
