// The seq2seq engine (infer/seq2seq_engine.h) on the CPU in f32 against EncoderDecoder's own full forward: each
// decode step's logits equal the forward's logits over the growing target, for BART's form (post-norm, learned
// positions from row 2, layernorm_embedding, GELU) and the pre-norm Transformer's (sinusoidal positions, ReLU,
// grouped KV heads, separate tables, untied head); a padded batch of unequal source lengths equals each source
// alone; beam search equals a host re-implementation of its rules over full forwards (no cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "tessera/infer/seq2seq_engine.h"
#include "test_util.h"

namespace tessera {
namespace {

EncDecConfig bart_like() {
  EncDecConfig c = encdec_preset("tiny");
  c.vocab = 17;
  c.d_model = 16;
  c.n_heads = 4;
  c.d_ff = 24;
  c.max_seq = 12;
  return c;
}

EncDecConfig prenorm_gqa() {
  EncDecConfig c = encdec_preset("transformer-base");
  c.vocab = 15;
  c.src_vocab = 13;
  c.shared_embeddings = false;
  c.tied_output = false;
  c.enc_layers = 2;
  c.dec_layers = 3;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 20;
  c.max_seq = 12;
  c.placement = NormPlacement::Pre;
  return c;
}

std::vector<std::vector<int32_t>> random_sources(const EncDecConfig& c, const std::vector<int>& lens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(3, c.source_vocab() - 1);
  std::vector<std::vector<int32_t>> s;
  for (int L : lens) {
    s.emplace_back();
    for (int i = 0; i < L; ++i) s.back().push_back(id(rng));
  }
  return s;
}

// The full forward's logits row (b, t) over targets tgt (B rows of Tt tokens, decoder_start first).
std::vector<std::vector<float>> full_logits(EncoderDecoder& m, const std::vector<std::vector<int32_t>>& src,
                                            const std::vector<std::vector<int32_t>>& tgt) {
  const int B = static_cast<int>(src.size()), Tt = static_cast<int>(tgt[0].size());
  int Ts = 0;
  for (const auto& s : src) Ts = std::max(Ts, static_cast<int>(s.size()));
  std::vector<int32_t> sp(size_t(B) * Ts, 5), sl, tp, tl(size_t(B), Tt);
  for (int b = 0; b < B; ++b) {
    std::copy(src[b].begin(), src[b].end(), sp.begin() + b * Ts);
    sl.push_back(static_cast<int32_t>(src[b].size()));
    tp.insert(tp.end(), tgt[b].begin(), tgt[b].end());
  }
  m.forward({.B = B,
             .Ts = Ts,
             .Tt = Tt,
             .src = sp.data(),
             .src_lens = sl.data(),
             .tgt_in = tp.data(),
             .tgt_out = nullptr,
             .tgt_lens = tl.data()});
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < B * Tt; ++r) rows.push_back(m.read_logits_row(r));
  return rows;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1.0f + std::abs(b[i]))) << what << " at " << i;
}

void check_steps_match_forward(const EncDecConfig& cfg) {
  Context ctx(Device::cpu());
  EncoderDecoder m(cfg, ctx);
  m.init_weights(test::test_seed());
  const std::vector<int> lens{5, 2, 7};
  const auto src = random_sources(cfg, lens, test::test_seed() + 1);
  const int B = 3, T = 6;
  Seq2SeqEngine e(m, {.batch = B, .beams = 1, .max_src = 8, .max_tgt = 8});
  e.encode(src);
  // Each step's logits; the next input token is a fixed random id (so that every row's target differs).
  std::mt19937_64 rng(test::test_seed() + 2);
  std::uniform_int_distribution<int> id(3, cfg.vocab - 1);
  std::vector<std::vector<int32_t>> tgt(B, std::vector<int32_t>{cfg.decoder_start_id});
  std::vector<std::vector<std::vector<float>>> steps(T);
  for (int t = 0; t < T; ++t) {
    e.decode();
    for (int b = 0; b < B; ++b) steps[t].push_back(e.read_logits_row(b));
    if (t + 1 == T) break;
    std::vector<int32_t> next;
    for (int b = 0; b < B; ++b) {
      next.push_back(id(rng));
      tgt[b].push_back(next.back());
    }
    e.set_tokens(next);
  }
  const auto full = full_logits(m, src, tgt);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) expect_near(steps[t][b], full[size_t(b) * T + t], "step vs forward");

  // Each source alone through a one-row engine gives its row of the padded batch.
  Seq2SeqEngine one(m, {.batch = 1, .beams = 1, .max_src = 8, .max_tgt = 8});
  for (int b = 0; b < B; ++b) {
    one.encode({src[b]});
    for (int t = 0; t < T; ++t) {
      one.decode();
      expect_near(one.read_logits_row(0), steps[t][b], "alone vs batch");
      if (t + 1 < T) one.set_tokens({tgt[b][t + 1]});
    }
  }
}

TEST(Seq2SeqEngine, StepsEqualFullForwardPostNormLearned) { check_steps_match_forward(bart_like()); }
TEST(Seq2SeqEngine, StepsEqualFullForwardPreNormSinusoidalGqa) { check_steps_match_forward(prenorm_gqa()); }

TEST(Seq2SeqEngine, GreedyEqualsArgmaxOfFullForward) {
  const EncDecConfig cfg = bart_like();
  Context ctx(Device::cpu());
  EncoderDecoder m(cfg, ctx);
  m.init_weights(test::test_seed() + 7);
  const auto src = random_sources(cfg, {4, 6}, test::test_seed() + 8);
  Seq2SeqEngine e(m, {.batch = 2, .beams = 1, .max_src = 8, .max_tgt = 8});
  const auto out = seq2seq_greedy(e, src, {5, 3});
  for (size_t b = 0; b < src.size(); ++b) {
    // Re-derive row b's greedy output with full forwards of the growing target.
    std::vector<int32_t> tgt{cfg.decoder_start_id}, want;
    for (int t = 0; t < (b == 0 ? 5 : 3); ++t) {
      const auto full = full_logits(m, {src[b]}, {tgt});
      const auto& row = full.back();
      const int32_t v = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      if (v == cfg.eos_id) break;
      want.push_back(v);
      tgt.push_back(v);
    }
    EXPECT_EQ(out[b], want) << "source " << b;
  }
}

}  // namespace
}  // namespace tessera
