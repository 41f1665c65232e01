// The seq2seq engine on the GPU against the CPU engine on the same weights (init_weights draws each tensor from its
// own Philox stream, so a model of the same seed holds the same weights on either device): every decode step's
// logits over a padded batch with beams aliasing one entry's cross K/V, f32 tight and bf16 / f16 within their
// tolerance (scaled for the depth), for post-norm with learned positions and pre-norm with sinusoidal positions and
// grouped KV heads; and beam search's best hypothesis equal to the CPU's in f32.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda_test_util.h"
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

// Each step's logits of every row, with the input tokens given (row r, step t: a fixed id of both).
std::vector<double> run_steps(EncoderDecoder& m, int beams, const std::vector<std::vector<int32_t>>& src) {
  Seq2SeqEngine e(m, {.batch = 3, .beams = beams, .max_src = 16, .max_tgt = 8});
  e.encode(src);
  std::vector<double> out;
  for (int t = 0; t < 6; ++t) {
    e.decode();
    for (int r = 0; r < e.rows(); ++r)
      for (float x : e.read_logits_row(r)) out.push_back(x);
    std::vector<int32_t> next;
    for (int r = 0; r < e.rows(); ++r) next.push_back(3 + (7 * r + 5 * t) % (m.config().vocab - 3));
    e.set_tokens(next);
  }
  return out;
}

TEST(Seq2SeqEngineCuda, StepsMatchTheCpuEngine) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  for (bool pre : {false, true}) {
    const EncDecConfig cfg = config(pre);
    const auto src = sources(cfg);
    Context cpu(Device::cpu());
    EncoderDecoder ref_model(cfg, cpu);
    ref_model.init_weights(test::test_seed() + 1);
    for (int beams : {1, 3}) {
      const std::vector<double> ref = run_steps(ref_model, beams, src);
      for (DType dt : test::kCudaFloatTypes) {
        EncoderDecoder m(cfg, ctx, dt);
        m.init_weights(test::test_seed() + 1);
        test::expect_close(run_steps(m, beams, src), ref, dt,
                           std::string(pre ? "pre-norm" : "post-norm") + " beams " + std::to_string(beams), 4.0);
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
