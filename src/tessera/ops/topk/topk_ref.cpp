// The beam top-k on the host: the full-sort reference, and HARS's retrieve + re-rank as the kernels run it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/ops/topk/topk.h"

namespace tessera {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float load(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: TS_THROW("beam_topk: logits must be a float dtype, got ", dtype_name(dt));
  }
}

struct Cand {
  float key;
  int32_t index;
};
// The order of the whole op: key descending, then index ascending.
bool before(const Cand& a, const Cand& b) { return a.key > b.key || (a.key == b.key && a.index < b.index); }
bool selectable(float key) { return key > kNegInf; }  // false for NaN and -inf

// The first k of `c` in the op's order, padded with (-inf, -1).
void take_top(std::vector<Cand>& c, int k, float* scores, int32_t* indices) {
  std::sort(c.begin(), c.end(), before);
  for (int i = 0; i < k; ++i) {
    const bool has = i < static_cast<int>(c.size());
    scores[i] = has ? c[i].key : kNegInf;
    indices[i] = has ? c[i].index : -1;
  }
}

}  // namespace

void beam_topk_lse_ref(const BeamTopkParams& p, DType dtype, float* lse, const void* logits) {
  const int64_t ld = p.row_stride();
  for (int64_t r = 0; r < static_cast<int64_t>(p.B) * p.K; ++r) {
    double m = -INFINITY;
    for (int j = 0; j < p.V; ++j) {
      const float x = load(dtype, logits, r * ld + j);
      if (!std::isnan(x)) m = std::max(m, static_cast<double>(x));
    }
    double s = 0;
    if (m > -INFINITY)
      for (int j = 0; j < p.V; ++j) {
        const float x = load(dtype, logits, r * ld + j);
        if (!std::isnan(x)) s += std::exp(static_cast<double>(x) - m);
      }
    lse[r] = m > -INFINITY ? static_cast<float>(m + std::log(s)) : kNegInf;
  }
}

void beam_topk_sort_ref(const BeamTopkParams& p, DType dtype, float* scores, int32_t* indices, const void* logits,
                        const float* beam_scores, const float* lse) {
  const int64_t ld = p.row_stride();
  for (int b = 0; b < p.B; ++b) {
    std::vector<Cand> all;
    for (int beam = 0; beam < p.K; ++beam) {
      const int64_t r = static_cast<int64_t>(b) * p.K + beam;
      for (int j = 0; j < p.V; ++j) {
        const float key = beam_topk_key(beam_scores[r], load(dtype, logits, r * ld + j), lse[r]);
        if (selectable(key)) all.push_back({key, beam * p.V + j});
      }
    }
    take_top(all, p.k, scores + static_cast<int64_t>(b) * p.k, indices + static_cast<int64_t>(b) * p.k);
  }
}

void beam_topk_hars_cpu(const BeamTopkParams& p, int groups, DType dtype, float* scores, int32_t* indices,
                        int32_t* counts, const void* logits, const float* beam_scores, const float* lse) {
  TS_CHECK(groups >= p.k, "beam_topk_hars_cpu: needs groups >= k, got ", groups, " < ", p.k);
  const int64_t ld = p.row_stride(), rows = static_cast<int64_t>(p.B) * p.K;
  std::vector<float> cand_s(rows * p.k);
  std::vector<int32_t> cand_i(rows * p.k);
  for (int64_t r = 0; r < rows; ++r) {
    const int beam = static_cast<int>(r % p.K);
    auto key = [&](int j) { return beam_topk_key(beam_scores[r], load(dtype, logits, r * ld + j), lse[r]); };
    // Retrieve. A group's max key is the key of its max logit (the key is monotone in x); groups left empty (V <
    // groups) bound nothing, and with fewer than k non-empty groups the bound is -inf (every key a candidate).
    std::vector<float> gmax(groups, kNegInf);
    std::vector<bool> gfull(groups, false);
    for (int j = 0; j < p.V; ++j) {
      const float x = load(dtype, logits, r * ld + j);
      gfull[j % groups] = true;
      if (x > gmax[j % groups]) gmax[j % groups] = x;  // NaN never compares greater
    }
    float R = std::numeric_limits<float>::infinity();
    int filled = 0;
    for (int g = 0; g < groups; ++g)
      if (gfull[g]) {
        ++filled;
        R = std::min(R, beam_topk_key(beam_scores[r], gmax[g], lse[r]));
      }
    if (filled < p.k || std::isnan(R)) R = kNegInf;
    std::vector<Cand> kept;
    for (int j = 0; j < p.V; ++j) {
      const float kj = key(j);
      if (kj >= R && selectable(kj)) kept.push_back({kj, beam * p.V + j});
    }
    if (counts) counts[r] = static_cast<int32_t>(kept.size());
    take_top(kept, p.k, cand_s.data() + r * p.k, cand_i.data() + r * p.k);
  }
  // Re-rank each entry's K * k candidates (pads are not selectable).
  for (int b = 0; b < p.B; ++b) {
    std::vector<Cand> c;
    for (int64_t i = static_cast<int64_t>(b) * p.K * p.k; i < static_cast<int64_t>(b + 1) * p.K * p.k; ++i)
      if (selectable(cand_s[i])) c.push_back({cand_s[i], cand_i[i]});
    take_top(c, p.k, scores + static_cast<int64_t>(b) * p.k, indices + static_cast<int64_t>(b) * p.k);
  }
}

}  // namespace tessera
