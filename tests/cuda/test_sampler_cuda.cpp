// The batched sampler's CUDA kernel against its CPU reference (sampler.h): the same token for the same
// (seed, row, step) from the same logits, the draws' distribution against the exact processed distribution
// (chi-square), penalties and bias in place, logprobs, NaN rows, the count table, and a CUDA graph replaying the
// sampler with new draws. V in {7, 1000, 50257}, f32 and bf16.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/sampler.h"

namespace tessera::test {
namespace {

// One sample_rows call's inputs on the host; logits hold values already rounded to the compute dtype.
struct Inputs {
  SampleParams p;
  std::vector<double> logits;  // rows · row_stride
  std::vector<int32_t> counts, bias_ids, steps;
  std::vector<double> bias_values;
};

struct Outputs {
  std::vector<int32_t> tokens, steps, counts, lp_ids;
  std::vector<double> logits, lp_values;
};

std::vector<int32_t> as_i32(const std::vector<double>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

Outputs run_device(const Inputs& in, DType dt, Context& ctx) {
  const SampleParams& p = in.p;
  DeviceArena dev(ctx);
  const int64_t R = p.rows, lp = R * p.logprobs;
  const Tensor logits = dev.upload(dt, in.logits), steps = dev.upload_i32(in.steps);
  const Tensor tokens = dev.upload_i32(std::vector<int32_t>(R, -7));  // not -1, the kernel's "bad row"
  const Tensor counts = in.counts.empty() ? Tensor() : dev.upload_i32(in.counts);
  const Tensor bias_ids = p.n_bias ? dev.upload_i32(in.bias_ids) : Tensor();
  const Tensor bias_values = p.n_bias ? dev.upload(DType::F32, in.bias_values) : Tensor();
  const Tensor lp_ids = lp ? dev.poisoned(DType::I32, lp) : Tensor(),
               lp_values = lp ? dev.poisoned(DType::F32, lp) : Tensor();
  sample_rows(p, tokens, logits, counts, bias_ids, bias_values, steps, lp_ids, lp_values, ctx);
  Outputs out;
  out.tokens = as_i32(dev.download(tokens));
  out.steps = as_i32(dev.download(steps));
  if (counts.defined()) out.counts = as_i32(dev.download(counts));
  out.logits = dev.download(logits);
  if (lp) out.lp_ids = as_i32(dev.download(lp_ids)), out.lp_values = dev.download(lp_values);
  return out;
}

Outputs run_reference(const Inputs& in) {
  const SampleParams& p = in.p;
  Outputs out;
  std::vector<float> logits(in.logits.begin(), in.logits.end()), bias(in.bias_values.begin(), in.bias_values.end());
  std::vector<uint32_t> steps(in.steps.begin(), in.steps.end());
  out.tokens.assign(p.rows, -7);
  out.counts = in.counts;
  out.lp_ids.assign(static_cast<size_t>(p.rows) * p.logprobs, -7);
  std::vector<float> lp(out.lp_ids.size());
  sample_rows_ref<float>(p, out.tokens.data(), logits.data(), out.counts.empty() ? nullptr : out.counts.data(),
                         in.bias_ids.data(), bias.data(), steps.data(), out.lp_ids.data(), lp.data());
  out.steps.assign(steps.begin(), steps.end());
  out.logits.assign(logits.begin(), logits.end());
  out.lp_values.assign(lp.begin(), lp.end());
  return out;
}

// rows random rows of V (scale 2), rounded to dt, rows ld = V + 5 apart (the padding holds NaN: never read).
Inputs random_inputs(SampleParams p, DType dt, std::mt19937_64& rng) {
  Inputs in;
  p.ld = p.V + 5;
  in.p = p;
  in.logits.assign(static_cast<size_t>(p.rows) * p.ld, std::numeric_limits<double>::quiet_NaN());
  for (int n = 0; n < p.rows; ++n) {
    const auto row = rounded(dt, randn<double>(p.V, rng, 2.0));
    std::copy(row.begin(), row.end(), in.logits.begin() + static_cast<size_t>(n) * p.ld);
  }
  in.steps = randint(p.rows, 1 << 20, rng);
  return in;
}

std::string label(const SampleParams& p, DType dt) {
  return std::string(dtype_label(dt)) + " V=" + std::to_string(p.V) + " T=" + std::to_string(p.temperature) +
         " top_k=" + std::to_string(p.top_k) + " top_p=" + std::to_string(p.top_p) +
         " min_p=" + std::to_string(p.min_p);
}

TEST(SampleRowsCuda, DrawsTheReferenceTokenForTheSameSeedRowAndStep) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int V : {7, 1000, 50257}) {
      const int rows = V == 50257 ? 48 : 96;
      for (SampleParams p :
           {SampleParams{.temperature = 0.0f}, SampleParams{.temperature = 1.0f},
            SampleParams{.temperature = 0.7f, .top_k = 40}, SampleParams{.temperature = 1.2f, .top_p = 0.9f},
            SampleParams{.temperature = 1.0f, .min_p = 0.05f},
            SampleParams{.temperature = 0.8f, .top_k = 300, .top_p = 0.95f, .min_p = 0.02f}}) {
        p.rows = rows;
        p.V = V;
        p.seed = 1234 + V;
        const Inputs in = random_inputs(p, dt, rng);
        const Outputs got = run_device(in, dt, ctx), want = run_reference(in);
        int mismatches = 0;
        for (int n = 0; n < rows; ++n) {
          ASSERT_TRUE(got.tokens[n] >= 0 && got.tokens[n] < V) << label(p, dt) << " row " << n << ": " << got.tokens[n];
          mismatches += got.tokens[n] != want.tokens[n];
        }
        // The kernel and the reference share every float operation (sampler_math.h): equal tokens, all of them.
        EXPECT_EQ(mismatches, 0) << label(p, dt) << ": " << mismatches << " of " << rows << " rows differ";
        EXPECT_EQ(got.steps, want.steps) << label(p, dt);
      }
    }
  }
}

// The largest vocabulary the kernel takes (2^24): masses reach 2^62 and each thread's chunk is 16384 ids.
TEST(SampleRowsCuda, TheLargestVocabularyDrawsTheReferenceToken) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (SampleParams p : {SampleParams{.temperature = 1.0f}, SampleParams{.temperature = 0.9f, .top_k = 1000},
                         SampleParams{.temperature = 1.1f, .top_p = 0.5f, .min_p = 0.01f}}) {
    p.rows = 2;
    p.V = 1 << 24;
    p.seed = 31;
    const Inputs in = random_inputs(p, DType::BF16, rng);
    const Outputs got = run_device(in, DType::BF16, ctx), want = run_reference(in);
    EXPECT_EQ(got.tokens, want.tokens) << label(p, DType::BF16);
  }
}

// The distribution of steps 3-5 in f64 over the rounded logits x: softmax(x / T), top-k (ties kept), top-p over
// the top-k set (kept while the mass strictly above is < p).
std::vector<double> expected_distribution(const SampleParams& p, const double* x) {
  const int V = p.V;
  const double mx = *std::max_element(x, x + V);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
  std::vector<double> w(V);
  double z = 0;
  for (int j = 0; j < V; ++j) {
    const bool in_k = p.top_k == 0 || p.top_k >= V || x[j] >= x[order[p.top_k - 1]];
    w[j] = in_k ? std::exp((x[j] - mx) / p.temperature) : 0;
    z += w[j];
  }
  std::vector<double> prob(V, 0.0);
  double above = 0, kept = 0;
  for (int i = 0; i < V;) {  // groups of equal x, most likely first
    int e = i;
    double group = 0;
    for (; e < V && x[order[e]] == x[order[i]]; ++e) group += w[order[e]];
    if (p.top_p >= 1 || above < p.top_p * z)
      for (int g = i; g < e; ++g) prob[order[g]] = w[order[g]], kept += w[order[g]];
    above += group;
    i = e;
  }
  for (double& q : prob) q /= kept;
  return prob;
}

TEST(SampleRowsCuda, DrawsFollowTheProcessedDistribution) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int V : {7, 1000, 50257}) {
      // One row: 10 planted tokens well above a background (for V = 7, all of them), copied to every row, each
      // row its own Philox stream; 40 calls of 256 rows.
      std::vector<double> row = randn<double>(V, rng, 1.0);
      const int planted = std::min(V, 10);
      for (int i = 0; i < planted; ++i) row[(i * 7919) % V] = 7.0 + 0.4 * i;
      row = rounded(dt, row);
      for (SampleParams p : {SampleParams{.temperature = 0.9f, .top_k = V == 7 ? 0 : 10},
                             SampleParams{.temperature = 0.8f, .top_p = 0.7f}}) {
        p.rows = 256;
        p.V = V;
        p.seed = 77;
        const auto prob = expected_distribution(p, row.data());
        Inputs in;
        in.p = p;
        for (int n = 0; n < p.rows; ++n) in.logits.insert(in.logits.end(), row.begin(), row.end());
        in.steps.assign(p.rows, 0);
        std::vector<int> hist(V, 0);
        const int calls = 40, draws = calls * p.rows;
        for (int c = 0; c < calls; ++c) {
          const Outputs got = run_device(in, dt, ctx);
          for (int32_t t : got.tokens) {
            ASSERT_TRUE(t >= 0 && t < V) << label(p, dt) << ": token " << t;
            ++hist[t];
          }
          in.steps = got.steps;
        }
        double x2 = 0;
        int df = -1;
        for (int j = 0; j < V; ++j) {
          if (prob[j] < 1e-9) {
            // Outside the kept set, or a background token of probability < 1e-9 (none expected in the draws).
            if (prob[j] == 0) {
              EXPECT_EQ(hist[j], 0) << label(p, dt) << ": token " << j << " is outside the set";
            }
            continue;
          }
          const double e = prob[j] * draws;
          x2 += (hist[j] - e) * (hist[j] - e) / e;
          ++df;
        }
        ASSERT_GE(df, 2) << label(p, dt);
        const double a = 2.0 / (9.0 * df), crit = df * std::pow(1 - a + 3.090232 * std::sqrt(a), 3);  // p = 1e-3
        EXPECT_LT(x2, crit) << label(p, dt) << ", df " << df;
      }
    }
  }
}

TEST(SampleRowsCuda, PenaltiesBiasCountsAndLogprobsMatchTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int V : {7, 1000, 50257}) {
      SampleParams p{.rows = 24,
                     .V = V,
                     .temperature = 0.9f,
                     .top_k = 50,
                     .top_p = 0.95f,
                     .repetition_penalty = 1.3f,
                     .presence_penalty = 0.4f,
                     .frequency_penalty = 0.2f,
                     .seed = 5,
                     .count_drawn = true,
                     .logprobs = 8};
      Inputs in = random_inputs(p, dt, rng);
      p = in.p;
      in.counts.assign(static_cast<size_t>(p.rows) * V, 0);
      const int max_len = 64;
      std::vector<int32_t> table = randint(static_cast<size_t>(p.rows) * max_len, V, rng),
                           lengths = randint(p.rows, max_len + 1, rng);
      // The count table from the token table, on the device against the host.
      {
        DeviceArena dev(ctx);
        const Tensor c = dev.upload_i32(in.counts);
        sampler_counts_add(p.rows, V, max_len, c, dev.upload_i32(table), dev.upload_i32(lengths), ctx);
        Context cpu;
        sampler_counts_add(p.rows, V, max_len,
                           Tensor(in.counts.data(), DType::I32, {static_cast<int64_t>(in.counts.size())}),
                           Tensor(table.data(), DType::I32, {static_cast<int64_t>(table.size())}),
                           Tensor(lengths.data(), DType::I32, {p.rows}), cpu);
        EXPECT_EQ(as_i32(dev.download(c)), in.counts) << "sampler_counts_add V=" << V;
      }
      const int n_bias = std::min(V, 5);
      for (int b = 0; b < n_bias; ++b) in.bias_ids.push_back((b * 101) % V), in.bias_values.push_back(b - 2.5);
      in.p.n_bias = p.n_bias = n_bias;
      const Outputs got = run_device(in, dt, ctx), want = run_reference(in);
      const std::string what = label(p, dt);
      // The processed logits: bit-equal in f32; bf16 rounds after the penalty and again after the bias.
      double worst = 0;
      for (int n = 0; n < p.rows; ++n)
        for (int j = 0; j < V; ++j) {
          const size_t i = static_cast<size_t>(n) * p.ld + j;
          worst = std::max(worst, std::abs(got.logits[i] - want.logits[i]) / (1.0 + std::abs(want.logits[i])));
        }
      EXPECT_LE(worst, dt == DType::F32 ? 0.0 : 1.6e-2) << what;
      int mismatches = 0;
      for (int n = 0; n < p.rows; ++n) mismatches += got.tokens[n] != want.tokens[n];
      EXPECT_LE(mismatches, dt == DType::F32 ? 0 : p.rows / 4) << what;
      if (dt == DType::F32) {
        EXPECT_EQ(got.counts, want.counts) << what << ": count_drawn";
      }
      for (int n = 0; n < p.rows; ++n)
        for (int i = 0; i < p.logprobs; ++i) {
          const size_t k = static_cast<size_t>(n) * p.logprobs + i;
          if (dt == DType::F32) {
            EXPECT_EQ(got.lp_ids[k], want.lp_ids[k]) << what << " row " << n << " rank " << i;
          }
          // A rank past the row's finite entries (V = 7 with 8 logprobs, or a masked tail) is -inf on both sides.
          if (std::isinf(want.lp_values[k])) {
            EXPECT_EQ(got.lp_values[k], want.lp_values[k]) << what << " row " << n << " rank " << i;
          } else {
            EXPECT_NEAR(got.lp_values[k], want.lp_values[k], dt == DType::F32 ? 1e-4 : 0.1) << what << " row " << n;
          }
        }
    }
  }
}

TEST(SampleRowsCuda, NanRowsGiveMinusOneAndLeaveTheOthersAlone) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  Inputs in = random_inputs({.rows = 4, .V = 1000, .temperature = 1.0f, .top_p = 0.9f}, DType::F32, rng);
  in.logits[1 * in.p.ld + 517] = std::numeric_limits<double>::quiet_NaN();
  in.logits[3 * in.p.ld + 3] = std::numeric_limits<double>::infinity();
  const Outputs got = run_device(in, DType::F32, ctx);
  EXPECT_EQ(got.tokens[1], -1);
  EXPECT_EQ(got.tokens[3], -1);
  EXPECT_EQ(got.steps[1], in.steps[1]) << "a failed row keeps its step";
  // The good rows draw as the reference does (it throws on a bad row, so it sees them repaired).
  Inputs ref = in;
  for (int m : {1, 3})
    for (int j = 0; j < in.p.V; ++j) ref.logits[m * in.p.ld + j] = 0.0;
  const Outputs want = run_reference(ref);
  for (int n : {0, 2}) {
    EXPECT_EQ(got.tokens[n], want.tokens[n]) << "row " << n;
    EXPECT_EQ(got.steps[n], in.steps[n] + 1);
  }
}

TEST(SampleRowsCuda, AGraphReplaysWithNewDrawsEqualToEagerCalls) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!cuda_graph_capture_supported()) GTEST_SKIP() << "a Debug build (no captures)";
  std::mt19937_64 rng(test_seed());
  const Inputs in =
      random_inputs({.rows = 8, .V = 1000, .temperature = 1.0f, .top_k = 100, .seed = 9}, DType::BF16, rng);
  DeviceArena dev(ctx);
  const Tensor logits = dev.upload(DType::BF16, in.logits), steps = dev.upload_i32(in.steps);
  const Tensor tokens = dev.poisoned(DType::I32, in.p.rows);
  sample_rows(in.p, tokens, logits, {}, {}, {}, steps, {}, {}, ctx);  // eagerly once, as a capture requires
  CudaGraph graph;
  graph.capture(ctx, "sample_rows", [&] { sample_rows(in.p, tokens, logits, {}, {}, {}, steps, {}, {}, ctx); });
  Inputs eager = in;
  for (int replay = 0; replay < 3; ++replay) {
    graph.launch(ctx);
    for (int32_t& s : eager.steps) s += 1;  // the graph's draw uses the step the previous call left
    const Outputs want = run_reference(eager);
    EXPECT_EQ(as_i32(dev.download(tokens)), want.tokens) << "replay " << replay;
    EXPECT_EQ(as_i32(dev.download(steps)), want.steps) << "replay " << replay;
  }
}

}  // namespace
}  // namespace tessera::test
