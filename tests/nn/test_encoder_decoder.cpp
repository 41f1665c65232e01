// A model that Gpt does not describe, composed of the same nn layers: a 2-layer encoder (non-causal
// self-attention) and a 2-layer decoder whose blocks cross-attend over the encoder's output (Tq != Tk,
// grouped KV heads, key lengths), with token + position embeddings on both sides and a language-model head. Its
// gradient, of every parameter of both stacks, is checked against fp64 finite differences on the CPU: the
// encoder-decoder model is composition. The decoder in both norm placements: post-norm (the Transformer of
// "Attention Is All You Need", BART) and pre-norm (fairseq's --decoder-normalize-before), whose block with
// cross-attention has three norms before its three sublayers, each block's last residual add computing the next
// one's first norm (the head's final norm after the last).
#include <gtest/gtest.h>

#include "nn/nn_harness.h"
#include "tessera/nn/block.h"
#include "tessera/nn/cross_attention.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/lm_head.h"

namespace tessera {
namespace {

constexpr int kB = 2, kTs = 5, kTt = 4, kC = 8, kV = 13, kLayers = 2;

BlockShape block_shape(BlockKind kind, NormPlacement placement) {
  return {.kind = kind,
          .placement = placement,
          .attention = {.C = kC, .H = 4, .Hkv = 2, .Dh = 2, .bias = true},
          .mlp = {.C = kC, .F = 12, .kind = Activation::Gelu, .bias = true},
          .norm = NormKind::LayerNorm,
          .norm_eps = 1e-5f};
}

struct EncoderDecoder {
  Embedding enc_emb{"enc.", {.V = kV, .C = kC, .max_seq = 8, .positions = PositionKind::Learned}};
  Embedding dec_emb{"dec.", {.V = kV, .C = kC, .max_seq = 8, .positions = PositionKind::Learned}};
  std::vector<Block> enc, dec;
  LmHead head{{.V = kV, .C = kC, .ld = kV, .norm = NormKind::LayerNorm, .bias = true, .tied = false}};
  StepSchedule sched;
  test::OrderClock clock;
  MemoryPlan enc_plan{Arena::kAlign}, dec_plan{Arena::kAlign};
  Arena enc_arena, dec_arena;
  Tensor enc_tmp, dec_tmp, memory_grad, d_enc, d_dec;

  EncoderDecoder(ParamBuffer& pb, NormPlacement placement) {
    enc.reserve(kLayers);
    dec.reserve(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      enc.emplace_back("enc." + std::to_string(l) + ".", "encoder " + std::to_string(l),
                       block_shape(BlockKind::Encoder, NormPlacement::Post));
      dec.emplace_back("dec." + std::to_string(l) + ".", "decoder " + std::to_string(l),
                       block_shape(BlockKind::DecoderCross, placement));
      dec.back().cross_attention()->set_memory_length(kTs);
    }
    // A pre-norm block's last residual add computes the norm that reads its output (the cross-block fusion): the
    // next block's first norm, or the head's final norm.
    if (placement == NormPlacement::Pre) {
      for (int l = 0; l < kLayers; ++l) {
        dec[l].set_producer(l > 0 ? &dec[l - 1] : nullptr);
        dec[l].set_next_norm(l + 1 < kLayers ? &dec[l + 1].input_norm() : &head.input_norm());
      }
      head.set_producer(&dec.back());
    }
    enc_emb.add_params(pb);
    for (Block& b : enc) b.add_params(pb);
    dec_emb.add_params(pb);
    for (Block& b : dec) b.add_params(pb);
    head.add_params(pb, kNoParam);
    // Forward: the encoder, then the decoder and the head; backward the other way round.
    enc_emb.schedule_forward(sched);
    for (Block& b : enc) b.schedule_forward(sched);
    dec_emb.schedule_forward(sched);
    for (Block& b : dec) b.schedule_forward(sched);
    head.schedule_forward(sched);
    head.schedule_backward(sched);
    for (int l = kLayers - 1; l >= 0; --l) dec[l].schedule_backward(sched);
    dec_emb.schedule_backward(sched);
    for (int l = kLayers - 1; l >= 0; --l) enc[l].schedule_backward(sched);
    enc_emb.schedule_backward(sched);
    clock.sched = &sched;
  }

  // The encoder's buffers are planned for B x Ts tokens and the decoder's for B x Tt, over the one schedule.
  void plan() {
    const PlanDebug debug;
    const int end = sched.end();
    PlanBuilder pe(enc_plan, debug, kB, kTs), pd(dec_plan, debug, kB, kTt);
    enc_emb.declare(pe, DType::F64, enc[0].input_last_use());
    pe.add(enc_tmp, "enc.tmp", DType::F64, {kB * kTs, kC}, 0, end);
    for (int l = 0; l < kLayers; ++l)
      enc[l].declare(pe, DType::F64, "", l + 1 < kLayers ? enc[l + 1].input_last_use() : end - 1);
    pe.add(memory_grad, "enc.d_memory", DType::F64, {kB * kTs, kC}, 0, end);
    pe.add(d_enc, "enc.d_res", DType::F64, {kB * kTs, kC}, 0, end);
    dec_emb.declare(pd, DType::F64, dec[0].input_last_use());
    pd.add(dec_tmp, "dec.tmp", DType::F64, {kB * kTt, kC}, 0, end);
    for (int l = 0; l < kLayers; ++l)
      dec[l].declare(pd, DType::F64, "dec.res." + std::to_string(l + 1),
                     l + 1 < kLayers ? dec[l + 1].input_last_use() : head.input_last_use());
    head.declare(pd, DType::F64);
    pd.add(d_dec, "dec.d_res", DType::F64, {kB * kTt, kC}, 0, end);
    for (auto* p : {&enc_plan, &dec_plan}) p->assign(/*reuse=*/false);
    enc_arena = Arena(enc_plan.peak(), Device::cpu());
    dec_arena = Arena(dec_plan.peak(), Device::cpu());
    pe.bind(enc_arena);
    pd.bind(dec_arena);
  }

  StepEnv env(ParamBuffer& pb, Context& ctx, int T) {
    return {.ctx = &ctx,
            .params = &pb,
            .dtype = DType::F64,
            .clock = &clock,
            .B = kB,
            .T = T,
            .dropout = 0.1f,
            .attn_dropout = 0.1f,
            .seed = 99};
  }

  double forward(ParamBuffer& pb, Context& ctx, const Tensor& src, const Tensor& tgt, const Tensor& targets,
                 const Tensor& key_lens, const Tensor& loss, const Tensor& count) {
    clock.last = -1;
    const StepEnv ee = env(pb, ctx, kTs), ed = env(pb, ctx, kTt);
    enc_emb.forward(ee, src);
    for (int l = 0; l < kLayers; ++l) enc[l].forward(ee, l ? enc[l - 1].out(kB * kTs) : enc_emb.out(kB * kTs), enc_tmp);
    for (Block& b : dec) b.cross_attention()->set_memory(enc.back().out(kB * kTs), memory_grad, key_lens);
    dec_emb.forward(ed, tgt);
    for (int l = 0; l < kLayers; ++l) dec[l].forward(ed, l ? dec[l - 1].out(kB * kTt) : dec_emb.out(kB * kTt), dec_tmp);
    head.forward(ed, dec.back().out(kB * kTt));
    head.loss_forward(ed, targets, 0.0f, std::nullopt, loss, count);
    return test::f64(loss)[1];
  }

  void backward(ParamBuffer& pb, Context& ctx, const Tensor& src, const Tensor& tgt, const Tensor& targets,
                const Tensor& count) {
    const StepEnv ee = env(pb, ctx, kTs), ed = env(pb, ctx, kTt);
    fill_bytes(memory_grad, 0, ctx);
    head.backward(ed, d_dec, dec.back().out(kB * kTt), targets, 0.0f, 1.0, /*fused=*/false, count);
    for (int l = kLayers - 1; l >= 0; --l)
      dec[l].backward(ed, d_dec, l ? dec[l - 1].out(kB * kTt) : dec_emb.out(kB * kTt));
    dec_emb.backward(ed, d_dec, tgt);
    // The encoder's output gets its gradient from every decoder block's cross-attention.
    std::copy(test::f64(memory_grad), test::f64(memory_grad) + kB * kTs * kC, test::f64(d_enc));
    for (int l = kLayers - 1; l >= 0; --l)
      enc[l].backward(ee, d_enc, l ? enc[l - 1].out(kB * kTs) : enc_emb.out(kB * kTs));
    enc_emb.backward(ee, d_enc, src);
  }
};

void check_encoder_decoder(NormPlacement placement) {
  test::LayerHarness h(kB, kTt);
  std::mt19937_64 rng(test::test_seed());
  EncoderDecoder m(h.params(), placement);
  h.finalize_params(rng);
  m.plan();
  std::vector<int32_t> src = test::randint(kB * kTs, kV, rng), tgt = test::randint(kB * kTt, kV, rng);
  std::vector<int32_t> targets = test::randint(kB * kTt, kV, rng), count(1, 0), key_lens{kTs, 3};
  const Tensor src_t = test::i32_tensor(src), tgt_t = test::i32_tensor(tgt), targets_t = test::i32_tensor(targets);
  const Tensor count_t = test::i32_tensor(count), key_lens_t = test::i32_tensor(key_lens);
  test::HostTensor loss({2});
  RngState rs{99, 0};
  m.enc_emb.draw_streams(&rs, true);
  m.dec_emb.draw_streams(&rs, true);
  for (Block& b : m.enc) b.draw_streams(&rs, true, true);
  for (Block& b : m.dec) b.draw_streams(&rs, true, true);
  auto forward = [&] { return m.forward(h.params(), h.ctx(), src_t, tgt_t, targets_t, key_lens_t, loss.t(), count_t); };
  h.check_param_grads(forward, [&] { m.backward(h.params(), h.ctx(), src_t, tgt_t, targets_t, count_t); });
  // A step runs every event of the schedule in order (the order clock sees the encoder's embedding backward last).
  forward();
  m.backward(h.params(), h.ctx(), src_t, tgt_t, targets_t, count_t);
  EXPECT_EQ(m.clock.last, m.sched.end() - 1);
}

TEST(NnEncoderDecoder, PostNormWithCrossAttentionMatchesFiniteDifferences) {
  check_encoder_decoder(NormPlacement::Post);
}

TEST(NnEncoderDecoder, PreNormWithCrossAttentionMatchesFiniteDifferences) { check_encoder_decoder(NormPlacement::Pre); }

}  // namespace
}  // namespace tessera
