// The batched generation loop (infer/generator.h) on the CPU in f32: a batch of unequal prompts gives each prompt's
// tokens alone (greedy, and seeded sampling row by row), greedy equals the full-recompute generate(), each row stops
// on its own (EOS, stop strings, min-new-tokens, ignore-eos, a full context while other rows run), a seed
// reproduces, the penalties follow sample_rows_ref step by step over full forwards, and the logprobs are the
// log-softmax of the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/infer/engine.h"
#include "tessera/infer/generator.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/gpt.h"
#include "test_util.h"

namespace tessera {
namespace {

using Prompts = std::vector<std::vector<int32_t>>;

// Each id as one char: a stand-in for a tokenizer that the stop strings match through.
std::string decode_chars(const std::vector<int32_t>& t) {
  std::string s;
  for (int32_t id : t) s.push_back(static_cast<char>('A' + id));
  return s;
}
const TextDecoder kCodec = decode_chars;

ModelConfig config(bool llama) {
  ModelConfig c = test::small_config(/*vocab=*/29, /*d_model=*/32, /*n_layers=*/2, /*n_heads=*/4, /*d_ff=*/40,
                                     /*max_seq=*/24);
  if (llama) {
    c = llama_style(c);
    c.n_kv_heads = 2;
  }
  return c;
}

// Weights larger than the 0.02 initialisation, so that the logits differ clearly across tokens.
void init(Model& m, uint64_t seed) {
  m.init_weights(seed);
  std::vector<float> w = m.params().read_f32(m.context());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (float& x : w) x += x == 0.0f ? 0.0f : d(rng);
  m.params().write_f32(w, m.context());
}

GenerateOptions greedy(int max_new) {
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = max_new;
  return o;
}
GenerateOptions sampled(int max_new, uint64_t seed) {
  GenerateOptions o;
  o.sampling = {.temperature = 1.0f, .top_k = 10, .top_p = 0.95f, .seed = seed};
  o.max_new_tokens = max_new;
  return o;
}

std::vector<GeneratedSequence> run(Model& m, const Prompts& prompts, const GenerateOptions& o,
                                   const OnText& on_text = {}) {
  Engine e(m, generator_engine_options(prompts, static_cast<int>(prompts.size()), o, m.config().max_seq));
  return generate_batch(e, prompts, o, kCodec, on_text);
}
GeneratedSequence run_one(Model& m, const std::vector<int32_t>& prompt, const GenerateOptions& o) {
  return run(m, {prompt}, o)[0];
}

// Prompts of lengths 5, 1, 9 and 3.
Prompts prompts_for(std::mt19937_64& rng) {
  return {test::randint(5, 29, rng), test::randint(1, 29, rng), test::randint(9, 29, rng), test::randint(3, 29, rng)};
}

TEST(Generator, BatchOfUnequalPromptsEqualsEachAlone) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    Gpt m(config(llama));
    init(m, 11 + test::test_seed() % 1000);
    std::mt19937_64 rng(test::test_seed());
    const Prompts p = prompts_for(rng);
    const auto batch = run(m, p, greedy(12));
    ASSERT_EQ(batch.size(), p.size());
    for (size_t b = 0; b < p.size(); ++b) {
      const GeneratedSequence alone = run_one(m, p[b], greedy(12));
      EXPECT_EQ(batch[b].tokens, alone.tokens) << "row " << b;
      EXPECT_EQ(batch[b].tokens.size(), 12u);
      EXPECT_EQ(batch[b].finish, FinishReason::Length);
      EXPECT_EQ(batch[b].text, decode_chars(batch[b].tokens));
      // Greedy against the full-recompute generate() (no cache, no batch).
      const std::vector<int32_t> full = generate(m, p[b], 12, {.temperature = 0});
      EXPECT_EQ(batch[b].tokens,
                std::vector<int32_t>(full.begin() + static_cast<std::ptrdiff_t>(p[b].size()), full.end()))
          << "row " << b;
    }
    // Seeded sampling: a row draws the same tokens whatever the other rows hold, and row 0 alone as in the batch.
    const auto s1 = run(m, p, sampled(12, 5));
    Prompts other = prompts_for(rng);
    other[2] = p[2];
    const auto s2 = run(m, other, sampled(12, 5));
    EXPECT_EQ(s1[2].tokens, s2[2].tokens);
    EXPECT_NE(s1[0].tokens, s2[0].tokens);  // other prompts, other tokens (a chance of 29^-12 to be equal)
    EXPECT_EQ(run_one(m, p[0], sampled(12, 5)).tokens, s1[0].tokens);
  }
}

TEST(Generator, SeedReproducesAndChangesTheDraws) {
  Gpt m(config(false));
  init(m, 3);
  std::mt19937_64 rng(test::test_seed());
  const Prompts p = prompts_for(rng);
  const auto a = run(m, p, sampled(16, 42)), b = run(m, p, sampled(16, 42)), c = run(m, p, sampled(16, 43));
  int differ = 0;
  for (size_t r = 0; r < p.size(); ++r) {
    EXPECT_EQ(a[r].tokens, b[r].tokens) << r;
    differ += a[r].tokens != c[r].tokens;
  }
  EXPECT_GT(differ, 0);
}

// The first occurrence of `eos` in `tokens` ends it (kept); no occurrence keeps all of it.
std::vector<int32_t> cut_at(const std::vector<int32_t>& tokens, int32_t eos) {
  const auto it = std::find(tokens.begin(), tokens.end(), eos);
  return std::vector<int32_t>(tokens.begin(), it == tokens.end() ? it : it + 1);
}

TEST(Generator, EachRowStopsOnItsOwn) {
  Gpt m(config(false));
  init(m, 5 + test::test_seed() % 1000);
  std::mt19937_64 rng(test::test_seed());
  const Prompts p = prompts_for(rng);
  const int n = 14;
  const auto free = run(m, p, greedy(n));
  // EOS: row 1's third token is the EOS id; every row ends at its own first EOS, or runs to the length.
  const int32_t eos = free[1].tokens[2];
  GenerateOptions o = greedy(n);
  o.eos_ids = {27, eos};
  const auto ended = run(m, p, o);
  int stopped = 0;
  for (size_t b = 0; b < p.size(); ++b) {
    const std::vector<int32_t> a = cut_at(cut_at(free[b].tokens, eos), 27);
    EXPECT_EQ(ended[b].tokens, a) << b;
    const bool by_eos = a.size() < static_cast<size_t>(n) || a.back() == eos || a.back() == 27;
    EXPECT_EQ(ended[b].finish, by_eos ? FinishReason::Eos : FinishReason::Length) << b;
    if (by_eos) {
      EXPECT_EQ(ended[b].text, decode_chars({a.begin(), a.end() - 1})) << b;
    }
    stopped += by_eos;
  }
  EXPECT_GE(stopped, 1);
  EXPECT_LE(ended[1].tokens.size(), 3u);
  // ignore-eos: the same tokens as without an EOS.
  o.ignore_eos = true;
  const auto ignored = run(m, p, o);
  for (size_t b = 0; b < p.size(); ++b) {
    EXPECT_EQ(ignored[b].tokens, free[b].tokens) << b;
    EXPECT_EQ(ignored[b].finish, FinishReason::Length) << b;
  }
  // min-new-tokens: row 0's first token as the EOS can end no row before 4 tokens; those 4 are what a ban of it
  // (a logit bias of -inf) draws.
  GenerateOptions mn = greedy(n);
  const int32_t first = free[0].tokens[0];
  mn.eos_ids = {first};
  mn.min_new_tokens = 4;
  const auto late = run(m, p, mn);
  GenerateOptions ban = greedy(4);
  ban.logit_bias = {{first, -INFINITY}};
  const auto banned = run(m, p, ban);
  for (size_t b = 0; b < p.size(); ++b) {
    ASSERT_GE(late[b].tokens.size(), 4u) << b;
    EXPECT_EQ(std::vector<int32_t>(late[b].tokens.begin(), late[b].tokens.begin() + 4), banned[b].tokens) << b;
    const auto at = std::find(late[b].tokens.begin(), late[b].tokens.end(), first);
    EXPECT_EQ(late[b].finish, at == late[b].tokens.end() ? FinishReason::Length : FinishReason::Eos) << b;
    if (at != late[b].tokens.end()) {
      EXPECT_EQ(at + 1, late[b].tokens.end()) << b;
    }
  }
}

TEST(Generator, StopStringsCutTheTextAndStreamNothingCut) {
  Gpt m(config(true));
  init(m, 9 + test::test_seed() % 1000);
  std::mt19937_64 rng(test::test_seed());
  const Prompts p = prompts_for(rng);
  const int n = 14;
  const auto free = run(m, p, greedy(n));
  // Row 2's tokens 3 and 4 as a stop string (two chars: it is completed by a token after a held-back char).
  const std::string stop = decode_chars({free[2].tokens[3], free[2].tokens[4]});
  GenerateOptions o = greedy(n);
  o.stop = {stop, "never\x7f"};
  std::vector<std::string> streamed(p.size());
  const auto cut = run(m, p, o, [&](int row, const std::string& piece) { streamed.at(row) += piece; });
  for (size_t b = 0; b < p.size(); ++b) {
    // Expected: the shortest prefix of the free tokens whose text holds the stop string.
    size_t k = 0;
    while (k < free[b].tokens.size() &&
           decode_chars({free[b].tokens.begin(), free[b].tokens.begin() + static_cast<std::ptrdiff_t>(k)}).find(stop) ==
               std::string::npos)
      ++k;
    const std::string full = decode_chars(free[b].tokens);
    if (full.find(stop) == std::string::npos) {
      EXPECT_EQ(cut[b].tokens, free[b].tokens) << b;
      EXPECT_EQ(cut[b].finish, FinishReason::Length) << b;
      EXPECT_EQ(cut[b].text, full) << b;
    } else {
      EXPECT_EQ(cut[b].tokens, std::vector<int32_t>(free[b].tokens.begin(), free[b].tokens.begin() + k)) << b;
      EXPECT_EQ(cut[b].finish, FinishReason::Stop) << b;
      EXPECT_EQ(cut[b].text, full.substr(0, full.find(stop))) << b;
    }
    EXPECT_EQ(streamed[b], cut[b].text) << b;
  }
  EXPECT_EQ(cut[2].finish, FinishReason::Stop);
}

// A decoder whose tokens cut UTF-8 characters ("\xE6\x97" the first two bytes of a 3-byte one, "\xA5" its last):
// while a row runs, no streamed piece ends inside a character of the row's text, and the pieces add up to the text.
// Whether position j of text falls inside a character: text[j] continues a lead byte that begins at most 3 bytes
// before it and whose character is long enough to reach j.
bool inside_utf8_char(const std::string& text, size_t j) {
  if (j >= text.size() || (static_cast<unsigned char>(text[j]) & 0xC0) != 0x80) return false;
  for (size_t k = 1; k <= 3 && k <= j; ++k) {
    const auto c = static_cast<unsigned char>(text[j - k]);
    if ((c & 0xC0) == 0x80) continue;
    const size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return n > k;
  }
  return false;
}

TEST(Generator, StreamsWholeUtf8Characters) {
  Gpt m(config(false));
  init(m, 5 + test::test_seed() % 1000);
  std::mt19937_64 rng(test::test_seed());
  const Prompts p = prompts_for(rng);
  const TextDecoder cut_chars = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t id : t) s += id % 3 == 0 ? "\xE6\x97" : id % 3 == 1 ? "\xA5" : "x";
    return s;
  };
  const GenerateOptions o = sampled(16, 3);
  Engine e(m, generator_engine_options(p, static_cast<int>(p.size()), o, m.config().max_seq));
  std::vector<std::vector<std::string>> pieces(p.size());
  const auto out =
      generate_batch(e, p, o, cut_chars, [&](int row, const std::string& piece) { pieces.at(row).push_back(piece); });
  int held = 0;  // steps that end inside a character of the row's text: the case the hold-back is for
  for (size_t b = 0; b < p.size(); ++b) {
    std::string so_far;
    for (size_t i = 0; i < pieces[b].size(); ++i) {
      so_far += pieces[b][i];
      if (i + 1 < pieces[b].size()) {
        EXPECT_FALSE(inside_utf8_char(out[b].text, so_far.size())) << b << " piece " << i;
      }
    }
    EXPECT_EQ(so_far, out[b].text) << b;
    EXPECT_EQ(out[b].text, cut_chars(out[b].tokens)) << b;
    for (size_t k = 1; k < out[b].tokens.size(); ++k)
      held += inside_utf8_char(
          out[b].text,
          cut_chars({out[b].tokens.begin(), out[b].tokens.begin() + static_cast<std::ptrdiff_t>(k)}).size());
  }
  EXPECT_GT(held, 0) << "no row ever ended on a cut character: the test does not exercise the hold-back";
}

// The longest prompt fills the 24-position context after 24 - 20 + 1 new tokens while the others run on: it ends
// with "length", and the others still give their tokens alone (the finished row follows a running one).
TEST(Generator, AFullContextEndsItsRowAloneWhileOthersRun) {
  Gpt m(config(false));
  init(m, 21);
  std::mt19937_64 rng(test::test_seed());
  const Prompts p = {test::randint(20, 29, rng), test::randint(2, 29, rng), test::randint(24, 29, rng),
                     test::randint(7, 29, rng)};
  for (const GenerateOptions& o : {greedy(15), sampled(15, 8)}) {
    const auto batch = run(m, p, o);
    EXPECT_EQ(batch[0].tokens.size(), 5u);
    EXPECT_EQ(batch[1].tokens.size(), 15u);
    EXPECT_EQ(batch[2].tokens.size(), 1u);  // a full prompt: one token, drawn from the full cache
    for (const auto& s : batch) EXPECT_EQ(s.finish, FinishReason::Length);
    // Row 0 alone, and row 1 in a batch that holds it at row 1 with a short row 0.
    EXPECT_EQ(run_one(m, p[0], o).tokens, batch[0].tokens);
    const auto pair = run(m, {p[3], p[1]}, o);
    EXPECT_EQ(pair[1].tokens, batch[1].tokens);
  }
  EXPECT_TRUE(generator_engine_options(p, 4, greedy(15), 24).slot_table);
  EXPECT_FALSE(generator_engine_options(p, 4, greedy(1), 24).slot_table);
}

// The sampler's inputs rebuilt by hand for each step: a full forward over the prompt and the tokens so far, the
// count table of that sequence, step i: sample_rows_ref must draw the generator's token i.
TEST(Generator, PenaltiesFollowTheReferenceStepByStep) {
  Gpt m(config(false));
  init(m, 17);
  std::mt19937_64 rng(test::test_seed());
  const std::vector<int32_t> prompt = test::randint(6, 29, rng);
  GenerateOptions o = sampled(8, 77);
  o.sampling.repetition_penalty = 1.8f;
  o.sampling.presence_penalty = 0.7f;
  o.sampling.frequency_penalty = 0.4f;
  const int32_t boosted = prompt[0] == 3 ? 4 : 3;  // a bias list names each id once
  o.logit_bias = {{boosted, 2.5f}, {prompt[0], -1.0f}};
  const GeneratedSequence g = run_one(m, prompt, o);
  ASSERT_EQ(g.tokens.size(), 8u);
  std::vector<int32_t> seq = prompt;
  const int V = m.config().vocab;
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    m.forward(seq.data(), nullptr, 1, static_cast<int>(seq.size()), {});
    std::vector<float> logits = m.read_logits_row(static_cast<int>(seq.size()) - 1);
    std::vector<int32_t> counts(V, 0);
    for (int32_t t : seq) ++counts[t];
    SampleParams p = o.sampling;
    p.rows = 1;
    p.V = V;
    p.n_bias = 2;
    const int32_t ids[2] = {boosted, prompt[0]};
    const float values[2] = {2.5f, -1.0f};
    uint32_t step = static_cast<uint32_t>(i);
    int32_t token = -1;
    sample_rows_ref<float>(p, &token, logits.data(), counts.data(), ids, values, &step, nullptr, nullptr);
    EXPECT_EQ(token, g.tokens[i]) << "step " << i;
    seq.push_back(g.tokens[i]);
  }
  // And the penalties change the draws (against the same seed without them).
  GenerateOptions plain = sampled(8, 77);
  const auto many = run(m, {prompt, prompt, prompt}, o), none = run(m, {prompt, prompt, prompt}, plain);
  int differ = 0;
  for (size_t b = 0; b < many.size(); ++b) differ += many[b].tokens != none[b].tokens;
  EXPECT_GT(differ, 0);
}

TEST(Generator, LogprobsAreTheLogSoftmaxOfTheLogits) {
  Gpt m(config(true));
  init(m, 23);
  std::mt19937_64 rng(test::test_seed());
  const std::vector<int32_t> prompt = test::randint(4, 29, rng);
  for (float temperature : {0.0f, 0.7f}) {
    GenerateOptions o = temperature == 0 ? greedy(5) : sampled(5, 3);
    o.sampling.temperature = temperature;
    o.sampling.top_k = 0;
    o.sampling.top_p = 1;
    o.sampling.logprobs = 6;
    const GeneratedSequence g = run_one(m, prompt, o);
    ASSERT_EQ(g.logprobs.size(), g.tokens.size());
    std::vector<int32_t> seq = prompt;
    for (size_t i = 0; i < g.tokens.size(); ++i) {
      m.forward(seq.data(), nullptr, 1, static_cast<int>(seq.size()), {});
      const std::vector<float> l = m.read_logits_row(static_cast<int>(seq.size()) - 1);
      const double T = temperature == 0 ? 1.0 : temperature;
      double mx = -INFINITY, z = 0;
      for (float x : l) mx = std::max(mx, x / T);
      for (float x : l) z += std::exp(x / T - mx);
      std::vector<int> order(l.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      const StepLogprobs& lp = g.logprobs[i];
      ASSERT_EQ(lp.top.size(), 6u);
      for (int j = 0; j < 6; ++j) {
        EXPECT_EQ(lp.top[j].first, order[j]) << "step " << i << " rank " << j;
        EXPECT_NEAR(lp.top[j].second, l[order[j]] / T - mx - std::log(z), 1e-4) << "step " << i << " rank " << j;
      }
      const auto chosen =
          std::find_if(lp.top.begin(), lp.top.end(), [&](const auto& e) { return e.first == g.tokens[i]; });
      if (chosen == lp.top.end()) EXPECT_TRUE(std::isnan(lp.chosen));
      else EXPECT_EQ(lp.chosen, chosen->second);
      if (temperature == 0) {
        EXPECT_EQ(g.tokens[i], order[0]);
      }
      seq.push_back(g.tokens[i]);
    }
  }
}

TEST(Generator, ZeroNewTokensAndBadOptions) {
  Gpt m(config(false));
  init(m, 1);
  const auto none = run(m, {{1, 2, 3}}, greedy(0));
  EXPECT_TRUE(none[0].tokens.empty());
  EXPECT_EQ(none[0].finish, FinishReason::Length);
  auto refused = [&](GenerateOptions o, const std::string& said) {
    try {
      generate_options_check(o, 29);
      ADD_FAILURE() << "accepted: " << said;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(said), std::string::npos) << e.what();
    }
  };
  GenerateOptions o = greedy(4);
  o.eos_ids = {29};
  refused(o, "--eos-id 29 is outside the model's vocabulary [0, 29)");
  o = greedy(4);
  o.min_new_tokens = 5;
  refused(o, "--min-new-tokens 5 is more than --max-new-tokens 4");
  o = greedy(4);
  o.stop = {""};
  refused(o, "--stop");
  o = greedy(4);
  o.logit_bias = {{2, 1.0f}, {2, 3.0f}};
  refused(o, "--logit-bias: token id 2 is listed twice");
  o = greedy(4);
  o.sampling.top_k = -1;
  refused(o, "--top-k must be >= 0");
}

}  // namespace
}  // namespace tessera
