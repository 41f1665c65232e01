// The batched generation loop on the GPU: greedy f32 gives the CPU loop's tokens for a batch of unequal prompts
// (one of which fills its context while the others run, and one of which ends at an EOS), and seeded sampling
// reproduces on the device, the decode step replayed from its CUDA graph.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/engine.h"
#include "tessera/infer/generator.h"
#include "tessera/models/gpt.h"

namespace tessera {
namespace {

std::string decode_chars(const std::vector<int32_t>& t) {
  std::string s;
  for (int32_t id : t) s.push_back(static_cast<char>('!' + id % 90));
  return s;
}

std::vector<GeneratedSequence> run(Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                   const GenerateOptions& o) {
  Engine e(m, generator_engine_options(prompts, static_cast<int>(prompts.size()), o, m.config().max_seq));
  auto out = generate_batch(e, prompts, o, TextDecoder(decode_chars));
  if (cuda_graph_capture_supported() && m.context().is_cuda()) {
    EXPECT_GT(e.graph_replays(), 0);
  }
  return out;
}

TEST(GeneratorCuda, GreedyF32EqualsTheCpuLoop) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  ModelConfig cfg = llama_style(test::small_config(/*vocab=*/101, /*d_model=*/64, /*n_layers=*/2, /*n_heads=*/4,
                                                   /*d_ff=*/96, /*max_seq=*/40));
  cfg.n_kv_heads = 2;
  for (const ModelConfig& c : {cfg, test::small_config(97, 64, 2, 4, 128, 40)}) {
    Gpt cpu(c);
    cpu.init_weights(31);
    std::vector<float> w = cpu.params().read_f32(cpu.context());
    std::mt19937_64 rng(31);
    std::normal_distribution<float> d(0.0f, 0.3f);
    for (float& x : w) x += x == 0.0f ? 0.0f : d(rng);
    cpu.params().write_f32(w, cpu.context());
    auto gpu = make_model(c, ctx, DType::F32, MasterWeights::Off);
    gpu->params().write_f32(w, ctx);
    const std::vector<std::vector<int32_t>> prompts = {test::randint(30, c.vocab, rng), test::randint(3, c.vocab, rng),
                                                       test::randint(12, c.vocab, rng)};
    GenerateOptions o;
    o.sampling.temperature = 0;
    o.max_new_tokens = 20;
    const auto a = run(cpu, prompts, o), b = run(*gpu, prompts, o);
    for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(a[r].tokens, b[r].tokens) << "row " << r;
    EXPECT_EQ(a[0].tokens.size(), 11u);  // 40 - 30 + 1: the context fills
    // Row 1's fifth token as the EOS, and logprobs: the same on both.
    o.eos_ids = {a[1].tokens[4]};
    o.sampling.logprobs = 4;
    const auto ea = run(cpu, prompts, o), eb = run(*gpu, prompts, o);
    for (size_t r = 0; r < prompts.size(); ++r) {
      EXPECT_EQ(ea[r].tokens, eb[r].tokens) << "row " << r;
      EXPECT_EQ(ea[r].finish, eb[r].finish) << "row " << r;
      ASSERT_EQ(ea[r].logprobs.size(), eb[r].logprobs.size());
      for (size_t s = 0; s < ea[r].logprobs.size(); ++s)
        for (int j = 0; j < 4; ++j) {
          EXPECT_EQ(ea[r].logprobs[s].top[j].first, eb[r].logprobs[s].top[j].first);
          EXPECT_NEAR(ea[r].logprobs[s].top[j].second, eb[r].logprobs[s].top[j].second, 1e-4);
        }
    }
    EXPECT_EQ(eb[1].finish, FinishReason::Eos);
    // Seeded sampling with penalties on the device: reproducible.
    GenerateOptions s;
    s.sampling = {.temperature = 1.0f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.3f, .seed = 9};
    s.max_new_tokens = 20;
    const auto s1 = run(*gpu, prompts, s), s2 = run(*gpu, prompts, s);
    for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(s1[r].tokens, s2[r].tokens) << "row " << r;
  }
}

}  // namespace
}  // namespace tessera
