// The encoder-decoder trained on the GPU against the CPU reference (models/encoder_decoder.h): the same weights on
// both devices, one padded batch (sources and targets shorter than their tensors, so that the key-length masks of
// the self- and cross-attentions and the loss's ignored positions all act), then the loss, every counted row of the
// logits and every parameter's gradient of the GPU model in f32 and bf16 against a CPU f64 model.
//
// Two configs: BART's form (post-norm, learned positions at offset 2, layernorm_embedding, GELU, shared and tied
// embeddings) and the pre-norm Transformer's (sinusoidal positions, scaled embeddings, ReLU, grouped KV heads,
// separate source and target tables, an untied output), with awkward sizes: a vocabulary of 37, d_ff 96, sources
// of 13 and targets of 11. Tolerances: the dtype's (cuda_test_util.h) times a factor for the depth (f32: the
// accumulation order of a few thousand terms; bf16: 8 mantissa bits in every stored activation of a 2 + 3 layer
// model).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/models/encoder_decoder.h"

namespace tessera::test {
namespace {

EncDecConfig bart_form() {
  EncDecConfig c = encdec_preset("bart-base");
  c.vocab = 37;
  c.enc_layers = 2;
  c.dec_layers = 2;
  c.d_model = 64;
  c.n_heads = 4;
  c.d_ff = 96;
  c.max_seq = 24;
  c.dropout = c.attn_dropout = c.act_dropout = 0.0f;
  c.init_std = 0.125f;  // d_model^-1/2: activations of unit size, so that the gradients are not rounding noise
  return c;
}

EncDecConfig prenorm_transformer() {
  EncDecConfig c = encdec_preset("transformer-base");
  c.vocab = 37;
  c.src_vocab = 29;
  c.shared_embeddings = false;
  c.tied_output = false;
  c.enc_layers = 2;
  c.dec_layers = 3;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 96;
  c.max_seq = 24;
  c.placement = NormPlacement::Pre;
  c.dropout = c.attn_dropout = c.act_dropout = 0.0f;
  c.init_std = 0.125f;
  return c;
}

// B = 3 pairs: sources of up to 13 tokens and targets of up to 11, padded past each row's length.
struct Pairs {
  int B = 3, Ts = 13, Tt = 11;
  std::vector<int32_t> src, src_lens{13, 5, 9}, tgt_in, tgt_out, tgt_lens{11, 3, 8};
  explicit Pairs(const EncDecConfig& c) {
    std::mt19937_64 rng(test_seed());
    auto ids = [&](int n, int V) {  // ids >= 3 inside the lengths, so that every position counts
      std::vector<int32_t> v = randint(size_t(n), V - 3, rng);
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

// The logits of the rows that count (t < tgt_lens[b]), row after row.
std::vector<double> counted_logits(const EncoderDecoder& m, const Pairs& p) {
  std::vector<double> out;
  for (int b = 0; b < p.B; ++b)
    for (int t = 0; t < p.tgt_lens[b]; ++t)
      for (float x : m.read_logits_row(b * p.Tt + t)) out.push_back(x);
  return out;
}

struct Scales {
  double loss, logits, grads;
};

void compare_with_cpu(const EncDecConfig& cfg, DType dt, const Scales& s, const std::string& what) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  SCOPED_TRACE(what + " " + dtype_label(dt));
  const Pairs p(cfg);
  const Seq2SeqBatch batch = p.batch();
  Context cpu_ctx(Device::cpu());
  EncoderDecoder cpu(cfg, cpu_ctx, DType::F64);
  cpu.init_weights(test_seed());
  // The weights rounded to f32 on both sides (the GPU model reads f32 and rounds to dt itself).
  const std::vector<float> w = cpu.params().read_f32(cpu_ctx);
  cpu.params().write_f32(w, cpu_ctx);
  EncoderDecoder gpu(cfg, ctx, dt);
  gpu.params().write_f32(w, ctx);
  gpu.reserve(p.B, p.Ts, p.Tt);

  const ForwardOptions fo{.training = true, .label_smoothing = 0.1f};
  const double lc = cpu.forward(batch, fo);
  // A first forward places the logits in the plan; poisoned, the second must write every counted row.
  gpu.forward(batch, fo);
  fill_bytes(gpu.logits(), 0xff, ctx);
  const double lg = gpu.forward(batch, fo);
  ASSERT_TRUE(std::isfinite(lg)) << "loss " << lg;
  EXPECT_LE(std::abs(lg - lc), s.loss * cuda_tolerance(dt) * std::abs(lc)) << "loss " << lg << " vs " << lc;
  expect_close(counted_logits(gpu, p), counted_logits(cpu, p), dt, "logits", s.logits);

  cpu.zero_grad();
  gpu.zero_grad();
  cpu.backward();
  gpu.backward();
  const std::vector<float> gc = cpu.params().read_grad_f32(cpu_ctx), gg = gpu.params().read_grad_f32(ctx);
  ASSERT_EQ(gc.size(), gg.size());
  for (const ParamSegment& seg : cpu.params().segments()) {
    const std::vector<double> a(gg.begin() + seg.offset, gg.begin() + seg.offset + seg.numel);
    const std::vector<double> b(gc.begin() + seg.offset, gc.begin() + seg.offset + seg.numel);
    // The pad row of a token table has no gradient: the floor keeps an all-zero reference from dividing by 0.
    expect_close(a, b, dt, "grad " + seg.name, s.grads, 1e-6);
  }
}

// f32: 10x the op tolerance for a dozen chained ops; bf16: the loss to one rounding, the logits and gradients to a
// few roundings through the depth.
constexpr Scales kF32{1.0, 10.0, 10.0};
constexpr Scales kBf16{1.0, 4.0, 8.0};

TEST(CudaEncDec, F32MatchesCpuBartForm) { compare_with_cpu(bart_form(), DType::F32, kF32, "bart form"); }
TEST(CudaEncDec, F32MatchesCpuPreNormGqa) { compare_with_cpu(prenorm_transformer(), DType::F32, kF32, "pre-norm"); }
TEST(CudaEncDec, Bf16FollowsCpuBartForm) { compare_with_cpu(bart_form(), DType::BF16, kBf16, "bart form"); }
TEST(CudaEncDec, Bf16FollowsCpuPreNormGqa) { compare_with_cpu(prenorm_transformer(), DType::BF16, kBf16, "pre-norm"); }

// Dropout on the GPU draws the CPU's masks (the same Philox streams of one RngState): with every dropout on, the
// f32 losses and gradients agree as tightly as without.
TEST(CudaEncDec, F32DropoutMatchesCpu) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  EncDecConfig cfg = prenorm_transformer();
  cfg.dropout = 0.1f;
  cfg.attn_dropout = 0.1f;
  cfg.act_dropout = 0.1f;
  const Pairs p(cfg);
  Context cpu_ctx(Device::cpu());
  EncoderDecoder cpu(cfg, cpu_ctx, DType::F32);
  cpu.init_weights(test_seed());
  EncoderDecoder gpu(cfg, ctx, DType::F32);
  gpu.params().write_f32(cpu.params().read_f32(cpu_ctx), ctx);
  RngState r1{7, 0}, r2{7, 0};
  const double lc = cpu.forward(p.batch(), {.training = true, .label_smoothing = 0.1f, .rng = &r1});
  const double lg = gpu.forward(p.batch(), {.training = true, .label_smoothing = 0.1f, .rng = &r2});
  EXPECT_NEAR(lg, lc, 1e-5 * lc);
  cpu.zero_grad();
  gpu.zero_grad();
  cpu.backward();
  gpu.backward();
  const auto gc = cpu.params().read_grad_f32(cpu_ctx), gg = gpu.params().read_grad_f32(ctx);
  for (const ParamSegment& seg : cpu.params().segments()) {
    const std::vector<double> a(gg.begin() + seg.offset, gg.begin() + seg.offset + seg.numel);
    const std::vector<double> b(gc.begin() + seg.offset, gc.begin() + seg.offset + seg.numel);
    expect_close(a, b, DType::F32, "grad " + seg.name, 10.0, 1e-6);
  }
}

}  // namespace
}  // namespace tessera::test
