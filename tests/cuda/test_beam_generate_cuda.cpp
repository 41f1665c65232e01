// Beam search through the engine on the GPU (infer/beam_generate.h): in f32 the same hypotheses as the CPU engine,
// scores to 1e-4, for two prompts of unequal lengths with an EOS that ends hypotheses early; the whole step captured
// as one CUDA graph (reorder, token feed, decode, beam step: Engine::decode_with) gives what the eager engine gives,
// bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/beam_generate.h"
#include "tessera/models/gpt.h"

namespace tessera {
namespace {

ModelConfig gpt2_cfg() {
  return test::small_config(/*vocab=*/97, /*d_model=*/64, /*n_layers=*/2, /*n_heads=*/4, /*d_ff=*/128,
                            /*max_seq=*/48);
}
ModelConfig llama_cfg() {
  ModelConfig c = llama_style(test::small_config(/*vocab=*/101, /*d_model=*/64, /*n_layers=*/2, /*n_heads=*/4,
                                                 /*d_ff=*/96, /*max_seq=*/48));
  c.n_kv_heads = 2;
  return c;
}

// Weights with spread (the 0.02 initialisation plus N(0, 0.3) on every non-zero one), as f32 host values.
std::vector<float> spread_weights(Model& cpu, uint64_t seed) {
  cpu.init_weights(seed);
  std::vector<float> w = cpu.params().read_f32(cpu.context());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (float& x : w) x += x == 0.0f ? 0.0f : d(rng);
  cpu.params().write_f32(w, cpu.context());
  return w;
}

TEST(BeamGenerateCuda, F32EqualsTheCpuEngine) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  for (const ModelConfig& cfg : {gpt2_cfg(), llama_cfg()}) {
    Gpt cpu(cfg);
    const std::vector<float> w = spread_weights(cpu, 17);
    auto gpu = make_model(cfg, ctx, DType::F32, MasterWeights::Off);
    gpu->params().write_f32(w, ctx);
    const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3}, {40, 2, 9, 33, 8, 21}};
    const EngineOptions eo{.batch = 2, .beams = 4, .max_prompt = 6};
    BeamSearchOptions o{.beams = 4, .max_new_tokens = 12, .length_penalty = 1.0f, .num_return_sequences = 4};
    // The EOS: the third token of the CPU's best hypothesis without one, so that beams reach it early.
    {
      Engine probe(cpu, eo);
      o.eos_id = beam_generate(probe, prompts, o)[0][0].tokens.at(2);
    }
    Engine ref(cpu, eo), graphed(*gpu, eo);
    Engine eager(*gpu, {.batch = 2, .beams = 4, .max_prompt = 6, .cuda_graph = false});
    const auto want = beam_generate(ref, prompts, o);
    const auto got = beam_generate(graphed, prompts, o);
    const auto plain = beam_generate(eager, prompts, o);
    int eos_ended = 0;
    for (int b = 0; b < 2; ++b) {
      ASSERT_EQ(got[b].size(), want[b].size()) << "prompt " << b;
      ASSERT_EQ(plain[b].size(), want[b].size()) << "prompt " << b;
      for (size_t i = 0; i < want[b].size(); ++i) {
        EXPECT_EQ(got[b][i].tokens, want[b][i].tokens) << "prompt " << b << " hypothesis " << i;
        EXPECT_NEAR(got[b][i].score, want[b][i].score, 1e-4) << "prompt " << b << " hypothesis " << i;
        EXPECT_EQ(plain[b][i].tokens, got[b][i].tokens) << "eager, prompt " << b << " hypothesis " << i;
        EXPECT_EQ(plain[b][i].score, got[b][i].score) << "eager, prompt " << b << " hypothesis " << i;
        eos_ended += want[b][i].tokens.back() == o.eos_id;
      }
    }
    EXPECT_GT(eos_ended, 0) << "no hypothesis reached the EOS";
    if (cuda_graph_capture_supported()) {
      EXPECT_FALSE(graphed.graph_failed());
      EXPECT_EQ(graphed.graph_captures(), 1);  // the beam step's graph, captured at step 2 (step 1 runs eagerly)
      EXPECT_GT(graphed.graph_replays(), 0);
    }
    // A second search on the same engine: its prefill drops the graph bound to the first search's state, so the
    // second captures its own and gives the same result.
    const auto again = beam_generate(graphed, prompts, o);
    for (int b = 0; b < 2; ++b) {
      ASSERT_EQ(again[b].size(), got[b].size());
      for (size_t i = 0; i < got[b].size(); ++i) {
        EXPECT_EQ(again[b][i].tokens, got[b][i].tokens) << "again, prompt " << b << " hypothesis " << i;
        EXPECT_EQ(again[b][i].score, got[b][i].score) << "again, prompt " << b << " hypothesis " << i;
      }
    }
    if (cuda_graph_capture_supported()) {
      EXPECT_EQ(graphed.graph_captures(), 2);
    }
    EXPECT_EQ(eager.graph_replays(), 0);
  }
}

// PDL (EngineOptions::pdl) covers the engine's decode inside the beam step's graph, between the caller's reorder and
// token feed and its beam step, which launch the ordinary way: in bf16, on and off give the same hypotheses and the
// same scores, bit for bit, with 1 prompt of 4 beams (4 rows: the few-row products) and 2 prompts (8 rows: cuBLASLt
// products between the PDL kernels).
TEST(BeamGenerateCuda, PdlEqualsPlainBitForBit) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  for (const ModelConfig& cfg : {gpt2_cfg(), llama_cfg()}) {
    Gpt cpu(cfg);
    const std::vector<float> w = spread_weights(cpu, 23);
    auto gpu = make_model(cfg, ctx, DType::BF16, MasterWeights::Off);
    gpu->params().write_f32(w, ctx);
    const std::vector<std::vector<int32_t>> all = {{5, 17, 3}, {40, 2, 9, 33, 8, 21}};
    for (int batch : {1, 2}) {
      const std::vector<std::vector<int32_t>> prompts(all.begin(), all.begin() + batch);
      const BeamSearchOptions o{.beams = 4, .max_new_tokens = 12, .length_penalty = 1.0f, .num_return_sequences = 4};
      Engine on(*gpu, {.batch = batch, .beams = 4, .max_prompt = 6, .pdl = true});
      Engine off(*gpu, {.batch = batch, .beams = 4, .max_prompt = 6, .pdl = false});
      const auto got = beam_generate(on, prompts, o);
      const auto want = beam_generate(off, prompts, o);
      const std::string what = std::string(cfg.positions == PositionKind::Rope ? "llama" : "gpt2") + " batch " +
                               std::to_string(batch);
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t b = 0; b < want.size(); ++b) {
        ASSERT_EQ(got[b].size(), want[b].size()) << what << " prompt " << b;
        for (size_t i = 0; i < want[b].size(); ++i) {
          EXPECT_EQ(got[b][i].tokens, want[b][i].tokens) << what << " prompt " << b << " hypothesis " << i;
          EXPECT_EQ(got[b][i].score, want[b][i].score) << what << " prompt " << b << " hypothesis " << i;
        }
      }
      if (cuda_graph_capture_supported()) {
        for (const Engine* e : {&on, &off}) {
          EXPECT_FALSE(e->graph_failed()) << what;
          EXPECT_GT(e->graph_replays(), 0) << what;
        }
      }
    }
  }
  EXPECT_FALSE(ctx.pdl()) << "the engine leaves the Context's PDL flag as it found it";
}

}  // namespace
}  // namespace tessera
