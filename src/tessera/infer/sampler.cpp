#include "tessera/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"

namespace tessera {

void sampler_check(const SamplerParams& p) {
  TS_CHECK(std::isfinite(p.temperature) && p.temperature >= 0,
           "--temperature must be >= 0 (0 is greedy), got ", p.temperature);
  TS_CHECK(p.top_k >= 0, "--top-k must be >= 0, got ", p.top_k);
  TS_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got ", p.top_p);  // false for NaN too
}

int32_t sample_token(const SamplerParams& p, const float* logits, int V, uint64_t draw) {
  sampler_check(p);
  TS_CHECK(V > 0, "sample_token: the vocabulary is empty");
  // A NaN would break the strict weak ordering the sort below relies on (undefined behaviour), and an
  // infinity makes the softmax NaN: both mean the model diverged, which sampling must not hide.
  for (int i = 0; i < V; ++i)
    TS_CHECK(std::isfinite(logits[i]), "sampling: logit ", i, " is ",
             std::isnan(logits[i]) ? std::string("NaN") : std::to_string(logits[i]),  // not "-nan": its sign is noise
             " (the model produced NaN or infinite logits)");
  if (p.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  // Most likely first; ties by id so the order is deterministic.
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  int keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  std::vector<double> prob(keep);
  const double mx = logits[idx[0]];
  double z = 0;
  for (int i = 0; i < keep; ++i) z += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  if (p.top_p < 1) {
    double cum = 0;
    int k = 0;
    while (k < keep) {
      cum += prob[k++] / z;
      if (cum >= p.top_p) break;
    }
    keep = k;
    z = 0;
    for (int i = 0; i < keep; ++i) z += prob[i];
  }
  const double u = philox_uniform(p.seed, 0, draw) * z;
  double cum = 0;
  for (int i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Model& model, std::vector<int32_t> tokens, int max_new, const SamplerParams& p,
                              const std::function<void(int32_t)>& on_token) {
  sampler_check(p);
  TS_CHECK(!tokens.empty(), "generate: the prompt is empty");
  const int V = model.config().vocab, max_seq = model.config().max_seq;
  if (max_new <= 0) return tokens;
  // The longest context is the last one: the prompt and all but the last new token, capped at max_seq.
  const size_t longest = tokens.size() + static_cast<size_t>(max_new) - 1;
  model.reserve(1, static_cast<int>(std::min<size_t>(longest, static_cast<size_t>(max_seq))));
  for (int i = 0; i < max_new; ++i) {
    const int T = std::min<int>(static_cast<int>(tokens.size()), max_seq);
    const int32_t* ctx = tokens.data() + tokens.size() - T;
    model.forward(ctx, nullptr, 1, T, {});
    const std::vector<float> last = model.read_logits_row(T - 1);  // one explicit copy of one row
    tokens.push_back(sample_token(p, last.data(), V, i));
    if (on_token) on_token(tokens.back());
  }
  return tokens;
}

}  // namespace tessera
