// The batched sampler's CPU reference against its definition (sampler.h): penalties and bias by their formulas,
// greedy as the argmax, top-k / top-p / min-p drawing only inside their sets, the draws following the processed
// distribution (chi-square), reproducibility for a seed, the step and count bookkeeping, logprobs, and the errors.
// Every expectation is computed here in f64 from the definitions, not through the sampler's integer masses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "tessera/core/error.h"
#include "tessera/infer/sampler.h"
#include "tessera/infer/sampler_math.h"
#include "test_util.h"

namespace tessera {
namespace {

// Host buffers for one sample_rows call over `rows` copies of rows given by the caller.
struct Batch {
  SampleParams p;
  std::vector<float> logits;
  std::vector<int32_t> tokens, counts, bias_ids, lp_ids;
  std::vector<float> bias_values, lp_values;
  std::vector<int32_t> steps;

  explicit Batch(const SampleParams& params) : p(params) {
    logits.assign(static_cast<size_t>(p.rows) * p.row_stride(), std::numeric_limits<float>::quiet_NaN());
    tokens.assign(p.rows, -7);
    counts.assign(static_cast<size_t>(p.rows) * p.V, 0);
    steps.assign(p.rows, 0);
    lp_ids.assign(static_cast<size_t>(p.rows) * p.logprobs, -7);
    lp_values.assign(static_cast<size_t>(p.rows) * p.logprobs, std::numeric_limits<float>::quiet_NaN());
  }
  void set_row(int n, const std::vector<float>& l) {
    std::copy(l.begin(), l.end(), logits.begin() + n * p.row_stride());
  }
  void run() {
    Context ctx;
    p.n_bias = static_cast<int>(bias_ids.size());
    const int64_t R = p.rows, V = p.V;
    auto t = [](void* d, DType dt, int64_t n) { return n ? Tensor(d, dt, {n}) : Tensor(); };
    sample_rows(p, t(tokens.data(), DType::I32, R), t(logits.data(), DType::F32, static_cast<int64_t>(logits.size())),
                p.penalized() || p.count_drawn ? t(counts.data(), DType::I32, R * V) : Tensor(),
                t(bias_ids.data(), DType::I32, p.n_bias), t(bias_values.data(), DType::F32, p.n_bias),
                t(steps.data(), DType::I32, R), t(lp_ids.data(), DType::I32, R * p.logprobs),
                t(lp_values.data(), DType::F32, R * p.logprobs), ctx);
  }
};

// Draws `draws` tokens from one row: `per_call` copies of it per call (each its own Philox stream), fresh logits
// every call (the penalties rewrite them in place), counts as given.
std::vector<int> draw_counts(SampleParams p, const std::vector<float>& row, const std::vector<int32_t>& row_counts,
                             const std::vector<std::pair<int32_t, float>>& bias, int draws, int per_call = 500) {
  p.rows = per_call;
  Batch b(p);
  for (const auto& [id, v] : bias) b.bias_ids.push_back(id), b.bias_values.push_back(v);
  std::vector<int> hist(p.V, 0);
  for (int done = 0; done < draws; done += per_call) {
    for (int n = 0; n < per_call; ++n) {
      b.set_row(n, row);
      std::copy(row_counts.begin(), row_counts.end(), b.counts.begin() + static_cast<size_t>(n) * p.V);
    }
    b.run();
    for (int32_t t : b.tokens) {
      EXPECT_TRUE(t >= 0 && t < p.V) << t;
      if (t >= 0 && t < p.V) ++hist[t];
    }
  }
  return hist;
}

// The processed logits of steps 1-2 in f64.
std::vector<double> processed(const SampleParams& p, const std::vector<float>& l, const std::vector<int32_t>& c,
                              const std::vector<std::pair<int32_t, float>>& bias) {
  std::vector<double> x(l.begin(), l.end());
  for (size_t j = 0; j < x.size(); ++j) {
    if (c[j] == 0) continue;
    x[j] = x[j] < 0 ? x[j] * p.repetition_penalty : x[j] / p.repetition_penalty;
    x[j] -= c[j] * static_cast<double>(p.frequency_penalty) + p.presence_penalty;
  }
  for (const auto& [id, v] : bias) x[id] += v;
  return x;
}

// The distribution of steps 3-6 in f64: softmax(x / T), top-k (ties at the cut kept), top-p over the top-k set
// (kept while the mass strictly above is < p), min-p against the maximum; renormalised.
std::vector<double> expected_distribution(const SampleParams& p, const std::vector<double>& x) {
  const int V = static_cast<int>(x.size());
  const double mx = *std::max_element(x.begin(), x.end());
  std::vector<double> w(V);
  for (int j = 0; j < V; ++j) w[j] = std::exp((x[j] - mx) / p.temperature);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
  std::vector<bool> keep(V, true);
  if (p.top_k > 0 && p.top_k < V)
    for (int j = 0; j < V; ++j) keep[j] = x[j] >= x[order[p.top_k - 1]];
  if (p.top_p < 1) {
    const std::vector<bool> in_k = keep;
    double z = 0;
    for (int j = 0; j < V; ++j) z += in_k[j] ? w[j] : 0;
    for (int i = 0; i < V; ++i) {
      double above = 0;  // the top-k set's mass strictly above token i
      for (int j = 0; j < V; ++j) above += (in_k[j] && x[j] > x[i]) ? w[j] : 0;
      if (above >= p.top_p * z) keep[i] = false;
    }
  }
  for (int j = 0; j < V; ++j) keep[j] = keep[j] && w[j] >= p.min_p;
  double z = 0;
  for (int j = 0; j < V; ++j) z += keep[j] ? w[j] : 0;
  std::vector<double> prob(V);
  for (int j = 0; j < V; ++j) prob[j] = keep[j] ? w[j] / z : 0;
  return prob;
}

// The chi-square critical value at p = 1e-3 for df degrees of freedom (Wilson-Hilferty; a little above the exact
// value for small df, e.g. 24.53 against 24.32 at df = 7, so slightly lenient, never stricter).
double chi2_critical(int df) {
  const double z = 3.090232, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson's statistic over the categories of nonzero probability; every drawn token must have one.
double chi_square(const std::vector<int>& counts, const std::vector<double>& prob, int draws, int* df) {
  double x2 = 0;
  *df = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (prob[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " lies outside the kept set";
      continue;
    }
    const double e = prob[i] * draws;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
    ++*df;
  }
  return x2;
}

// The shared exponential (sampler_math.h) against the library's, in f64: within 2 ulp over its range, exactly 1 at 0
// (so that the maximum's weight is 1), and 0 where the mass would be 0 anyway.
TEST(SampleRows, SharedExponentialIsAccurate) {
  EXPECT_EQ(sampling::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(sampling::exp_nonpositive(-31.0f), 0.0f);
  EXPECT_EQ(sampling::exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  double worst_ulp = 0;
  for (int i = 0; i <= 300000; ++i) {
    const float x = -29.99f * static_cast<float>(i) / 300000.0f;
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst_ulp = std::max(worst_ulp, std::abs(sampling::exp_nonpositive(x) - want) / ulp);
  }
  EXPECT_LE(worst_ulp, 2.0);
}

TEST(SampleRows, PenaltiesAndBiasFollowTheirFormulas) {
  SampleParams p{.rows = 2,
                 .V = 6,
                 .ld = 8,
                 .temperature = 0.0f,
                 .repetition_penalty = 1.5f,
                 .presence_penalty = 0.25f,
                 .frequency_penalty = 0.5f};
  Batch b(p);
  b.set_row(0, {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f});
  b.set_row(1, {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f});
  // Row 0's history: token 0 twice, token 1 once, token 4 three times, token 5 once; row 1's: token 3.
  const std::vector<int32_t> c0{2, 1, 0, 0, 3, 1}, c1{0, 0, 0, 1, 0, 0};
  std::copy(c0.begin(), c0.end(), b.counts.begin());
  std::copy(c1.begin(), c1.end(), b.counts.begin() + 6);
  b.bias_ids = {2, 5};
  b.bias_values = {-0.75f, 4.0f};
  b.run();
  // Hand-computed: penalised l = (l > 0 ? l / 1.5 : l * 1.5) - (count * 0.5 + 0.25); then the bias.
  const std::vector<float> want0{2.0f / 1.5f - 1.25f, -1.5f - 0.75f,      0.5f - 0.75f, 3.0f,
                                 -3.0f - 1.75f,       0.0f - 0.75f + 4.0f};
  const std::vector<float> want1{1.0f, 1.0f, 1.0f - 0.75f, 1.0f / 1.5f - 0.75f, 1.0f, 1.0f + 4.0f};
  for (int j = 0; j < 6; ++j) {
    EXPECT_NEAR(b.logits[j], want0[j], 1e-6) << "row 0, token " << j;
    EXPECT_NEAR(b.logits[8 + j], want1[j], 1e-6) << "row 1, token " << j;
  }
  EXPECT_TRUE(std::isnan(b.logits[6]) && std::isnan(b.logits[7])) << "the row padding is not touched";
  // Greedy applies them first: row 0's argmax moves from token 3 (3.0) to token 5 (3.25).
  EXPECT_EQ(b.tokens[0], 5);
  EXPECT_EQ(b.tokens[1], 5);
}

TEST(SampleRows, GreedyIsTheArgmaxWithTiesToTheLowestId) {
  std::mt19937_64 rng(test::test_seed());
  SampleParams p{.rows = 40, .V = 33, .temperature = 0.0f, .top_k = 3, .top_p = 0.2f};
  Batch b(p);
  std::vector<int> want(p.rows);
  for (int n = 0; n < p.rows; ++n) {
    auto l = test::randn<float>(33, rng);
    if (n % 4 == 0) l[n % 33] = l[(n + 7) % 33] = 9.0f;  // a tie: the lower of the two ids wins
    want[n] = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());  // the first maximum
    b.set_row(n, l);
  }
  b.run();
  for (int n = 0; n < p.rows; ++n) EXPECT_EQ(b.tokens[n], want[n]) << "row " << n;
}

TEST(SampleRows, ReproducibleForASeedAndDifferentAcrossSeedsRowsAndSteps) {
  std::mt19937_64 rng(test::test_seed());
  const auto row = test::randn<float>(50, rng, 0.5);
  auto run = [&](uint64_t seed, int calls) {
    SampleParams p{.rows = 16, .V = 50, .temperature = 1.0f, .top_p = 0.95f, .seed = seed};
    Batch b(p);
    std::vector<int32_t> all;
    for (int c = 0; c < calls; ++c) {
      for (int n = 0; n < p.rows; ++n) b.set_row(n, row);
      b.run();
      all.insert(all.end(), b.tokens.begin(), b.tokens.end());
    }
    for (int32_t s : b.steps) EXPECT_EQ(s, calls) << "the sampler advances every row's step once per call";
    return all;
  };
  const auto a = run(7, 4), again = run(7, 4), other = run(8, 4);
  EXPECT_EQ(a, again);
  EXPECT_NE(a, other);
  // The 16 rows draw from their own streams, and so do the 4 steps: identical rows give varied tokens.
  std::set<int32_t> first_call(a.begin(), a.begin() + 16), first_row;
  for (int c = 0; c < 4; ++c) first_row.insert(a[c * 16]);
  EXPECT_GT(first_call.size(), 4u);
  EXPECT_GT(first_row.size(), 1u);
}

TEST(SampleRows, FiltersNeverDrawOutsideTheirSets) {
  // A flat row at a high temperature, so that tokens outside each set would be drawn often if they could be.
  std::mt19937_64 rng(test::test_seed());
  const int V = 40;
  auto row = test::randn<float>(V, rng);
  row[11] = row[23] = 1.5f;  // a tie, placed to straddle top-k's cut below
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  const int rank = static_cast<int>(std::find(order.begin(), order.end(), 11) - order.begin());
  const std::vector<int32_t> none(V, 0);
  for (SampleParams p :
       {SampleParams{.V = V, .temperature = 3.0f, .top_k = rank + 1},
        SampleParams{.V = V, .temperature = 3.0f, .top_k = 6}, SampleParams{.V = V, .temperature = 3.0f, .top_p = 0.5f},
        SampleParams{.V = V, .temperature = 3.0f, .min_p = 0.6f},
        SampleParams{.V = V, .temperature = 2.0f, .top_k = 20, .top_p = 0.7f, .min_p = 0.3f}}) {
    const auto prob = expected_distribution(p, processed(p, row, none, {}));
    const auto counts = draw_counts(p, row, none, {}, 6000);
    const std::string what = "top_k " + std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) + " min_p " +
                             std::to_string(p.min_p);
    int kept = 0;
    for (int t = 0; t < V; ++t) {
      kept += prob[t] > 0;
      if (prob[t] > 0) EXPECT_GT(counts[t], 0) << what << ": token " << t << " is kept but never drawn";
      else EXPECT_EQ(counts[t], 0) << what << ": token " << t << " is outside the kept set";
    }
    EXPECT_GT(kept, 1) << what;
    EXPECT_LT(kept, V) << what;
  }
  // top-k keeps every token tied at its cut (Hugging Face's rule): at k = rank + 1 both 11 and 23 are kept.
  const auto tie =
      expected_distribution(SampleParams{.V = V, .temperature = 3.0f, .top_k = rank + 1}, processed({}, row, none, {}));
  EXPECT_GT(tie[11], 0);
  EXPECT_GT(tie[23], 0);
}

TEST(SampleRows, DrawsFollowTheProcessedDistribution) {
  // Every step at once: penalties, a bias, temperature, top-k, top-p, min-p; the expected distribution in f64.
  const std::vector<float> row{1.2f, 0.4f, -0.3f, 2.0f, 0.9f, 0.0f, -1.5f, 1.6f, 0.7f, -0.8f, 1.1f, 0.2f};
  const std::vector<int32_t> counts{0, 2, 0, 1, 0, 0, 3, 0, 1, 0, 0, 0};
  const std::vector<std::pair<int32_t, float>> bias{{5, 1.0f}, {9, -0.5f}};
  const int draws = 20000;
  for (SampleParams p : {SampleParams{.V = 12, .temperature = 0.7f, .seed = 2024},
                         SampleParams{.V = 12, .temperature = 1.3f, .top_k = 8, .seed = 5},
                         SampleParams{.V = 12,
                         .temperature = 1.0f,
                         .top_k = 9,
                         .top_p = 0.85f,
                         .min_p = 0.15f,
                         .repetition_penalty = 1.3f,
                         .presence_penalty = 0.2f,
                         .frequency_penalty = 0.1f,
                         .seed = 99}}) {
    const auto prob = expected_distribution(p, processed(p, row, counts, bias));
    const auto hist = draw_counts(p, row, counts, bias, draws);
    int df;
    const double x2 = chi_square(hist, prob, draws, &df);
    // All 12 kept; the top 8; top-k's 9 less what top-p and min-p remove.
    EXPECT_EQ(df + 1, p.top_k == 0 ? 12 : p.top_k == 8 ? 8 : 6) << "the kept set";
    EXPECT_LT(x2, chi2_critical(df)) << "temperature " << p.temperature << " top_k " << p.top_k << ", df " << df;
  }
}

TEST(SampleRows, CountsStepsAndTheF64PathAgree) {
  std::mt19937_64 rng(test::test_seed());
  SampleParams p{
      .rows = 5, .V = 20, .temperature = 0.8f, .top_k = 10, .presence_penalty = 0.3f, .seed = 3, .count_drawn = true};
  Batch b(p);
  // The history from a token table: sampler_counts_add counts each row's first lengths[n] tokens.
  const int max_len = 6;
  std::vector<int32_t> table = test::randint(5 * max_len, 20, rng), lengths{6, 0, 3, 1, 5};
  Context ctx;
  sampler_counts_add(5, 20, max_len, Tensor(b.counts.data(), DType::I32, {100}), Tensor(table.data(), DType::I32, {30}),
                     Tensor(lengths.data(), DType::I32, {5}), ctx);
  std::vector<int32_t> want(100, 0);
  for (int n = 0; n < 5; ++n)
    for (int i = 0; i < lengths[n]; ++i) ++want[n * 20 + table[n * max_len + i]];
  EXPECT_EQ(b.counts, want);

  std::vector<std::vector<float>> rows;
  for (int n = 0; n < 5; ++n) rows.push_back(test::randn<float>(20, rng));
  std::vector<double> logits64(100);
  for (int n = 0; n < 5; ++n) {
    b.set_row(n, rows[n]);
    for (int j = 0; j < 20; ++j) logits64[n * 20 + j] = rows[n][j];
  }
  b.steps = {0, 5, 9, 2, 1};
  std::vector<int32_t> counts64 = b.counts, tokens64(5), steps64 = b.steps;
  b.run();
  for (int n = 0; n < 5; ++n) ++want[n * 20 + b.tokens[n]];
  EXPECT_EQ(b.counts, want) << "count_drawn adds each drawn token";
  EXPECT_EQ(b.steps, (std::vector<int32_t>{1, 6, 10, 3, 2}));
  // The f64 reference computes in f32 after the load: the same tokens from the same f32-exact values.
  sample_rows(p, Tensor(tokens64.data(), DType::I32, {5}), Tensor(logits64.data(), DType::F64, {100}),
              Tensor(counts64.data(), DType::I32, {100}), {}, {}, Tensor(steps64.data(), DType::I32, {5}), {}, {}, ctx);
  EXPECT_EQ(tokens64, b.tokens);
}

TEST(SampleRows, LogprobsAreTheTopNOfTheLogSoftmax) {
  std::mt19937_64 rng(test::test_seed());
  for (float temperature : {0.0f, 0.6f}) {
    const SampleParams p{.rows = 3, .V = 30, .temperature = temperature, .logprobs = 5};
    Batch b(p);
    std::vector<std::vector<float>> rows;
    for (int n = 0; n < 3; ++n) {
      rows.push_back(test::randn<float>(30, rng));
      if (n == 2) rows[n][4] = rows[n][17] = rows[n][25] = 5.0f;  // a three-way tie at the top: ids in order
      b.set_row(n, rows[n]);
    }
    b.run();
    const double t = temperature > 0 ? temperature : 1.0;
    for (int n = 0; n < 3; ++n) {
      std::vector<int> order(30);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return rows[n][a] > rows[n][c]; });
      double z = 0;
      for (float v : rows[n]) z += std::exp(v / t);
      for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(b.lp_ids[n * 5 + i], order[i]) << "row " << n << " rank " << i;
        EXPECT_NEAR(b.lp_values[n * 5 + i], rows[n][order[i]] / t - std::log(z), 1e-5) << "row " << n;
      }
    }
  }
}

TEST(SampleRows, RejectsBadSettingsNamingTheFlag) {
  auto msg = [](SampleParams p) {
    p.rows = 1;
    p.V = 4;
    return test::error_of([&] { sample_params_check(p); });
  };
  EXPECT_EQ(msg({.temperature = 0.7f, .top_k = 3, .top_p = 0.9f, .min_p = 0.1f, .repetition_penalty = 1.2f}), "");
  const std::pair<SampleParams, const char*> bad[] = {
      {{.temperature = -1.0f}, "--temperature"},
      {{.top_k = -1}, "--top-k"},
      {{.top_p = 0.0f}, "--top-p"},
      {{.top_p = 1.5f}, "--top-p"},
      {{.min_p = -0.1f}, "--min-p"},
      {{.min_p = 1.1f}, "--min-p"},
      {{.min_p = std::numeric_limits<float>::quiet_NaN()}, "--min-p"},
      {{.repetition_penalty = 0.0f}, "--repetition-penalty"},
      {{.repetition_penalty = -1.0f}, "--repetition-penalty"},
      {{.presence_penalty = std::numeric_limits<float>::infinity()}, "--presence-penalty"},
      {{.frequency_penalty = std::numeric_limits<float>::quiet_NaN()}, "--frequency-penalty"},
      {{.logprobs = 21}, "--logprobs"},
  };
  for (const auto& [p, flag] : bad) EXPECT_NE(msg(p).find(flag), std::string::npos) << flag << ": " << msg(p);
  auto bias_msg = [](std::vector<std::pair<int32_t, float>> b) {
    return test::error_of([&] { sampler_bias_check(b, 10); });
  };
  EXPECT_EQ(bias_msg({{0, 1.0f}, {9, -std::numeric_limits<float>::infinity()}}), "");
  for (const auto& b : {std::vector<std::pair<int32_t, float>>{{10, 1.0f}},
                        {{-1, 1.0f}},
                        {{3, 1.0f}, {3, 2.0f}},
                        {{2, std::numeric_limits<float>::quiet_NaN()}}})
    EXPECT_NE(bias_msg(b).find("--logit-bias"), std::string::npos);
  // The reference checks the device list too: an id outside the vocabulary is an error, not a stray write.
  SampleParams p{.rows = 1, .V = 4};
  Batch b(p);
  b.set_row(0, {0.0f, 1.0f, 2.0f, 3.0f});
  b.bias_ids = {4};
  b.bias_values = {1.0f};
  EXPECT_NE(test::error_of([&] { b.run(); }).find("--logit-bias"), std::string::npos);
}

TEST(SampleRows, RejectsNanInfiniteAndFullyMaskedRows) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::pair<std::vector<float>, const char*> bad[] = {{{0.5f, nan, 1.0f}, "row 1, logit 1 is NaN"},
                                                            {{0.5f, 1.0f, inf}, "row 1, logit 2 is inf"},
                                                            {{-inf, -inf, -inf}, "row 1 has no logit above -inf"}};
  for (const auto& [row, said] : bad) {
    for (float temperature : {0.0f, 1.0f}) {
      SampleParams p{.rows = 2, .V = 3, .temperature = temperature};
      Batch b(p);
      b.set_row(0, {0.0f, 1.0f, 2.0f});
      b.set_row(1, row);
      const std::string m = test::error_of([&] { b.run(); });
      EXPECT_NE(m.find(said), std::string::npos) << m;
    }
  }
  // -inf alone is a masked token (a bias of -inf bans one), never drawn.
  SampleParams p{.V = 3, .temperature = 5.0f};
  const auto counts = draw_counts(p, {0.0f, -inf, 0.0f}, {0, 0, 0}, {}, 2000);
  EXPECT_EQ(counts[1], 0);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[2], 0);
}

}  // namespace
}  // namespace tessera
