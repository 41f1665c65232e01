// Beam search on the GPU against the same search on the CPU (which tests/infer/test_beam_search.cpp holds to a
// brute force): a toy model's logits, a fixed random function of (entry, step, last token), fed step by step; the
// GPU's finished hypotheses and scores equal the CPU's. Once eagerly, once with the steps replayed from a CUDA
// graph captured once (the step index lives on the device).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "../test_util.h"
#include "cuda_test_util.h"
#include "tessera/core/buffer.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/infer/beam_search.h"

namespace tessera {
namespace {

constexpr int kV = 37, kEos = 5;

struct Toy {
  int B, N;
  std::vector<float> a;
  Toy(int B_, int N_, std::mt19937_64& rng) : B(B_), N(N_), a(static_cast<size_t>(B_) * N_ * kV * kV) {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (auto& x : a) x = nd(rng);
    for (int i = 0; i < B * N * kV; i += 3) a[static_cast<size_t>(i) * kV + kEos] += 3.0f;  // EOS often near the top
  }
  // (B*K, kV) logits for the rows' last tokens.
  std::vector<float> logits(int t, int K, const std::vector<int32_t>& last) const {
    std::vector<float> z(last.size() * kV);
    for (size_t r = 0; r < last.size(); ++r)
      for (int v = 0; v < kV; ++v) z[r * kV + v] = a[((static_cast<size_t>(r / K) * N + t) * kV + last[r]) * kV + v];
    return z;
  }
};

std::vector<std::vector<BeamSequence>> run(const Toy& m, const BeamSearchOptions& o, Context& ctx, bool graph) {
  BeamSearch bs(o, ctx);
  const int S = o.batch * o.beams;
  std::vector<int32_t> last(S, 1);
  Buffer dev(static_cast<size_t>(S) * kV * 4, ctx.device());
  const Tensor logits = dev.view(DType::F32, {S, kV});
  CudaGraph g;
  for (int t = 0; t < o.max_new_tokens; ++t) {
    const auto z = m.logits(t, o.beams, last);
    copy_bytes(logits.data(), ctx.device(), z.data(), Device::cpu(), z.size() * 4, ctx);
    if (!ctx.is_cuda() || !graph || t == 0) {
      bs.step(logits, 0, ctx);  // on CUDA, step 0 also sizes the scratch outside the capture
    } else {
      if (!g.ready()) g.capture(ctx, "beam step", [&] { bs.step(logits, 0, ctx); });
      g.launch(ctx);
    }
    copy_bytes(last.data(), Device::cpu(), bs.next_tokens().data(), ctx.device(), S * 4, ctx);
  }
  return bs.finish(ctx);
}

TEST(BeamSearchCuda, EqualsTheCpu) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test::test_seed());
  Context cpu(Device::cpu());
  for (int K : {1, 2, 4, 8})
    for (bool graph : {false, true}) {
      if (graph && !cuda_graph_capture_supported()) continue;
      const BeamSearchOptions o{.batch = 5,
                                .beams = K,
                                .vocab = kV,
                                .max_new_tokens = 9,
                                .eos_id = kEos,
                                .length_penalty = 1.0f,
                                .early_stopping = beam::EarlyStopping::False,
                                .num_return_sequences = K};
      const Toy m(o.batch, o.max_new_tokens, rng);
      const auto want = run(m, o, cpu, false), got = run(m, o, ctx, graph);
      for (int b = 0; b < o.batch; ++b) {
        ASSERT_EQ(got[b].size(), want[b].size()) << "K " << K << " entry " << b;
        for (size_t i = 0; i < want[b].size(); ++i) {
          EXPECT_EQ(got[b][i].tokens, want[b][i].tokens) << "K " << K << " graph " << graph << " entry " << b;
          EXPECT_NEAR(got[b][i].score, want[b][i].score, 1e-4) << "K " << K << " entry " << b;
        }
      }
    }
}

}  // namespace
}  // namespace tessera
