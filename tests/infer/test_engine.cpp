// The inference engine on the CPU in f32: its KV-cache decode gives the logits of a full forward over the growing
// sequence (GPT-2-style and Llama-style with grouped KV heads, odd widths), with batch padding, through a slot
// table that aliases rows, and greedy output equal to the full-recompute generate().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tessera/infer/engine.h"
#include "tessera/infer/sampler.h"
#include "tessera/models/gpt.h"
#include "test_util.h"

namespace tessera {
namespace {

// f32 against f32: the same ops in another grouping (the cache's views, one row at a time) differ by rounding.
constexpr double kTol = 1e-5;

struct Case {
  const char* name;
  ModelConfig cfg;
};

ModelConfig gpt2_odd() {
  ModelConfig c = test::small_config(/*vocab=*/29, /*d_model=*/48, /*n_layers=*/2, /*n_heads=*/3, /*d_ff=*/40,
                                     /*max_seq=*/24);
  return c;
}
ModelConfig llama_gqa(int kv_heads) {
  ModelConfig c = llama_style(test::small_config(/*vocab=*/31, /*d_model=*/32, /*n_layers=*/2, /*n_heads=*/4,
                                                 /*d_ff=*/24, /*max_seq=*/24));
  c.n_kv_heads = kv_heads;
  return c;
}

std::vector<Case> cases() {
  ModelConfig relu = gpt2_odd();
  relu.mlp = Activation::Relu;
  relu.tied = false;
  relu.emb_scale = 1.5f;
  return {{"gpt2_48x3", gpt2_odd()},
          {"llama_kv1", llama_gqa(1)},
          {"llama_kv2", llama_gqa(2)},
          {"gpt2_relu_untied_scaled", relu}};
}

// Weights larger than the 0.02 initialisation, so that the logits differ clearly across tokens and positions.
void init(Model& m, uint64_t seed) {
  m.init_weights(seed);
  std::vector<float> w = m.params().read_f32(m.context());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (float& x : w) x += x == 0.0f ? 0.0f : d(rng);
  m.params().write_f32(w, m.context());
}

// The logits of the last token of `seq` from a full forward.
std::vector<float> full_last(Model& m, const std::vector<int32_t>& seq) {
  const int T = static_cast<int>(seq.size());
  m.forward(seq.data(), nullptr, 1, T, {});
  return m.read_logits_row(T - 1);
}

double rel(const std::vector<float>& a, const std::vector<float>& b) { return test::rel_error(a, b); }

TEST(Engine, KvCacheDecodeEqualsFullForward) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Gpt model(c.cfg);
    init(model, 7 + test::test_seed() % 1000);
    std::mt19937_64 rng(test::test_seed());
    std::vector<int32_t> seq = test::randint(3, c.cfg.vocab, rng);
    Engine eng(model, {.batch = 1, .max_prompt = 8});
    eng.prefill({seq});
    EXPECT_LT(rel(eng.read_logits_row(0), full_last(model, seq)), kTol) << "prefill";
    // Decode 12 tokens one by one (random inputs: every position and token reaches the check).
    for (int i = 0; i < 12; ++i) {
      const int32_t next = test::randint(1, c.cfg.vocab, rng)[0];
      seq.push_back(next);
      eng.set_tokens({next});
      eng.decode(/*greedy=*/false);
      ASSERT_EQ(eng.last_rows(), 1);
      const double e = rel(eng.read_logits_row(0), full_last(model, seq));
      EXPECT_LT(e, kTol) << "step " << i << " (" << seq.size() << " tokens), seed " << test::test_seed();
    }
  }
}

TEST(Engine, BatchWithPaddingEqualsEachPromptAlone) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Gpt model(c.cfg);
    init(model, 11);
    std::mt19937_64 rng(test::test_seed());
    std::vector<std::vector<int32_t>> seqs;
    for (int len : {1, 5, 9}) seqs.push_back(test::randint(static_cast<size_t>(len), c.cfg.vocab, rng));
    Engine batched(model, {.batch = 3, .max_prompt = 9});
    batched.prefill(seqs);
    ASSERT_EQ(batched.last_rows(), 3);
    for (int b = 0; b < 3; ++b) EXPECT_LT(rel(batched.read_logits_row(b), full_last(model, seqs[b])), kTol) << b;
    std::vector<std::vector<std::vector<float>>> alone(3);
    for (int step = 0; step < 5; ++step) {
      std::vector<int32_t> next = test::randint(3, c.cfg.vocab, rng);
      batched.set_tokens(next);
      batched.decode(false);
      for (int b = 0; b < 3; ++b) {
        seqs[b].push_back(next[b]);
        EXPECT_LT(rel(batched.read_logits_row(b), full_last(model, seqs[b])), kTol) << "row " << b << " step " << step;
      }
    }
    // Each prompt alone through an engine of its own gives the same rows.
    for (int b = 0; b < 3; ++b) {
      Engine one(model, {.batch = 1, .max_prompt = 9});
      const std::vector<int32_t> prompt(seqs[b].begin(), seqs[b].end() - 5);
      one.prefill({prompt});
      for (int step = 0; step < 5; ++step) {
        one.set_tokens({seqs[b][prompt.size() + step]});
        one.decode(false);
      }
      EXPECT_LT(rel(one.read_logits_row(0), batched.read_logits_row(b)), kTol) << "row " << b;
    }
  }
}

TEST(Engine, GreedyEqualsFullRecomputeGenerate) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ModelConfig cfg = c.cfg;
    cfg.max_seq = 40;  // the prompt and 30 new tokens fit: the old generate() never slides its context here
    Gpt model(cfg);
    init(model, 5);
    const std::vector<int32_t> prompt{1, 4, 2, 7};
    const int n = 30;
    const std::vector<int32_t> ref = generate(model, prompt, n, {.temperature = 0.0f});
    Engine eng(model, {.batch = 1, .max_prompt = 4});
    eng.prefill({prompt});
    std::vector<int32_t> out = prompt;
    out.push_back(eng.greedy_tokens()[0]);
    for (int i = 1; i < n; ++i) {
      eng.decode(/*greedy=*/true);
      out.push_back(eng.read_tokens()[0]);
    }
    EXPECT_EQ(out, ref);
  }
}

// engine_generate gives generate()'s tokens: sampled (the same draws), and past max_seq, where the context slides.
TEST(Engine, GenerateEqualsTheFullRecomputeGenerate) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ModelConfig cfg = c.cfg;
    cfg.max_seq = 12;
    Gpt model(cfg);
    init(model, 8);
    Engine eng(model, {.batch = 1});
    const std::vector<int32_t> prompt{2, 3, 5};
    for (const SamplerParams& p :
         {SamplerParams{.temperature = 0.0f}, SamplerParams{.temperature = 0.9f, .top_k = 5, .seed = test::test_seed()},
          SamplerParams{.temperature = 1.3f, .top_p = 0.8f, .seed = 2}}) {
      std::vector<int32_t> streamed;
      const auto got = engine_generate(eng, prompt, 25, p, [&](int32_t t) { streamed.push_back(t); });
      EXPECT_EQ(got, generate(model, prompt, 25, p)) << "temperature " << p.temperature;
      EXPECT_EQ(streamed, std::vector<int32_t>(got.begin() + 3, got.end()));
    }
    // A prompt longer than the cache keeps its last max_seq tokens, as generate() does.
    const std::vector<int32_t> long_prompt(20, 4);
    EXPECT_EQ(engine_generate(eng, long_prompt, 3, {.temperature = 0.0f}),
              generate(model, long_prompt, 3, {.temperature = 0.0f}));
  }
}

// Two rows aliased to one prompt through the slot table decode as two separate engines do.
TEST(Engine, SlotTableAliasEqualsSeparateDecodes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Gpt model(c.cfg);
    init(model, 3);
    std::mt19937_64 rng(test::test_seed());
    const std::vector<int32_t> prompt = test::randint(6, c.cfg.vocab, rng);
    std::vector<std::vector<int32_t>> inputs;
    for (int s = 0; s < 4; ++s) inputs.push_back(test::randint(2, c.cfg.vocab, rng));
    Engine shared(model, {.batch = 1, .beams = 2, .max_prompt = 6});
    ASSERT_EQ(shared.rows(), 2);
    shared.prefill({prompt});
    shared.reorder({0, 0});  // row 1 becomes a child of row 0: the prompt's K and V are not copied
    std::vector<std::vector<float>> got;
    for (const auto& in : inputs) {
      shared.set_tokens(in);
      shared.decode(false);
    }
    for (int r = 0; r < 2; ++r) {
      Engine one(model, {.batch = 1, .max_prompt = 6});
      one.prefill({prompt});
      for (const auto& in : inputs) {
        one.set_tokens({in[r]});
        one.decode(false);
      }
      EXPECT_LT(rel(one.read_logits_row(0), shared.read_logits_row(r)), kTol) << "row " << r;
      std::vector<int32_t> seq = prompt;
      for (const auto& in : inputs) seq.push_back(in[r]);
      EXPECT_LT(rel(shared.read_logits_row(r), full_last(model, seq)), kTol) << "row " << r;
    }
  }
}

// A beam-style step in the middle: after two steps the rows swap parents, and each row then continues the
// history of the row it was made a child of.
TEST(Engine, ReorderMidwayFollowsTheParents) {
  const ModelConfig cfg = llama_gqa(2);
  Gpt model(cfg);
  init(model, 4);
  const std::vector<int32_t> prompt{3, 1, 4};
  Engine eng(model, {.batch = 1, .beams = 3, .max_prompt = 3});
  eng.prefill({prompt});
  eng.reorder({0, 0, 0});
  std::vector<std::vector<int32_t>> seq(3, prompt);
  const std::vector<std::vector<int32_t>> steps = {{5, 6, 7}, {8, 9, 10}, {11, 12, 13}};
  for (size_t i = 0; i < steps.size(); ++i) {
    eng.set_tokens(steps[i]);
    eng.decode(false);
    for (int r = 0; r < 3; ++r) seq[r].push_back(steps[i][r]);
    if (i == 1) {
      const std::vector<int32_t> parents{2, 0, 0};
      eng.reorder(parents);
      const auto old = seq;
      for (int r = 0; r < 3; ++r) seq[r] = old[parents[r]];
    }
  }
  for (int r = 0; r < 3; ++r) EXPECT_LT(rel(eng.read_logits_row(r), full_last(model, seq[r])), kTol) << "row " << r;
}

TEST(Engine, RefusesWhatItCannotRun) {
  ModelConfig sin = gpt2_odd();
  sin.positions = PositionKind::Sinusoidal;
  Gpt model(sin);
  const std::string m = test::error_of([&] { Engine eng(model, {}); });
  EXPECT_NE(m.find("sinusoidal"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;

  Gpt ok(gpt2_odd());
  init(ok, 1);
  Engine eng(ok, {.batch = 1, .max_prompt = 4, .max_seq = 6});
  EXPECT_NE(test::error_of([&] { eng.prefill({{1, 2, 3, 4, 5}}); }).find("up to 4"), std::string::npos);
  EXPECT_NE(test::error_of([&] { eng.prefill({{1, 99}}); }).find("99"), std::string::npos);
  eng.prefill({{1, 2, 3, 4}});
  eng.set_tokens({1});
  eng.decode(false);
  eng.decode(true);  // positions 4 and 5: the cache of 6 is full
  EXPECT_NE(test::error_of([&] { eng.decode(true); }).find("filled the cache"), std::string::npos);
  EXPECT_NE(test::error_of([&] { eng.reorder({0}); }).find("slot table"), std::string::npos);
  EXPECT_NE(test::error_of([&] { Engine e(ok, {.max_seq = 25}); }).find("at most 24"), std::string::npos);
}

TEST(Engine, ReportsItsBytesExactly) {
  const ModelConfig cfg = llama_gqa(2);
  Gpt model(cfg);
  const EngineOptions opt{.batch = 2, .beams = 3, .max_prompt = 5};
  Engine eng(model, opt);
  const EngineMemory m = eng.memory();
  EXPECT_EQ(m.cache, eng.cache().bytes());
  EXPECT_EQ(m.weights, model.params().size() * sizeof(float));
  // K and V of 2 layers over 6 slots, 2 KV heads, 24 positions, head dim 8, f32; pos, the slot table and its
  // reorder target, each 256-byte aligned.
  const size_t kv = 2 * 2 * size_t{6} * 2 * 24 * 8 * 4;
  EXPECT_EQ(m.cache, kv + 256 + 768 + 256 + 768);
  const EngineMemory again = Engine::memory(cfg, DType::F32, opt);
  EXPECT_EQ(again.cache, m.cache);
  EXPECT_EQ(again.buffers, m.buffers);
  EXPECT_GT(m.buffers, size_t{10} * 32 * 4);  // (10 rows of the prefill) x d_model at least
}

}  // namespace
}  // namespace tessera
