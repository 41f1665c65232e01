// The seq2seq engine on the GPU against the CPU engine on the same weights (init_weights draws each tensor from its
// own Philox stream, so a model of the same seed holds the same weights on either device): every decode step's
// logits over a padded batch with beams aliasing one entry's cross K/V, f32 tight and bf16 / f16 within their
// tolerance (scaled for the depth), for post-norm with learned positions and pre-norm with sinusoidal positions and
// grouped KV heads; beam search's best hypothesis equal to the CPU's in f32; and the decode step replayed as a CUDA
// graph equal bit for bit to the eager step, alone and with the beam step inside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/seq2seq_engine.h"

namespace tessera {
namespace {

EncDecConfig config(bool pre) {
  EncDecConfig c = encdec_preset(pre ? "transformer-base" : "tiny");
  c.vocab = 37;
  c.src_vocab = 0;
  c.shared_embeddings = true;
  c.tied_output = true;
  c.enc_layers = 2;
  c.dec_layers = 2;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = pre ? 2 : 0;
  c.d_ff = 96;
  c.max_seq = 24;
  c.placement = pre ? NormPlacement::Pre : NormPlacement::Post;
  return c;
}

std::vector<std::vector<int32_t>> sources(const EncDecConfig& c) {
  std::mt19937_64 rng(test::test_seed());
  std::uniform_int_distribution<int> id(3, c.vocab - 1);
  std::vector<std::vector<int32_t>> s;
  for (int L : {9, 3, 14}) {
    s.emplace_back();
    for (int i = 0; i < L; ++i) s.back().push_back(id(rng));
  }
  return s;
}

// Each step's logits of every row, with the input tokens given (row r, step t: a fixed id of both); one engine of
// batch src.size(). graph_replays: where given, the engine's count of replayed steps.
std::vector<double> run_steps(EncoderDecoder& m, int beams, const std::vector<std::vector<int32_t>>& src, int steps = 6,
                              bool cuda_graph = true, int64_t* graph_replays = nullptr) {
  Seq2SeqEngine e(m, {.batch = static_cast<int>(src.size()),
                      .beams = beams,
                      .max_src = 16,
                      .max_tgt = std::max(8, steps),
                      .cuda_graph = cuda_graph});
  e.encode(src);
  std::vector<double> out;
  for (int t = 0; t < steps; ++t) {
    e.decode();
    for (int r = 0; r < e.rows(); ++r)
      for (float x : e.read_logits_row(r)) out.push_back(x);
    std::vector<int32_t> next;
    for (int r = 0; r < e.rows(); ++r) next.push_back(3 + (7 * r + 5 * t) % (m.config().vocab - 3));
    e.set_tokens(next);
  }
  if (graph_replays) *graph_replays = e.graph_replays();
  return out;
}

// (sources, beams) of the step tests: a padded batch of three with one beam (gemv's rows on the GPU) and with
// three (the GEMM's), and one source with four beams (gemv's, every row an alias of one entry's cross K/V).
struct StepCase {
  int sources, beams;
};
constexpr StepCase kStepCases[] = {{3, 1}, {3, 3}, {1, 4}};

std::vector<std::vector<int32_t>> first_sources(const std::vector<std::vector<int32_t>>& src, int n) {
  return {src.begin(), src.begin() + n};
}

TEST(Seq2SeqEngineCuda, StepsMatchTheCpuEngine) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  for (bool pre : {false, true}) {
    const EncDecConfig cfg = config(pre);
    const auto all = sources(cfg);
    Context cpu(Device::cpu());
    EncoderDecoder ref_model(cfg, cpu);
    ref_model.init_weights(test::test_seed() + 1);
    for (const StepCase& c : kStepCases) {
      const auto src = first_sources(all, c.sources);
      const std::vector<double> ref = run_steps(ref_model, c.beams, src);
      for (DType dt : test::kCudaFloatTypes) {
        EncoderDecoder m(cfg, ctx, dt);
        m.init_weights(test::test_seed() + 1);
        test::expect_close(run_steps(m, c.beams, src), ref, dt,
                           std::string(pre ? "pre-norm" : "post-norm") + " sources " + std::to_string(c.sources) +
                               " beams " + std::to_string(c.beams),
                           4.0);
      }
    }
  }
}

// The graph replays exactly what the eager step runs: the same kernels on the same buffers, so every logit of
// every step is equal bit for bit (f32, bf16, f16; post- and pre-norm; one source and three, four beams each).
TEST(Seq2SeqEngineCuda, GraphStepsEqualEagerBitwise) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  constexpr int kSteps = 9;
  for (bool pre : {false, true}) {
    const EncDecConfig cfg = config(pre);
    const auto all = sources(cfg);
    for (DType dt : test::kCudaFloatTypes) {
      EncoderDecoder m(cfg, ctx, dt);
      m.init_weights(test::test_seed() + 3);
      for (int n : {1, 3}) {
        const auto src = first_sources(all, n);
        const std::string what = std::string(pre ? "pre-norm " : "post-norm ") + test::dtype_label(dt) + " sources " +
                                 std::to_string(n);
        int64_t replays_eager = -1, replays_graph = -1;
        const auto eager = run_steps(m, 4, src, kSteps, /*cuda_graph=*/false, &replays_eager);
        const auto graph = run_steps(m, 4, src, kSteps, /*cuda_graph=*/true, &replays_graph);
        EXPECT_EQ(replays_eager, 0) << what;
        // Step 0 eager, step 1 captured and replayed, every later one replayed (a Debug build stays eager).
        if (cuda_graph_capture_supported()) {
          EXPECT_EQ(replays_graph, kSteps - 1) << what;
        }
        ASSERT_EQ(graph.size(), eager.size()) << what;
        size_t differ = 0;
        for (size_t i = 0; i < eager.size(); ++i) differ += graph[i] != eager[i] || std::isnan(graph[i]);
        EXPECT_EQ(differ, 0u) << what << ": logits that differ between the graph and the eager step";
      }
    }
  }
}

// Beam search with the beam step inside the graph (decode_with) returns the eager search's hypotheses and scores
// exactly; twice on one engine (the second encode drops the graph and captures it again), with no EOS (every step
// runs) and with the model's EOS.
TEST(Seq2SeqEngineCuda, GraphBeamSearchEqualsEagerBitwise) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const EncDecConfig cfg = config(false);
  const auto all = sources(cfg);
  constexpr int kNew = 10;
  for (DType dt : {DType::F32, DType::BF16}) {
    EncoderDecoder m(cfg, ctx, dt);
    m.init_weights(test::test_seed() + 4);
    for (int n : {1, 3}) {
      const auto src = first_sources(all, n);
      Seq2SeqEngine eager(m, {.batch = n, .beams = 4, .max_src = 16, .max_tgt = kNew, .cuda_graph = false});
      Seq2SeqEngine graph(m, {.batch = n, .beams = 4, .max_src = 16, .max_tgt = kNew, .cuda_graph = true});
      for (int eos : {-1, cfg.eos_id}) {
        const BeamSearchOptions o{.beams = 4, .max_new_tokens = kNew, .eos_id = eos, .pad_id = cfg.pad_id};
        for (int run = 0; run < 2; ++run) {
          const std::string what = std::string(test::dtype_label(dt)) + " sources " + std::to_string(n) + " eos " +
                                   std::to_string(eos) + " run " + std::to_string(run);
          const int64_t replays_before = graph.graph_replays();
          const auto want = seq2seq_beam(eager, src, o), got = seq2seq_beam(graph, src, o);
          EXPECT_EQ(eager.graph_replays(), 0) << what;
          // With no EOS every step runs: steps 1 .. kNew-1 through decode_with, step 1 eager, the rest replayed
          // (and step 0 too, from the second encode of the same shape on).
          if (eos < 0 && cuda_graph_capture_supported()) {
            EXPECT_GE(graph.graph_replays() - replays_before, kNew - 2) << what;
          }
          ASSERT_EQ(got.size(), want.size()) << what;
          for (size_t b = 0; b < want.size(); ++b) {
            ASSERT_EQ(got[b].size(), want[b].size()) << what;
            for (size_t j = 0; j < want[b].size(); ++j) {
              EXPECT_EQ(got[b][j].tokens, want[b][j].tokens) << what << " source " << b << " hypothesis " << j;
              EXPECT_EQ(got[b][j].score, want[b][j].score) << what << " source " << b << " hypothesis " << j;
            }
          }
        }
      }
    }
  }
}

TEST(Seq2SeqEngineCuda, BeamSearchMatchesTheCpuInF32) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const EncDecConfig cfg = config(false);
  const auto src = sources(cfg);
  Context cpu(Device::cpu());
  EncoderDecoder ref_model(cfg, cpu), m(cfg, ctx, DType::F32);
  ref_model.init_weights(test::test_seed() + 2);
  m.init_weights(test::test_seed() + 2);
  const BeamSearchOptions o{.beams = 4, .max_new_tokens = 8, .eos_id = cfg.eos_id, .pad_id = cfg.pad_id};
  Seq2SeqEngine ec(ref_model, {.batch = 3, .beams = 4, .max_src = 16, .max_tgt = 8});
  Seq2SeqEngine eg(m, {.batch = 3, .beams = 4, .max_src = 16, .max_tgt = 8});
  const auto want = seq2seq_beam(ec, src, o), got = seq2seq_beam(eg, src, o);
  for (size_t b = 0; b < src.size(); ++b) {
    EXPECT_EQ(got[b].front().tokens, want[b].front().tokens) << "source " << b;
    EXPECT_NEAR(got[b].front().score, want[b].front().score, 1e-4) << "source " << b;
  }
}

}  // namespace
}  // namespace tessera
