// The batched sampler's CPU reference: the steps of sampler.h written out one by one, sort-based, on the host.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/infer/sampler.h"
#include "tessera/infer/sampler_math.h"

namespace tessera {
namespace {

using namespace sampling;

std::string describe(float v) { return std::isnan(v) ? std::string("NaN") : std::to_string(v); }

// Steps 1-2 of sampler.h in place over row n, in f32, stored back as T.
template <typename T>
void process_row(const SampleParams& p, int n, T* row, const int32_t* counts, const int32_t* bias_ids,
                 const float* bias_values) {
  if (p.penalized()) {
    TS_CHECK(counts, "sample_rows: a penalty is set but no count table was given");
    const int32_t* c = counts + static_cast<size_t>(n) * p.V;
    for (int j = 0; j < p.V; ++j)
      row[j] = static_cast<T>(
          penalize(static_cast<float>(row[j]), c[j], p.repetition_penalty, p.presence_penalty, p.frequency_penalty));
  }
  for (int b = 0; b < p.n_bias; ++b) {
    const int32_t id = bias_ids[b];
    TS_CHECK(id >= 0 && id < p.V, "--logit-bias: token id ", id, " is outside the vocabulary [0, ", p.V, ")");
    row[id] = static_cast<T>(add_rn(static_cast<float>(row[id]), bias_values[b]));
  }
}

// The top-N log-softmax values of l / t (t = 1 when greedy), most likely first, ties by id; ids past V are -1.
void row_logprobs(const SampleParams& p, const std::vector<float>& l, const std::vector<int>& order, float mx,
                  int32_t* ids, float* values) {
  const double t = p.temperature > 0 ? p.temperature : 1.0;
  double z = 0;
  for (float v : l) z += std::exp((static_cast<double>(v) - mx) / t);
  const double log_z = std::log(z);
  for (int i = 0; i < p.logprobs; ++i) {
    if (i < p.V) {
      ids[i] = order[i];
      values[i] = static_cast<float>((static_cast<double>(l[order[i]]) - mx) / t - log_z);
    } else {
      ids[i] = -1;
      values[i] = -std::numeric_limits<float>::infinity();
    }
  }
}

// Steps 4-6: which tokens survive top-k, top-p and min-p. order: ids by l descending, ties by id.
std::vector<bool> kept_tokens(const SampleParams& p, const std::vector<float>& l, const std::vector<float>& w,
                              const std::vector<int>& order) {
  const int V = p.V;
  std::vector<bool> keep(V, true);
  if (p.top_k > 0 && p.top_k < V) {
    const float cut = l[order[p.top_k - 1]];
    for (int j = 0; j < V; ++j) keep[j] = l[j] >= cut;
  }
  if (p.top_p < 1.0f) {
    uint64_t z = 0;
    for (int j = 0; j < V; ++j)
      if (keep[j]) z += mass_of(w[j]);
    const uint64_t M = nucleus_mass(p.top_p, z);
    // Down the order in groups of equal l: a group is kept iff the kept mass strictly above it is < M.
    uint64_t above = 0;
    for (int i = 0; i < V;) {
      int e = i;
      uint64_t group = 0;
      for (; e < V && l[order[e]] == l[order[i]]; ++e)
        if (keep[order[e]]) group += mass_of(w[order[e]]);
      for (int g = i; g < e; ++g) keep[order[g]] = keep[order[g]] && above < M;
      above += group;
      i = e;
    }
  }
  if (p.min_p > 0.0f)
    for (int j = 0; j < V; ++j) keep[j] = keep[j] && w[j] >= p.min_p;
  return keep;
}

}  // namespace

template <typename T>
void sample_rows_ref(const SampleParams& p, int32_t* tokens, T* logits, int32_t* counts, const int32_t* bias_ids,
                     const float* bias_values, uint32_t* steps, int32_t* logprob_ids, float* logprob_values) {
  sample_params_check(p);
  const int V = p.V;
  for (int n = 0; n < p.rows; ++n) {
    T* row = logits + static_cast<size_t>(n) * p.row_stride();
    process_row(p, n, row, counts, bias_ids, bias_values);
    std::vector<float> l(V);
    float mx = -std::numeric_limits<float>::infinity();
    int argmax = -1;
    for (int j = 0; j < V; ++j) {
      l[j] = static_cast<float>(row[j]);
      TS_CHECK(!std::isnan(l[j]) && l[j] != std::numeric_limits<float>::infinity(), "sampling: row ", n, ", logit ", j,
               " is ", describe(l[j]), " (the model produced NaN or infinite logits)");
      if (l[j] > mx) mx = l[j], argmax = j;  // strictly greater: the lowest id wins a tie
    }
    TS_CHECK(argmax >= 0, "sampling: row ", n, " has no logit above -inf (every token is masked)");

    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    if (p.logprobs > 0)
      row_logprobs(p, l, order, mx, logprob_ids + static_cast<size_t>(n) * p.logprobs,
                   logprob_values + static_cast<size_t>(n) * p.logprobs);

    int32_t token = argmax;
    if (p.temperature > 0) {
      std::vector<float> w(V);
      for (int j = 0; j < V; ++j) w[j] = weight(l[j], mx, p.temperature);
      const std::vector<bool> keep = kept_tokens(p, l, w, order);
      uint64_t z = 0;
      for (int j = 0; j < V; ++j)
        if (keep[j]) z += mass_of(w[j]);
      // z >= 2^38: the maximum (w = 1) survives every filter.
      const uint64_t target = draw_target(draw_word(p.seed, n, steps[n]), z);
      uint64_t cum = 0;
      for (int j = 0; j < V; ++j) {
        if (keep[j]) cum += mass_of(w[j]);
        if (cum > target) {
          token = j;
          break;
        }
      }
    }
    tokens[n] = token;
    steps[n] += 1;
    if (p.count_drawn && counts) counts[static_cast<size_t>(n) * V + token] += 1;
  }
}

template void sample_rows_ref<float>(const SampleParams&, int32_t*, float*, int32_t*, const int32_t*, const float*,
                                     uint32_t*, int32_t*, float*);
template void sample_rows_ref<double>(const SampleParams&, int32_t*, double*, int32_t*, const int32_t*, const float*,
                                      uint32_t*, int32_t*, float*);

}  // namespace tessera
