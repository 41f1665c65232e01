// Beam search on the CPU against a brute-force beam search written plainly here (every K*V extension enumerated
// and sorted, Hugging Face's finished-hypothesis rules as transformers 4.44 writes them), with a toy "model" whose
// logits are a fixed random function of (entry, step, last token, the token before it): the same hypotheses, in
// the same order, with the same scores. Some beams reach EOS early; length penalty 0, 1, 2; early stopping
// true, false and "never"; K 1..4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/infer/beam_search.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr int kV = 11, kEos = 3;

// logits(b, t, last, before) = a[b][t][last][v] + 0.5 b2[before][v], plus an EOS bias that is large at some
// (b, t), so that hypotheses end at different steps.
struct ToyModel {
  int B, N;
  std::vector<float> a, b2, eos_bias;
  ToyModel(int B_, int N_, std::mt19937_64& rng) : B(B_), N(N_) {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    a.resize(static_cast<size_t>(B) * N * kV * kV);
    for (auto& x : a) x = nd(rng);
    b2.resize(kV * kV);
    for (auto& x : b2) x = nd(rng);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    eos_bias.resize(static_cast<size_t>(B) * N);
    for (auto& x : eos_bias) x = u(rng) < 0.3f ? 4.0f : 0.0f;
  }
  void logits(int b, int t, int last, int before, float* out) const {
    for (int v = 0; v < kV; ++v)
      out[v] = a[((static_cast<size_t>(b) * N + t) * kV + last) * kV + v] + 0.5f * b2[before * kV + v] +
               (v == kEos ? eos_bias[b * N + t] : 0.0f);
  }
};
int prompt_token(int b, int i) { return (3 * b + 5 * i + 1) % kV; }  // the 2-token prompt of entry b

struct Hyp {
  double score;
  std::vector<int32_t> tokens;
};

// HF's BeamHypotheses, plainly.
struct PlainHyps {
  int K;
  double length_penalty;
  std::vector<Hyp> beams;
  double worst = 1e9;
  void add(std::vector<int32_t> tokens, double sum_logprobs, int generated_len) {
    const double score = sum_logprobs / std::pow(static_cast<double>(generated_len), length_penalty);
    if (!(static_cast<int>(beams.size()) < K || score > worst)) return;
    beams.push_back({score, std::move(tokens)});
    if (static_cast<int>(beams.size()) > K) {
      std::vector<std::pair<double, int>> sorted;
      for (int i = 0; i < static_cast<int>(beams.size()); ++i) sorted.push_back({beams[i].score, i});
      std::sort(sorted.begin(), sorted.end());
      beams.erase(beams.begin() + sorted[0].second);
      worst = sorted[1].first;
    } else {
      worst = std::min(score, worst);
    }
  }
  bool is_done(double best, int cur_len, beam::EarlyStopping es, int max_new) const {
    if (static_cast<int>(beams.size()) < K) return false;
    if (es == beam::EarlyStopping::True) return true;
    const int len = es == beam::EarlyStopping::Never && length_penalty > 0 ? max_new : cur_len;
    return worst >= best / std::pow(static_cast<double>(len), length_penalty);
  }
};

// The brute force for entry b: the best num_return hypotheses, best first.
std::vector<Hyp> brute_force(const ToyModel& m, int b, const BeamSearchOptions& o) {
  const int K = o.beams;
  struct Beam {
    std::vector<int32_t> tokens;
    double score;
  };
  std::vector<Beam> beams(K, Beam{{}, -std::numeric_limits<double>::infinity()});
  beams[0].score = 0;
  PlainHyps hyps{K, o.length_penalty, {}};
  bool done = false;
  auto token_at = [&](const std::vector<int32_t>& t, int back) {  // back = 1: last, 2: the one before
    const int n = static_cast<int>(t.size());
    return n - back >= 0 ? t[n - back] : prompt_token(b, 2 + n - back);
  };
  for (int t = 0; t < o.max_new_tokens && !done; ++t) {
    std::vector<std::pair<double, int>> cands;  // (-score, beam * V + token)
    for (int i = 0; i < K; ++i) {
      float z[kV];
      m.logits(b, t, token_at(beams[i].tokens, 1), token_at(beams[i].tokens, 2), z);
      double mx = -INFINITY, s = 0;
      for (float x : z) mx = std::max(mx, double(x));
      for (float x : z) s += std::exp(x - mx);
      for (int v = 0; v < kV; ++v) {
        const double score = beams[i].score + (z[v] - (mx + std::log(s)));
        if (score > -INFINITY) cands.push_back({-score, i * kV + v});
      }
    }
    std::sort(cands.begin(), cands.end());
    cands.resize(std::min<size_t>(cands.size(), 2 * K));
    std::vector<Beam> next;
    for (int rank = 0; rank < static_cast<int>(cands.size()) && static_cast<int>(next.size()) < K; ++rank) {
      const int beam = cands[rank].second / kV, token = cands[rank].second % kV;
      const double score = -cands[rank].first;
      if (token == o.eos_id) {
        if (rank >= K) continue;
        std::vector<int32_t> tokens = beams[beam].tokens;
        tokens.push_back(token);
        hyps.add(tokens, score, t + 1);
      } else {
        next.push_back({beams[beam].tokens, score});
        next.back().tokens.push_back(token);
      }
    }
    EXPECT_EQ(static_cast<int>(next.size()), K) << "the toy model left fewer than K beams";
    done = hyps.is_done(-cands[0].first, t + 1, o.early_stopping, o.max_new_tokens);
    beams = next;
  }
  if (!done)
    for (const Beam& bm : beams) hyps.add(bm.tokens, bm.score, o.max_new_tokens);
  std::vector<Hyp> sorted = hyps.beams;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Hyp& x, const Hyp& y) { return x.score < y.score; });
  std::vector<Hyp> out;
  for (int j = 0; j < o.num_return_sequences && !sorted.empty(); ++j) {
    out.push_back(sorted.back());
    sorted.pop_back();
  }
  return out;
}

// The engine's side: the rows' last two tokens follow the parents (the slot reorder an engine does), the toy
// model's logits for each row, one BeamSearch step each.
std::vector<std::vector<BeamSequence>> run_beam_search(const ToyModel& m, const BeamSearchOptions& o) {
  Context ctx(Device::cpu());
  BeamSearch bs(o, ctx);
  const int B = o.batch, K = o.beams, S = B * K;
  std::vector<int> last(S), before(S);
  for (int r = 0; r < S; ++r) {
    last[r] = prompt_token(r / K, 1);
    before[r] = prompt_token(r / K, 0);
  }
  std::vector<float> logits(static_cast<size_t>(S) * kV);
  for (int t = 0; t < o.max_new_tokens; ++t) {
    for (int r = 0; r < S; ++r) m.logits(r / K, t, last[r], before[r], logits.data() + r * kV);
    bs.step(Tensor(logits.data(), DType::F32, {S, kV}), 0, ctx);
    const int32_t* tok = bs.next_tokens().as<int32_t>();
    const int32_t* par = bs.parents().as<int32_t>();
    if (t == 0) {
      for (int r = 0; r < S; ++r) EXPECT_EQ(par[r] % K, 0) << "only beam 0 expands at step 0";
    }
    std::vector<int> new_last(S), new_before(S);
    for (int r = 0; r < S; ++r) {
      new_before[r] = last[par[r]];
      new_last[r] = tok[r];
    }
    last = new_last;
    before = new_before;
  }
  return bs.finish(ctx);
}

TEST(BeamSearch, EqualsBruteForce) {
  std::mt19937_64 rng(test::test_seed());
  int eos_ended = 0, compared = 0;
  for (int K = 1; K <= 4; ++K)
    for (float lp : {0.0f, 1.0f, 2.0f})
      for (auto es : {beam::EarlyStopping::False, beam::EarlyStopping::True, beam::EarlyStopping::Never}) {
        const BeamSearchOptions o{.batch = 3,
                                  .beams = K,
                                  .vocab = kV,
                                  .max_new_tokens = 6,
                                  .eos_id = kEos,
                                  .pad_id = 0,
                                  .length_penalty = lp,
                                  .early_stopping = es,
                                  .num_return_sequences = K};
        const ToyModel m(o.batch, o.max_new_tokens, rng);
        const auto got = run_beam_search(m, o);
        ASSERT_EQ(static_cast<int>(got.size()), o.batch);
        for (int b = 0; b < o.batch; ++b) {
          const auto want = brute_force(m, b, o);
          SCOPED_TRACE("K " + std::to_string(K) + " lp " + std::to_string(lp) + " early_stopping " +
                       std::to_string(static_cast<int>(es)) + " entry " + std::to_string(b) + " seed " +
                       std::to_string(test::test_seed()));
          ASSERT_EQ(got[b].size(), want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(got[b][i].tokens, want[i].tokens) << "hypothesis " << i;
            EXPECT_NEAR(got[b][i].score, want[i].score, 1e-4) << "hypothesis " << i;
            eos_ended += !want[i].tokens.empty() && want[i].tokens.back() == kEos &&
                         static_cast<int>(want[i].tokens.size()) < o.max_new_tokens;
            ++compared;
          }
        }
      }
  // The matrix reaches the cases it is meant to: hypotheses that ended early with EOS, among others.
  EXPECT_GT(eos_ended, compared / 10);
  EXPECT_LT(eos_ended, compared);
}

TEST(BeamSearch, NumReturnSequencesIsTheBestPrefix) {
  std::mt19937_64 rng(test::test_seed());
  BeamSearchOptions o{.batch = 2,
                      .beams = 4,
                      .vocab = kV,
                      .max_new_tokens = 5,
                      .eos_id = kEos,
                      .length_penalty = 1.0f,
                      .num_return_sequences = 4};
  const ToyModel m(o.batch, o.max_new_tokens, rng);
  const auto all = run_beam_search(m, o);
  o.num_return_sequences = 2;
  const auto two = run_beam_search(m, o);
  for (int b = 0; b < 2; ++b) {
    ASSERT_EQ(two[b].size(), 2u);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(two[b][i].tokens, all[b][i].tokens);
    EXPECT_GE(all[b][0].score, all[b][1].score);
  }
}

TEST(BeamSearch, ImpossibleOptionsAreOneLine) {
  const BeamSearchOptions ok{.batch = 1, .beams = 2, .vocab = kV, .max_new_tokens = 3, .eos_id = kEos};
  EXPECT_NO_THROW(beam_search_check(ok));
  auto bad = [&](auto edit) {
    BeamSearchOptions o = ok;
    edit(o);
    EXPECT_THROW(beam_search_check(o), Error);
  };
  bad([](BeamSearchOptions& o) { o.beams = kV + 1; });
  bad([](BeamSearchOptions& o) { o.beams = 0; });
  bad([](BeamSearchOptions& o) { o.eos_id = kV; });
  bad([](BeamSearchOptions& o) { o.num_return_sequences = 3; });
  bad([](BeamSearchOptions& o) { o.max_new_tokens = 0; });
  Context ctx(Device::cpu());
  BeamSearch bs(ok, ctx);
  std::vector<float> z(2 * kV, 0.0f);
  for (int t = 0; t < 3; ++t) bs.step(Tensor(z.data(), DType::F32, {2, kV}), 0, ctx);
  EXPECT_THROW(bs.step(Tensor(z.data(), DType::F32, {2, kV}), 0, ctx), Error);
}

}  // namespace
}  // namespace tessera
