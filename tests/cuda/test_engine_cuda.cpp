// The inference engine on the GPU: its small ops against their CPU references, and the engine's decode against a
// CPU full forward on the same weights (f32 tight; bf16 within its tolerance, greedy tokens equal while the top-2
// gap is wide), the CUDA graph's replay equal to the eager step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/decode_ops.h"
#include "tessera/infer/engine.h"
#include "tessera/models/gpt.h"

namespace tessera {
namespace {

std::vector<double> to_f64(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(DecodeOpsCuda, EmbeddingMatchesTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test::test_seed());
  for (DType dt : test::kCudaFloatTypes) {
    for (int C : {1, 7, 48, 768}) {
      const int B = 6, V = 13, max_seq = 10;
      test::DeviceArena dev(ctx);
      const auto wte = test::rounded(dt, test::randn<double>(size_t{V} * C, rng));
      const auto wpe = test::rounded(dt, test::randn<double>(size_t{max_seq} * C, rng));
      const std::vector<int32_t> tokens{3, 0, 12, 5, 3, 7}, pos{0, 9, 2, 5, 1, 9};
      const DecodeEmbeddingParams p{.B = B, .C = C, .V = V, .max_seq = max_seq, .scale = 0.75f, .padding_id = 5};
      for (bool with_pos : {true, false}) {
        std::vector<double> ref(size_t{B} * C);
        decode_embedding_ref<double>(p, ref.data(), tokens.data(), pos.data(), wte.data(),
                                     with_pos ? wpe.data() : nullptr);
        const Tensor out = dev.poisoned(dt, int64_t{B} * C);
        decode_embedding(p, out, dev.upload_i32(tokens), dev.upload_i32(pos), dev.upload(dt, wte),
                         with_pos ? dev.upload(dt, wpe) : Tensor(), ctx);
        test::expect_close(dev.download(out), ref, dt, "decode_embedding C " + std::to_string(C));
      }
    }
  }
}

TEST(DecodeOpsCuda, GreedyArgmaxMatchesTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test::test_seed());
  for (DType dt : test::kCudaFloatTypes) {
    for (int V : {1, 5, 1023, 1025, 50257}) {
      const int B = 4;
      const int64_t ld = (V + 63) / 64 * 64 + 3;
      // Values on a coarse grid so that ties are common; row 2 all equal; row 3 holds NaN and -inf.
      std::vector<double> logits(static_cast<size_t>((B - 1) * ld + V), 99.0);
      std::uniform_int_distribution<int> grid(-8, 8);
      for (int b = 0; b < B; ++b)
        for (int v = 0; v < V; ++v) logits[size_t(b * ld + v)] = b == 2 ? 1.0 : grid(rng) / 4.0;
      logits[size_t(3 * ld)] = std::nan("");
      if (V > 1) logits[size_t(3 * ld + 1)] = -INFINITY;
      test::DeviceArena dev(ctx);
      const Tensor in = dev.upload(dt, logits);
      const auto rounded = test::rounded(dt, logits);
      std::vector<int32_t> ref(B);
      greedy_argmax_ref<double>(B, V, ld, rounded.data(), ref.data());
      const Tensor out = dev.poisoned(DType::I32, B);
      greedy_argmax(B, V, ld, in, out, ctx);
      const auto got = dev.download(out);
      for (int b = 0; b < B; ++b) EXPECT_EQ(static_cast<int32_t>(got[b]), ref[b]) << "V " << V << " row " << b;
    }
  }
}

TEST(DecodeOpsCuda, SlotReorderAndAdvanceMatchTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test::test_seed());
  const int S = 7, M = 37;
  const auto parents = test::randint(S, S, rng), pos_in = test::randint(S, M + 1, rng);
  const auto slots_in = test::randint(size_t{S} * M, S, rng);
  std::vector<int32_t> pos_ref(S), slots_ref(size_t{S} * M);
  slot_reorder_ref(S, M, parents.data(), pos_in.data(), slots_in.data(), pos_ref.data(), slots_ref.data());
  test::DeviceArena dev(ctx);
  const Tensor pos_out = dev.poisoned(DType::I32, S), slots_out = dev.poisoned(DType::I32, int64_t{S} * M);
  slot_reorder(S, M, dev.upload_i32(parents), dev.upload_i32(pos_in), dev.upload_i32(slots_in), pos_out, slots_out,
               ctx);
  const auto p = dev.download(pos_out), s = dev.download(slots_out);
  for (int b = 0; b < S; ++b) EXPECT_EQ(static_cast<int32_t>(p[b]), pos_ref[b]) << b;
  for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(static_cast<int32_t>(s[i]), slots_ref[i]) << i;
  const Tensor pos = dev.upload_i32(pos_in);
  positions_advance(pos, ctx);
  const auto adv = dev.download(pos);
  for (int b = 0; b < S; ++b) EXPECT_EQ(static_cast<int32_t>(adv[b]), pos_in[b] + 1) << b;
}

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

std::vector<float> full_last(Model& m, const std::vector<int32_t>& seq) {
  const int T = static_cast<int>(seq.size());
  m.forward(seq.data(), nullptr, 1, T, {});
  return m.read_logits_row(T - 1);
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  std::vector<double> d(got.size());
  for (size_t i = 0; i < got.size(); ++i) d[i] = static_cast<double>(got[i]) - ref[i];
  return test::norm2(d) / std::max(test::norm2(to_f64(ref)), 1e-30);
}

// The GPU engine's decode, row by row, against the CPU f32 full forward over each growing sequence (batch padded: 3
// prompts of lengths 1, 5, 9). In f32 the error is tol. In bf16 / f16 every op rounds its output, and with these
// spread weights the logits' rounding error grows past any fixed guess: the decode's error may be tol or, where the
// same GPU model's own full forward (the training path, in the same dtype) is further off, 1.5x that forward's
// error at the same sequence. The engine is thus never much worse than the model it serves.
void check_exact(const ModelConfig& cfg, DType dt, double tol) {
  Context ctx(Device::cuda(0));
  Gpt cpu(cfg);
  const std::vector<float> w = spread_weights(cpu, 21);
  auto gpu = make_model(cfg, ctx, dt, MasterWeights::Off);
  gpu->params().write_f32(w, ctx);
  std::mt19937_64 rng(test::test_seed());
  std::vector<std::vector<int32_t>> seqs;
  for (int len : {1, 5, 9}) seqs.push_back(test::randint(static_cast<size_t>(len), cfg.vocab, rng));
  Engine eng(*gpu, {.batch = 3, .max_prompt = 9});
  const auto expect_row = [&](int b, const std::string& what) {
    const std::vector<float> got = eng.read_logits_row(b), ref = full_last(cpu, seqs[b]);
    const double fwd = dt == DType::F32 ? 0.0 : rel_err(full_last(*gpu, seqs[b]), ref);
    const double err = rel_err(got, ref);
    EXPECT_LE(err, std::max(tol, 1.5 * fwd))
        << what << " (" << test::dtype_label(dt) << "): relative error " << err << ", the GPU model's full forward's "
        << fwd << ", seed " << test::test_seed();
    for (float x : got) ASSERT_TRUE(std::isfinite(x)) << what;
  };
  eng.prefill(seqs);
  for (int b = 0; b < 3; ++b) expect_row(b, "prefill row " + std::to_string(b));
  for (int step = 0; step < 10; ++step) {
    const auto next = test::randint(3, cfg.vocab, rng);
    eng.set_tokens(next);
    eng.decode(false);
    for (int b = 0; b < 3; ++b) {
      seqs[b].push_back(next[b]);
      expect_row(b, "step " + std::to_string(step) + " row " + std::to_string(b));
    }
  }
}

TEST(EngineCuda, F32DecodeEqualsTheCpuFullForward) {
  TS_CUDA_CONTEXT_OR_SKIP(probe);
  check_exact(gpt2_cfg(), DType::F32, 1e-5 * 10);
  check_exact(llama_cfg(), DType::F32, 1e-5 * 10);
}

TEST(EngineCuda, Bf16DecodeIsWithinTheDtypeTolerance) {
  TS_CUDA_CONTEXT_OR_SKIP(probe);
  // Every op rounds its output to bf16 (8 bits) over 2 layers: a few roundings' worth, or the model's own forward.
  check_exact(gpt2_cfg(), DType::BF16, 5e-2);
  check_exact(llama_cfg(), DType::BF16, 5e-2);
  check_exact(llama_cfg(), DType::F16, 1e-2);
}

// Greedy tokens of the bf16 GPU engine equal the CPU f32 engine's while the CPU's top-2 logit gap is wide (at least
// 8 steps on this model), and the graph's replays give what the eager steps give, bit for bit.
TEST(EngineCuda, Bf16GreedyAndGraphReplay) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  for (const ModelConfig& cfg : {gpt2_cfg(), llama_cfg()}) {
    Gpt cpu(cfg);
    const std::vector<float> w = spread_weights(cpu, 33);
    auto gpu = make_model(cfg, ctx, DType::BF16, MasterWeights::Off);
    gpu->params().write_f32(w, ctx);
    const std::vector<int32_t> prompt{5, 17, 3, 44};
    Engine ref(cpu, {.batch = 1, .max_prompt = 4});
    Engine graphed(*gpu, {.batch = 1, .max_prompt = 4});
    Engine eager(*gpu, {.batch = 1, .max_prompt = 4, .cuda_graph = false});
    ref.prefill({prompt});
    graphed.prefill({prompt});
    eager.prefill({prompt});
    int32_t r = ref.greedy_tokens()[0], g = graphed.greedy_tokens()[0], e = eager.greedy_tokens()[0];
    // Until the first token that differs: a difference is allowed only where the CPU's top-2 gap is narrow.
    int agreed = 0;
    bool diverged = false;
    for (int step = 0; step < 16; ++step) {
      std::vector<float> sorted = ref.read_logits_row(0);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const bool wide = sorted[0] - sorted[1] > 0.1f * std::max(1.0f, std::abs(sorted[0]));
      if (!diverged && g != r) {
        EXPECT_FALSE(wide) << "bf16 took " << g << ", f32 " << r << " at step " << step << " with a top-2 gap of "
                           << sorted[0] - sorted[1];
        diverged = true;
      }
      if (!diverged) ++agreed;
      ASSERT_EQ(g, e) << "graph replay and eager differ at step " << step;
      ref.decode(true);
      graphed.decode(true);
      eager.decode(true);
      r = ref.read_tokens()[0];
      g = graphed.read_tokens()[0];
      e = eager.read_tokens()[0];
      const auto lg = graphed.read_logits_row(0), le = eager.read_logits_row(0);
      ASSERT_EQ(lg, le) << "graph replay logits differ from eager at step " << step;
    }
    EXPECT_GE(agreed, 8) << "bf16 greedy left f32 greedy early: pick weights with a wider top-2 gap";
    if (cuda_graph_capture_supported()) {
      EXPECT_FALSE(graphed.graph_failed());
      EXPECT_EQ(graphed.graph_captures(), 1);
      EXPECT_EQ(graphed.graph_replays(), 15);  // the first step eager, then one capture replayed
    }
    EXPECT_EQ(eager.graph_replays(), 0);
  }
}

// Bit for bit: logits as f32 (each bf16 value converts to exactly one f32), so -0 and 0 count as different.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// PDL (EngineOptions::pdl) changes only how the step's kernels launch. On one bf16 model, engines with PDL on
// (graph-replayed, and eager) give the logits of an engine with PDL off (graph-replayed) bit for bit, and the same
// greedy tokens, at the prefill and at every step: 10 greedy steps (one graph), then 4 steps of tokens set from the
// host (another graph); batch 1 and batch 3 (prompts of 2, 5 and 8 tokens, padded), the GPT and the Llama layout
// (a SwiGLU MLP: its activation kernel launches the ordinary way between PDL kernels).
TEST(EngineCuda, PdlDecodeEqualsPlainBitForBit) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test::test_seed());
  for (const ModelConfig& cfg : {gpt2_cfg(), llama_cfg()}) {
    Gpt cpu(cfg);
    const std::vector<float> w = spread_weights(cpu, 41);
    auto gpu = make_model(cfg, ctx, DType::BF16, MasterWeights::Off);
    gpu->params().write_f32(w, ctx);
    for (int batch : {1, 3}) {
      std::vector<std::vector<int32_t>> prompts;
      for (int b = 0; b < batch; ++b) prompts.push_back(test::randint(static_cast<size_t>(2 + 3 * b), cfg.vocab, rng));
      Engine off(*gpu, {.batch = batch, .max_prompt = 8, .pdl = false});
      Engine on(*gpu, {.batch = batch, .max_prompt = 8, .pdl = true});
      Engine on_eager(*gpu, {.batch = batch, .max_prompt = 8, .cuda_graph = false, .pdl = true});
      const std::string what = std::string(cfg.positions == PositionKind::Rope ? "llama" : "gpt2") + " batch " +
                               std::to_string(batch);
      const auto expect_same = [&](const std::string& when) {
        for (int b = 0; b < batch; ++b) {
          const auto want = off.read_logits_row(b);
          EXPECT_TRUE(same_bits(on.read_logits_row(b), want)) << what << ", " << when << ", row " << b;
          EXPECT_TRUE(same_bits(on_eager.read_logits_row(b), want)) << what << " (eager), " << when << ", row " << b;
        }
      };
      for (Engine* e : {&off, &on, &on_eager}) e->prefill(prompts);
      expect_same("prefill");
      std::vector<int32_t> want = off.greedy_tokens();
      EXPECT_EQ(on.greedy_tokens(), want) << what << ", prefill";
      EXPECT_EQ(on_eager.greedy_tokens(), want) << what << ", prefill";
      for (int step = 0; step < 14; ++step) {
        const std::string when = "step " + std::to_string(step);
        const bool greedy = step < 10;
        if (!greedy) {
          const auto next = test::randint(static_cast<size_t>(batch), cfg.vocab, rng);
          for (Engine* e : {&off, &on, &on_eager}) e->set_tokens(next);
        }
        for (Engine* e : {&off, &on, &on_eager}) e->decode(greedy);
        expect_same(when);
        if (greedy) {
          want = off.read_tokens();
          EXPECT_EQ(on.read_tokens(), want) << what << ", " << when;
          EXPECT_EQ(on_eager.read_tokens(), want) << what << ", " << when;
        }
      }
      if (cuda_graph_capture_supported()) {
        for (const Engine* e : {&off, &on}) {
          EXPECT_FALSE(e->graph_failed()) << what;
          EXPECT_EQ(e->graph_captures(), 2) << what;     // the greedy step's graph and the plain step's
          EXPECT_EQ(e->graph_replays(), 9 + 3) << what;  // each kind's first step runs eagerly
        }
      }
      EXPECT_EQ(on_eager.graph_replays(), 0) << what;
    }
  }
  EXPECT_FALSE(ctx.pdl()) << "the engine leaves the Context's PDL flag as it found it";
}

// The slot table on the GPU: two rows aliased to one prompt decode as two separate engines.
TEST(EngineCuda, SlotTableAliasEqualsSeparateDecodes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const ModelConfig cfg = llama_cfg();
  Gpt cpu(cfg);
  const std::vector<float> w = spread_weights(cpu, 5);
  auto gpu = make_model(cfg, ctx, DType::F32, MasterWeights::Off);
  gpu->params().write_f32(w, ctx);
  const std::vector<int32_t> prompt{9, 8, 7, 6, 5};
  const std::vector<std::vector<int32_t>> inputs{{1, 2}, {3, 4}, {5, 6}};
  Engine shared(*gpu, {.batch = 1, .beams = 2, .max_prompt = 5});
  shared.prefill({prompt});
  shared.reorder({0, 0});
  for (const auto& in : inputs) {
    shared.set_tokens(in);
    shared.decode(false);
  }
  for (int r = 0; r < 2; ++r) {
    Engine one(*gpu, {.batch = 1, .max_prompt = 5});
    one.prefill({prompt});
    for (const auto& in : inputs) {
      one.set_tokens({in[r]});
      one.decode(false);
    }
    test::expect_close(to_f64(shared.read_logits_row(r)), to_f64(one.read_logits_row(0)), DType::F32,
                       "row " + std::to_string(r));
  }
}

}  // namespace
}  // namespace tessera
