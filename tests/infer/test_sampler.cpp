// The sampler against its definition: greedy is the argmax, top-k and top-p draw only from their sets, and
// temperature sampling follows softmax(logits / T) (a chi-square goodness-of-fit test). Draws use fixed Philox
// seeds, so every test here is deterministic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "tessera/core/error.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/gpt.h"
#include "test_util.h"

namespace tessera {
namespace {

// Ids sorted by logit, largest first (ties by id), computed independently of the sampler.
std::vector<int> by_logit_desc(const std::vector<float>& logits) {
  std::vector<int> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  return idx;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp((logits[i] - mx) / temperature);
  for (double& v : p) v /= z;
  return p;
}

std::vector<int> draw_counts(const SamplerParams& p, const std::vector<float>& logits, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const int32_t t = sample_token(p, logits.data(), static_cast<int>(logits.size()), static_cast<uint64_t>(i));
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    if (t < 0 || t >= static_cast<int32_t>(logits.size())) return counts;
    ++counts[t];
  }
  return counts;
}

TEST(Sampler, GreedyIsTheArgmax) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const auto logits = test::randn<float>(37, rng, 3.0);
    int best = 0;
    for (int i = 1; i < 37; ++i)
      if (logits[i] > logits[best]) best = i;
    for (uint64_t draw : {0u, 1u, 17u})
      EXPECT_EQ(sample_token({.temperature = 0.0f, .seed = 5}, logits.data(), 37, draw), best);
  }
  // Greedy ignores top-k and top-p, and picks the lowest id on a tie.
  const std::vector<float> tie{1.0f, 3.0f, -2.0f, 3.0f};
  EXPECT_EQ(sample_token({.temperature = 0.0f, .top_k = 1, .top_p = 0.1f}, tie.data(), 4, 0), 1);
}

TEST(Sampler, TopKNeverLeavesTheKLargest) {
  std::mt19937_64 rng(test::test_seed());
  const int V = 30, k = 6;
  const auto logits = test::randn<float>(V, rng);
  const auto order = by_logit_desc(logits);
  const std::set<int> allowed(order.begin(), order.begin() + k);
  // A high temperature flattens the distribution, so tokens outside the top k would come up often.
  const auto counts = draw_counts({.temperature = 4.0f, .top_k = k, .seed = 11}, logits, 3000);
  for (int t = 0; t < V; ++t) {
    if (allowed.count(t)) EXPECT_GT(counts[t], 0) << "token " << t << " is among the top " << k << " but never drawn";
    else EXPECT_EQ(counts[t], 0) << "token " << t << " is outside the top " << k;
  }
}

TEST(Sampler, TopPDrawsOnlyFromTheSmallestSetReachingP) {
  // Probabilities at shuffled positions; cumulative mass in descending order: 0.40, 0.70, 0.85, 0.95, 1.0.
  // With top_p = 0.8 the smallest set reaching 0.8 is {0.40, 0.30, 0.15}; at 0.7 it is {0.40, 0.30}.
  const std::vector<double> prob{0.05, 0.30, 0.10, 0.40, 0.15};
  std::vector<float> logits;
  for (double q : prob) logits.push_back(static_cast<float>(std::log(q)));
  struct Case {
    float top_p;
    std::set<int> allowed;
  };
  for (const Case& c : {Case{0.8f, {3, 1, 4}}, Case{0.65f, {3, 1}}, Case{0.3f, {3}}, Case{1.0f, {0, 1, 2, 3, 4}}}) {
    const auto counts = draw_counts({.temperature = 1.0f, .top_p = c.top_p, .seed = 3}, logits, 4000);
    for (int t = 0; t < 5; ++t) {
      if (c.allowed.count(t)) EXPECT_GT(counts[t], 0) << "top_p " << c.top_p << ": token " << t << " never drawn";
      else EXPECT_EQ(counts[t], 0) << "top_p " << c.top_p << ": token " << t << " is outside the nucleus";
    }
  }
}

// Pearson's chi-square statistic of observed counts against expected probabilities.
double chi_square(const std::vector<int>& counts, const std::vector<double>& prob, int draws) {
  double x2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = prob[i] * draws;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

TEST(Sampler, TemperatureSamplingMatchesSoftmax) {
  // 8 categories, so 7 degrees of freedom. The critical value at p = 1e-3 is chi2.ppf(1 - 1e-3, df=7) = 24.322
  // (regularized lower incomplete gamma inverted by bisection; tables give 24.32). A correct sampler exceeds it
  // with probability 1e-3, but the seed is fixed, so the test is deterministic. Logits are fixed (not drawn
  // from the test seed) and chosen so every expected count is large (>= 100).
  const std::vector<float> logits{0.3f, -0.8f, 1.2f, 0.0f, -0.4f, 0.9f, -1.1f, 0.5f};
  const int draws = 20000;
  const double kChi2Crit = 24.322;
  for (float temperature : {0.6f, 1.0f, 1.7f}) {
    const auto prob = softmax(logits, temperature);
    const auto counts = draw_counts({.temperature = temperature, .seed = 2024}, logits, draws);
    EXPECT_LT(chi_square(counts, prob, draws), kChi2Crit) << "temperature " << temperature;
  }
  // With top_k the draws follow the renormalised softmax over the kept tokens (df = 3, chi2.ppf(1 - 1e-3, 3)
  // = 16.266).
  const auto order = by_logit_desc(logits);
  const auto full = softmax(logits, 0.8);
  std::vector<double> kept(4);
  double z = 0;
  for (int i = 0; i < 4; ++i) z += kept[i] = full[order[i]];
  for (double& v : kept) v /= z;
  const auto counts = draw_counts({.temperature = 0.8f, .top_k = 4, .seed = 77}, logits, draws);
  std::vector<int> kept_counts(4);
  for (int i = 0; i < 4; ++i) kept_counts[i] = counts[order[i]];
  EXPECT_LT(chi_square(kept_counts, kept, draws), 16.266);
}

TEST(Sampler, RejectsInvalidSettings) {
  auto msg = [](const SamplerParams& p) { return test::error_of([&] { sampler_check(p); }); };
  EXPECT_EQ(msg({.temperature = 0.0f}), "");
  EXPECT_EQ(msg({.temperature = 0.7f, .top_k = 3, .top_p = 1.0f}), "");
  EXPECT_NE(msg({.temperature = -0.5f}).find("--temperature"), std::string::npos);
  EXPECT_NE(msg({.temperature = std::numeric_limits<float>::quiet_NaN()}).find("--temperature"), std::string::npos);
  EXPECT_NE(msg({.temperature = std::numeric_limits<float>::infinity()}).find("--temperature"), std::string::npos);
  EXPECT_NE(msg({.top_k = -1}).find("--top-k"), std::string::npos);
  for (float top_p : {0.0f, -0.2f, 1.01f, std::numeric_limits<float>::quiet_NaN()})
    EXPECT_NE(msg({.top_p = top_p}).find("--top-p"), std::string::npos) << top_p;
  // sample_token checks too: a negative temperature is an error, not a silent switch to greedy.
  const std::vector<float> logits{0.1f, 2.0f, -1.0f};
  EXPECT_THROW(sample_token({.temperature = -1.0f}, logits.data(), 3, 0), Error);
  EXPECT_THROW(sample_token({.top_p = 1.5f}, logits.data(), 3, 0), Error);
}

TEST(Sampler, RejectsNanAndInfiniteLogits) {
  // Named as NaN whatever its sign bit (a diverged model's came out as "-nan").
  const std::pair<float, const char*> bad[] = {{std::numeric_limits<float>::quiet_NaN(), "logit 2 is NaN "},
                                               {-std::numeric_limits<float>::quiet_NaN(), "logit 2 is NaN "},
                                               {std::numeric_limits<float>::infinity(), "logit 2 is inf "},
                                               {-std::numeric_limits<float>::infinity(), "logit 2 is -inf "}};
  for (const auto& [b, said] : bad) {
    std::vector<float> logits{0.5f, -0.2f, 1.0f, 0.3f};
    logits[2] = b;
    for (float temperature : {0.0f, 1.0f}) {
      const std::string m =
          test::error_of([&] { sample_token({.temperature = temperature, .top_p = 0.9f}, logits.data(), 4, 0); });
      EXPECT_NE(m.find(said), std::string::npos) << "temperature " << temperature << ": " << m;
    }
  }
}

ModelConfig tiny_model() {
  return test::small_config(/*vocab=*/13, /*d_model=*/8, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/16, /*max_seq=*/8);
}

// Generation plans the activations once, and gives the tokens that a fresh plan per context gives.
TEST(Generate, PlansTheArenaOnceAndMatchesAFreshPlanPerToken) {
  Gpt model(tiny_model());
  model.init_weights(9);
  const std::vector<int32_t> prompt{1, 5, 2};
  const int max_new = 9;  // runs past max_seq = 8, so the context also slides
  const auto out = generate(model, prompt, max_new, {.temperature = 0.0f});
  EXPECT_EQ(model.plan_count(), 1);
  EXPECT_EQ(model.planned_tokens(), 8);  // min(max_seq, 3 + 9 - 1)
  ASSERT_EQ(out.size(), prompt.size() + max_new);

  // Reference: a fresh model (same weights) per token, planned exactly for that context.
  std::vector<int32_t> ref = prompt;
  for (int i = 0; i < max_new; ++i) {
    Gpt fresh(tiny_model());
    fresh.init_weights(9);
    const int T = std::min<int>(static_cast<int>(ref.size()), 8);
    fresh.forward(ref.data() + ref.size() - T, nullptr, 1, T, {});
    ref.push_back(
        sample_token({.temperature = 0.0f}, fresh.logits().as<float>() + static_cast<size_t>(T - 1) * 13, 13, i));
  }
  EXPECT_EQ(out, ref);

  // A short generation after a larger plan (e.g. after training) reuses it.
  generate(model, prompt, 2, {.temperature = 0.8f, .seed = 1});
  EXPECT_EQ(model.plan_count(), 1);
}

}  // namespace
}  // namespace tessera
