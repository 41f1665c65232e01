// EncoderDecoder on the CPU in fp64: the gradient of every parameter against central differences, in BART's form
// (post-norm, GELU, learned positions from row 2, layernorm_embedding, shared and tied embeddings) and in the
// pre-norm Transformer's (sinusoidal positions, scaled embeddings, ReLU, separate source and target tables, an
// untied output, grouped KV heads), with dropout, attention and activation dropout on under fixed streams,
// label smoothing, and padded sources and targets. Padding is inert; a smaller batch reuses the plan and computes what
// a fresh plan computes; the planned arena (buffers sharing memory by their lives) gives what a plan without reuse
// gives; a bad batch is one line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "tessera/models/encoder_decoder.h"
#include "tessera/nn/step.h"
#include "test_util.h"

namespace tessera {
namespace {

EncDecConfig bart_like() {
  EncDecConfig c = encdec_preset("tiny");
  c.vocab = 13;
  c.d_model = 8;
  c.n_heads = 4;
  c.d_ff = 12;
  c.max_seq = 7;
  c.act_dropout = 0.2f;
  return c;
}

EncDecConfig prenorm_transformer() {
  EncDecConfig c = encdec_preset("transformer-base");
  c.vocab = 11;
  c.src_vocab = 9;
  c.shared_embeddings = false;
  c.tied_output = false;
  c.enc_layers = 2;
  c.dec_layers = 3;
  c.d_model = 8;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 10;
  c.max_seq = 7;
  c.placement = NormPlacement::Pre;
  c.attn_dropout = 0.2f;
  c.act_dropout = 0.1f;
  return c;
}

// A batch of B = 3 pairs, sources of 6 tokens and targets of 5, with padding after each row's length.
struct Pairs {
  int B = 3, Ts = 6, Tt = 5;
  std::vector<int32_t> src, src_lens{6, 3, 4}, tgt_in, tgt_out, tgt_lens{5, 2, 4};
  Pairs(const EncDecConfig& c, std::mt19937_64& rng) {
    // Ids avoid pad_id inside the lengths, so that every position counts.
    auto ids = [&](int n, int V) {
      std::vector<int32_t> v = test::randint(size_t(n), V - 3, rng);
      for (int32_t& x : v) x += 3;
      return v;
    };
    src = ids(B * Ts, c.source_vocab());
    tgt_in = ids(B * Tt, c.vocab);
    tgt_out = ids(B * Tt, c.vocab);
    for (int b = 0; b < B; ++b) {
      for (int t = src_lens[b]; t < Ts; ++t) src[b * Ts + t] = c.pad_id;
      for (int t = tgt_lens[b]; t < Tt; ++t) tgt_in[b * Tt + t] = tgt_out[b * Tt + t] = c.pad_id;
    }
  }
  Seq2SeqBatch batch() const {
    return {.B = B,
            .Ts = Ts,
            .Tt = Tt,
            .src = src.data(),
            .src_lens = src_lens.data(),
            .tgt_in = tgt_in.data(),
            .tgt_out = tgt_out.data(),
            .tgt_lens = tgt_lens.data()};
  }
};

// The loss with dropout on, every call drawing the same streams (a fresh RNG state of a fixed seed).
double loss_of(EncoderDecoder& m, const Seq2SeqBatch& b, bool dropout, float smoothing = 0.1f) {
  RngState rs{1234, 0};
  return m.forward(b, {.training = dropout, .label_smoothing = smoothing, .rng = &rs});
}

void random_params(EncoderDecoder& m, std::mt19937_64& rng) {
  m.init_weights(rng());
  // Larger than the init, so that every path carries gradient well above the differences' noise.
  double* p = m.params().host_data<double>();
  for (const ParamSegment& s : m.params().segments()) {
    const bool gain = s.name.ends_with("ln1.w") || s.name.ends_with("ln2.w") || s.name.ends_with("ln3.w") ||
                      s.name.ends_with("lne.w") || s.name.ends_with("lnf.w");
    const std::vector<double> r = test::randn<double>(s.numel, rng, 0.5);
    for (size_t i = 0; i < s.numel; ++i) p[s.offset + i] = gain ? 1.0 + r[i] : r[i];
  }
}

void check_model_grads(const EncDecConfig& cfg) {
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  EncoderDecoder m(cfg, ctx, DType::F64);
  random_params(m, rng);
  const Pairs pairs(cfg, rng);
  const Seq2SeqBatch b = pairs.batch();
  loss_of(m, b, true);
  m.zero_grad();
  m.backward();
  ParamBuffer& pb = m.params();
  const size_t n = pb.size();
  std::vector<double> analytic(pb.host_grad<double>(), pb.host_grad<double>() + n);
  std::vector<double> x(pb.host_data<double>(), pb.host_data<double>() + n);
  const std::vector<double> numeric = test::fd_gradient(
      [&] {
        std::copy(x.begin(), x.end(), pb.host_data<double>());
        return loss_of(m, b, true);
      },
      x);
  std::copy(x.begin(), x.end(), pb.host_data<double>());
  EXPECT_LT(test::rel_error(analytic, numeric), test::kFdTolF64);
  for (const ParamSegment& s : pb.segments()) {
    const std::vector<double> a(analytic.begin() + s.offset, analytic.begin() + s.offset + s.numel);
    const std::vector<double> d(numeric.begin() + s.offset, numeric.begin() + s.offset + s.numel);
    EXPECT_LT(test::rel_error(a, d), test::kFdTolF64) << s.name;
    double norm = 0;
    for (double v : d) norm += v * v;
    EXPECT_GT(norm, 0.0) << s.name << " has a zero gradient, so the check would be vacuous";
  }
}

TEST(EncoderDecoderModel, BartFormGradientsMatchFiniteDifferences) { check_model_grads(bart_like()); }

TEST(EncoderDecoderModel, PreNormTransformerGradientsMatchFiniteDifferences) {
  check_model_grads(prenorm_transformer());
}

TEST(EncoderDecoderModel, PaddingIsInert) {
  for (const EncDecConfig& cfg : {bart_like(), prenorm_transformer()}) {
    std::mt19937_64 rng(test::test_seed());
    Context ctx(Device::cpu());
    EncoderDecoder m(cfg, ctx, DType::F64);
    random_params(m, rng);
    Pairs pairs(cfg, rng);
    const double loss = loss_of(m, pairs.batch(), true);
    // Other ids past the lengths: sources the keys' lengths mask, targets the loss ignores.
    for (int b = 0; b < pairs.B; ++b) {
      for (int t = pairs.src_lens[b]; t < pairs.Ts; ++t) pairs.src[b * pairs.Ts + t] = 4;
      for (int t = pairs.tgt_lens[b]; t < pairs.Tt; ++t)
        pairs.tgt_in[b * pairs.Tt + t] = pairs.tgt_out[b * pairs.Tt + t] = 5;
    }
    EXPECT_NEAR(loss_of(m, pairs.batch(), true), loss, 1e-12);
    // A length that covers one more source token does change it (the mask is what made it inert).
    pairs.src_lens[1] += 1;
    EXPECT_GT(std::abs(loss_of(m, pairs.batch(), true) - loss), 1e-9);
  }
}

TEST(EncoderDecoderModel, SmallerBatchReusesThePlanAndMatchesAFreshOne) {
  const EncDecConfig cfg = prenorm_transformer();
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  EncoderDecoder big(cfg, ctx, DType::F64), fresh(cfg, ctx, DType::F64);
  random_params(big, rng);
  std::copy(big.params().host_data<double>(), big.params().host_data<double>() + big.params().size(),
            fresh.params().host_data<double>());
  big.reserve(4, 7, 7);
  Pairs pairs(cfg, rng);
  const double a = loss_of(big, pairs.batch(), true), b = loss_of(fresh, pairs.batch(), true);
  EXPECT_EQ(big.plan_count(), 1);
  EXPECT_NEAR(a, b, 1e-13);
  big.zero_grad();
  big.backward();
  fresh.zero_grad();
  fresh.backward();
  const std::vector<float> ga = big.params().read_grad_f32(ctx), gb = fresh.params().read_grad_f32(ctx);
  EXPECT_LT(test::rel_error(ga, gb), 1e-6);
}

TEST(EncoderDecoderModel, PlannedReuseEqualsAPlanWithoutReuse) {
  const EncDecConfig cfg = bart_like();
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  EncoderDecoder shared(cfg, ctx, DType::F64);
  random_params(shared, rng);
  const Pairs pairs(cfg, rng);
  const double a = loss_of(shared, pairs.batch(), true);
  shared.zero_grad();
  shared.backward();
  ::setenv("TESSERA_PLAN_NO_REUSE", "1", 1);
  EncoderDecoder own(cfg, ctx, DType::F64);
  std::copy(shared.params().host_data<double>(), shared.params().host_data<double>() + shared.params().size(),
            own.params().host_data<double>());
  const double b = loss_of(own, pairs.batch(), true);
  own.zero_grad();
  own.backward();
  ::unsetenv("TESSERA_PLAN_NO_REUSE");
  EXPECT_LT(shared.activation_peak(), own.activation_peak());
  EXPECT_EQ(a, b);
  const size_t n = shared.params().size();
  const std::vector<double> ga(shared.params().host_grad<double>(), shared.params().host_grad<double>() + n);
  const std::vector<double> gb(own.params().host_grad<double>(), own.params().host_grad<double>() + n);
  EXPECT_EQ(ga, gb);
}

TEST(EncoderDecoderModel, BadBatchesAreOneLine) {
  const EncDecConfig cfg = bart_like();
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  EncoderDecoder m(cfg, ctx, DType::F64);
  Pairs pairs(cfg, rng);
  auto error = [&] { return test::without_numbers(test::error_of([&] { m.forward(pairs.batch()); })); };
  pairs.src_lens[2] = 0;
  EXPECT_EQ(error(), "batch: pair # has source length #, outside [#, #]");
  pairs.src_lens[2] = 4;
  pairs.tgt_out[3] = 13;
  EXPECT_EQ(error(), "batch: target id # at # is outside [#, #)");
  pairs.tgt_out[3] = 4;
  pairs.Ts = 8;
  EXPECT_EQ(error(), "batch: source length # is outside [#, max_seq #]");
  EXPECT_EQ(test::error_of([] { encdec_preset("transformer-small"); }),
            "unknown encoder-decoder preset 'transformer-small' (known: transformer-base, transformer-big, "
            "bart-base, tiny)");
  EncDecConfig bad = cfg;
  bad.act_dropout = 1.0f;
  EXPECT_EQ(test::error_of([&] { bad.validate(); }), "config: act_dropout must be in [0, 1), got 1");
}

}  // namespace
}  // namespace tessera
