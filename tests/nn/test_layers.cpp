// Each nn layer on its own: its forward and backward in fp64 on the CPU against central differences of a
// weighted sum of its outputs, over every parameter and every input.
#include <gtest/gtest.h>

#include "nn/nn_harness.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/block.h"
#include "tessera/nn/cross_attention.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/lm_head.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/norm.h"

namespace tessera {
namespace {

using test::HostTensor;
using test::LayerHarness;

TEST(NnLinear, ForwardAndBackwardMatchFiniteDifferences) {
  for (bool bias : {true, false}) {
    const int B = 2, T = 3, N = B * T, in = 5, out = 7;
    LayerHarness h(B, T);
    std::mt19937_64 rng(test::test_seed());
    Linear lin("proj", in, out, bias);
    lin.add_params(h.params());
    h.finalize_params(rng);
    HostTensor x({N, in}), y({N, out}), d_x({N, in});
    x.v = test::randn<double>(x.v.size(), rng);
    const std::vector<double> w = test::randn<double>(y.v.size(), rng);
    auto loss = [&] {
      lin.forward(h.env(), N, y.t(), x.t(), /*with_bias=*/true);
      return test::weighted_sum(y.v, w);
    };
    HostTensor d_y({N, out});
    d_y.v = w;
    h.check_param_grads(loss, [&] { lin.backward_weight(h.env(), N, d_y.t(), x.t(), /*with_bias=*/true); });
    lin.backward_input(h.env(), N, d_x.t(), d_y.t());
    LayerHarness::check_input_grad(loss, x.v, d_x.v, "d_x");
    // With accumulate, d_x += the gradient.
    const std::vector<double> prefill = test::prefilled<double>(d_x.v.size(), rng), grad = d_x.v;
    d_x.v = prefill;
    lin.backward_input(h.env(), N, d_x.t(), d_y.t(), /*accumulate=*/true);
    EXPECT_LT(test::rel_error(test::added(d_x.v, prefill), grad), 1e-12);
  }
}

struct NormCase {
  NormKind kind;
  bool bias;
};

TEST(NnNorm, ForwardAndBackwardMatchFiniteDifferences) {
  for (NormCase c : {NormCase{NormKind::LayerNorm, true}, NormCase{NormKind::LayerNorm, false},
                     NormCase{NormKind::RmsNorm, false}}) {
    const int B = 2, T = 3, N = B * T, C = 6;
    LayerHarness h(B, T);
    std::mt19937_64 rng(test::test_seed());
    Norm norm("ln1", c.kind, c.bias, C, 1e-5f);
    norm.add_params(h.params());
    h.finalize_params(rng);
    h.plan([&](PlanBuilder& pb) { norm.declare(pb, DType::F64, 0, 0, 0); });
    HostTensor x({N, C}), d_x({N, C});
    x.v = test::randn<double>(x.v.size(), rng, 2.0);
    HostTensor w({N, C});
    w.v = test::randn<double>(w.v.size(), rng);
    auto loss = [&] {
      norm.forward(h.env(), x.t());
      return test::weighted_sum(test::values(norm.out(N)), w.v);
    };
    h.check_param_grads(loss, [&] { norm.backward(h.env(), d_x.t(), w.t(), x.t()); });
    // d_x accumulates: the prefill comes through.
    const std::vector<double> prefill = test::prefilled<double>(d_x.v.size(), rng);
    d_x.v = prefill;
    loss();
    norm.backward(h.env(), d_x.t(), w.t(), x.t());
    LayerHarness::check_input_grad(loss, x.v, test::added(d_x.v, prefill), "d_x");
  }
}

// mid = residual + Drop(y + bias), out = norm(mid), with the add's backward run along the norm's.
TEST(NnNorm, ResidualFusedForwardAndBackwardMatchFiniteDifferences) {
  for (NormCase c : {NormCase{NormKind::LayerNorm, true}, NormCase{NormKind::RmsNorm, false}}) {
    const int B = 2, T = 3, N = B * T, C = 8;
    LayerHarness h(B, T);
    std::mt19937_64 rng(test::test_seed());
    Norm norm("ln2", c.kind, c.bias, C, 1e-5f);
    norm.add_params(h.params());
    h.finalize_params(rng);
    h.plan([&](PlanBuilder& pb) { norm.declare(pb, DType::F64, 0, 0, 0); });
    HostTensor res({N, C}), y({N, C}), bias({C}), mid({N, C}), w({N, C}), u({N, C});
    res.v = test::randn<double>(res.v.size(), rng);
    y.v = test::randn<double>(y.v.size(), rng);
    bias.v = test::randn<double>(bias.v.size(), rng);
    w.v = test::randn<double>(w.v.size(), rng);
    u.v = test::randn<double>(u.v.size(), rng);
    const uint64_t stream = 5;
    auto env = [&] { return h.env(/*dropout=*/0.3f, 0.0f, /*seed=*/77); };
    // loss = Σ w ⊙ out + Σ u ⊙ mid: mid's own gradient is the skip path the stream already holds.
    auto loss = [&] {
      norm.residual_forward(env(), stream, mid.t(), res.t(), y.t(), bias.t());
      return test::weighted_sum(test::values(norm.out(N)), w.v) + test::weighted_sum(mid.v, u.v);
    };
    HostTensor d_x({N, C}), d_y({N, C}, -1.0), d_bias({C});
    auto backward = [&] {
      d_x.v = u.v;
      std::fill(d_bias.v.begin(), d_bias.v.end(), 0.0);
      const NormResidualBackward rb{.p = {.N = N, .C = C, .dropout = 0.3f, .seed = 77, .stream = stream},
                                    .d_y = d_y.t(),
                                    .d_bias = d_bias.t()};
      norm.backward(env(), d_x.t(), w.t(), mid.t(), &rb);
    };
    h.check_param_grads(loss, backward);
    loss();
    backward();
    LayerHarness::check_input_grad(loss, res.v, d_x.v, "d_residual");
    LayerHarness::check_input_grad(loss, y.v, d_y.v, "d_y");
    LayerHarness::check_input_grad(loss, bias.v, d_bias.v, "d_bias");
  }
}

TEST(NnEmbedding, ForwardAndBackwardMatchFiniteDifferences) {
  for (PositionKind pos : {PositionKind::Learned, PositionKind::Sinusoidal}) {
    const int B = 2, T = 4, N = B * T, C = 6, V = 9;
    LayerHarness h(B, T);
    std::mt19937_64 rng(test::test_seed());
    Embedding emb("", {.V = V, .C = C, .max_seq = 5, .positions = pos, .scale = 1.5f, .padding_id = 2});
    emb.add_params(h.params());
    h.finalize_params(rng);
    emb.make_tables(DType::F64, h.ctx());
    emb.schedule_forward(h.sched());
    emb.schedule_backward(h.sched());
    h.plan([&](PlanBuilder& pb) { emb.declare(pb, DType::F64, emb.backward_event()); });
    std::vector<int32_t> tok = test::randint(N, V, rng);
    tok[1] = 2;  // the padding id: no gradient to its row
    const Tensor tokens = test::i32_tensor(tok);
    RngState rs{11, 0};
    emb.draw_streams(&rs, /*dropout_on=*/true);
    HostTensor w({N, C});
    w.v = test::randn<double>(w.v.size(), rng);
    auto loss = [&] {
      emb.forward(h.env(0.25f, 0.0f, 11), tokens);
      return test::weighted_sum(test::values(emb.out(N)), w.v);
    };
    h.check_param_grads(loss, [&] { emb.backward(h.env(0.25f, 0.0f, 11), w.t(), tokens); });
  }
}

// A sublayer (attention or MLP) alone: y = sub(x), loss = Σ w ⊙ y, d_x by its backward.
void check_sublayer(Sublayer& sub, int B, int T, int C, float attn_dropout, std::mt19937_64& rng) {
  const int N = B * T;
  LayerHarness h(B, T);
  sub.add_params(h.params());
  h.finalize_params(rng);
  sub.schedule_forward(h.sched(), "layer 0");
  sub.schedule_backward(h.sched(), "layer 0");
  h.plan([&](PlanBuilder& pb) {
    sub.declare_saved(pb, DType::F64);
    sub.declare_temps(pb, DType::F64);
  });
  RngState rs{21, 0};
  sub.draw_streams(&rs, attn_dropout > 0, /*act_dropout_on=*/false);
  HostTensor x({N, C}), y({N, C}), w({N, C}), d_x({N, C});
  x.v = test::randn<double>(x.v.size(), rng);
  w.v = test::randn<double>(w.v.size(), rng);
  auto env = [&] { return h.env(0.0f, attn_dropout, 21); };
  auto loss = [&] {
    sub.forward(env(), x.t(), y.t());
    return test::weighted_sum(y.v, w.v);
  };
  // The output bias belongs to the residual add that follows (residual + Drop(y + b)), which sums its gradient:
  // here loss_with_bias adds it to y, and the backward sums Σ_rows w into its gradient as that add would.
  auto loss_with_bias = [&] {
    double l = loss();
    const Tensor b = sub.output_bias(env());
    if (b.defined())
      for (int n = 0; n < N; ++n)
        for (int j = 0; j < C; ++j) l += test::f64(b)[j] * w.v[static_cast<size_t>(n * C + j)];
    return l;
  };
  auto backward = [&] {
    sub.backward(env(), w.t(), x.t(), d_x.t(), /*accumulate=*/false);
    const Tensor db = sub.d_output_bias(env());
    if (db.defined())
      for (int n = 0; n < N; ++n)
        for (int j = 0; j < C; ++j) test::f64(db)[j] += w.v[static_cast<size_t>(n * C + j)];
  };
  h.check_param_grads(loss_with_bias, backward);
  loss();
  sub.backward(env(), w.t(), x.t(), d_x.t(), /*accumulate=*/false);
  LayerHarness::check_input_grad(loss, x.v, d_x.v, "d_x");
}

TEST(NnSelfAttention, ForwardAndBackwardMatchFiniteDifferences) {
  std::mt19937_64 rng(test::test_seed());
  const int C = 8;
  SelfAttention causal("h.0.", {.C = C, .H = 2, .Hkv = 2, .Dh = 4, .bias = true, .causal = true});
  check_sublayer(causal, 2, 5, C, 0.0f, rng);
  SelfAttention encoder("h.0.", {.C = C, .H = 2, .Hkv = 2, .Dh = 4, .bias = true, .causal = false});
  check_sublayer(encoder, 2, 5, C, 0.0f, rng);
  SelfAttention rope("h.0.", {.C = C, .H = 2, .Hkv = 2, .Dh = 4, .bias = false, .causal = true, .rope_theta = 100.0f});
  check_sublayer(rope, 1, 6, C, 0.0f, rng);
  SelfAttention dropout("h.0.", {.C = C, .H = 2, .Hkv = 2, .Dh = 4, .bias = true, .causal = true});
  check_sublayer(dropout, 2, 4, C, 0.3f, rng);
}

// Grouped-query attention: the qkv projection shrinks to (H + 2 Hkv) Dh columns; multi-query at Hkv = 1.
TEST(NnSelfAttention, GroupedKvHeadsMatchFiniteDifferences) {
  std::mt19937_64 rng(test::test_seed());
  const int C = 12;
  SelfAttention gqa("h.0.", {.C = C, .H = 4, .Hkv = 2, .Dh = 3, .bias = true, .causal = true});
  check_sublayer(gqa, 2, 5, C, 0.0f, rng);
  SelfAttention mqa("h.0.", {.C = C, .H = 3, .Hkv = 1, .Dh = 4, .bias = false, .causal = true, .rope_theta = 50.0f});
  check_sublayer(mqa, 2, 4, C, 0.2f, rng);
  ParamBuffer pb;
  gqa.add_params(pb);
  EXPECT_EQ(pb.shape(static_cast<size_t>(pb.find("h.0.qkv.w"))), (std::vector<int64_t>{(4 + 2 * 2) * 3, C}));
}

TEST(NnMlp, ForwardAndBackwardMatchFiniteDifferences) {
  std::mt19937_64 rng(test::test_seed());
  const int C = 6;
  Mlp gelu("h.0.", {.C = C, .F = 10, .kind = Activation::Gelu, .bias = true});
  check_sublayer(gelu, 2, 3, C, 0.0f, rng);
  Mlp relu("h.0.", {.C = C, .F = 7, .kind = Activation::Relu, .bias = true});
  check_sublayer(relu, 2, 3, C, 0.0f, rng);
  Mlp swiglu("h.0.", {.C = C, .F = 5, .kind = Activation::Swiglu, .bias = false});
  check_sublayer(swiglu, 2, 3, C, 0.0f, rng);
}

BlockShape block_shape(NormPlacement placement, BlockKind kind, NormKind norm, Activation act, bool bias) {
  const int C = 8;
  return {.kind = kind,
          .placement = placement,
          .attention = {.C = C, .H = 2, .Hkv = 2, .Dh = 4, .bias = bias},
          .mlp = {.C = C, .F = 12, .kind = act, .bias = bias},
          .norm = norm,
          .norm_eps = 1e-5f};
}

// A pre-norm block with the norm that reads its output (its last residual add computes that norm, whose backward
// runs the add's along): loss = Σ w ⊙ norm(out) + Σ u ⊙ out.
TEST(NnBlock, PreNormWithTheNextNormFusedMatchesFiniteDifferences) {
  for (bool llama : {false, true}) {
    const int B = 2, T = 4, N = B * T, C = 8;
    LayerHarness h(B, T);
    std::mt19937_64 rng(test::test_seed());
    const BlockShape shape =
        llama ? block_shape(NormPlacement::Pre, BlockKind::Decoder, NormKind::RmsNorm, Activation::Swiglu, false)
              : block_shape(NormPlacement::Pre, BlockKind::Decoder, NormKind::LayerNorm, Activation::Gelu, true);
    Block block("h.0.", "layer 0", shape);
    Norm next("lnf", shape.norm, shape.attention.bias, C, 1e-5f);
    block.set_next_norm(&next);
    block.add_params(h.params());
    next.add_params(h.params());
    h.finalize_params(rng);
    block.schedule_forward(h.sched());
    const int reader = h.sched().add(Phase::Backward, "", {"next norm + residual"});
    block.schedule_backward(h.sched());
    h.plan([&](PlanBuilder& pb) {
      block.declare(pb, DType::F64, "out", reader);
      next.declare(pb, DType::F64, block.output_event(), reader, reader);
    });
    RngState rs{31, 0};
    block.draw_streams(&rs, /*dropout_on=*/true, /*attn_dropout_on=*/true);
    HostTensor x({N, C}), tmp({N, C}), w({N, C}), u({N, C}), d_res({N, C});
    x.v = test::randn<double>(x.v.size(), rng);
    w.v = test::randn<double>(w.v.size(), rng);
    u.v = test::randn<double>(u.v.size(), rng);
    auto env = [&] { return h.env(0.2f, 0.25f, 31); };
    auto loss = [&] {
      block.forward(env(), x.t(), tmp.t());
      return test::weighted_sum(test::values(next.out(N)), w.v) + test::weighted_sum(test::values(block.out(N)), u.v);
    };
    auto backward = [&] {
      const StepEnv e = env();
      e.at(reader);
      d_res.v = u.v;
      const NormResidualBackward rb = block.output_residual_backward(e);
      next.backward(e, d_res.t(), w.t(), block.out(N), &rb);
      block.backward(e, d_res.t(), x.t());
    };
    h.check_param_grads(loss, backward);
    loss();
    backward();
    LayerHarness::check_input_grad(loss, x.v, d_res.v, "d_x");
  }
}

// A post-norm encoder block (non-causal self-attention) on its own: loss = Σ w ⊙ out.
TEST(NnBlock, PostNormEncoderMatchesFiniteDifferences) {
  const int B = 2, T = 4, N = B * T, C = 8;
  LayerHarness h(B, T);
  std::mt19937_64 rng(test::test_seed());
  Block block("enc.0.", "encoder 0",
              block_shape(NormPlacement::Post, BlockKind::Encoder, NormKind::LayerNorm, Activation::Gelu, true));
  block.add_params(h.params());
  h.finalize_params(rng);
  block.schedule_forward(h.sched());
  block.schedule_backward(h.sched());
  h.plan([&](PlanBuilder& pb) { block.declare(pb, DType::F64, "out", h.sched().end() - 1); });
  RngState rs{41, 0};
  block.draw_streams(&rs, /*dropout_on=*/true, /*attn_dropout_on=*/false);
  HostTensor x({N, C}), tmp({N, C}), w({N, C}), d_res({N, C});
  x.v = test::randn<double>(x.v.size(), rng);
  w.v = test::randn<double>(w.v.size(), rng);
  auto env = [&] { return h.env(0.2f, 0.0f, 41); };
  auto loss = [&] {
    block.forward(env(), x.t(), tmp.t());
    return test::weighted_sum(test::values(block.out(N)), w.v);
  };
  auto backward = [&] {
    d_res.v = w.v;
    block.backward(env(), d_res.t(), x.t());
  };
  h.check_param_grads(loss, backward);
  loss();
  backward();
  LayerHarness::check_input_grad(loss, x.v, d_res.v, "d_x");
  // Causal or not: a later position's input moves an earlier position's output only in the encoder.
  const std::vector<double> base = (loss(), test::values(block.out(N)));
  x.v[static_cast<size_t>((T - 1) * C)] += 1.0;
  loss();
  EXPECT_NE(test::values(block.out(N))[0], base[0]);
}

// The head: final norm, logits over an untied lm_head, label-smoothed cross-entropy; the loss's gradient through
// the separate backward and through the one the forward writes (loss_grad_scale) are the same.
TEST(NnLmHead, ForwardAndBackwardMatchFiniteDifferences) {
  const int B = 2, T = 3, N = B * T, C = 6, V = 11;
  LayerHarness h(B, T);
  std::mt19937_64 rng(test::test_seed());
  LmHead head({.V = V,
               .C = C,
               .ld = V,
               .norm = NormKind::LayerNorm,
               .bias = true,
               .norm_eps = 1e-5f,
               .tied = false,
               .ignore_index = 3});
  head.add_params(h.params(), kNoParam);
  h.finalize_params(rng);
  head.schedule_forward(h.sched());
  head.schedule_backward(h.sched());
  h.plan([&](PlanBuilder& pb) { head.declare(pb, DType::F64); });
  HostTensor x({N, C}), loss_sum({2}), d_res({N, C});
  x.v = test::randn<double>(x.v.size(), rng);
  std::vector<int32_t> tgt = test::randint(N, V, rng), cnt(1, 0);
  tgt[2] = 3;  // ignored
  const Tensor targets = test::i32_tensor(tgt);
  const Tensor count = test::i32_tensor(cnt);
  auto forward = [&](std::optional<double> scale) {
    const StepEnv e = h.env();
    head.forward(e, x.t());
    head.loss_forward(e, targets, 0.1f, scale, loss_sum.t(), count);
    return loss_sum.v[1];
  };
  auto loss = [&] { return forward(std::nullopt); };
  auto backward = [&] { head.backward(h.env(), d_res.t(), x.t(), targets, 0.1f, 1.0, /*fused=*/false, count); };
  h.check_param_grads(loss, backward);
  loss();
  backward();
  LayerHarness::check_input_grad(loss, x.v, d_res.v, "d_x");
  const std::vector<double> separate = d_res.v;
  forward(1.0);
  head.backward(h.env(), d_res.t(), x.t(), targets, 0.1f, 1.0, /*fused=*/true, count);
  EXPECT_LT(test::rel_error(d_res.v, separate), 1e-12);
}

// Cross-attention from Tq decoder rows over Tk memory rows, grouped KV heads, with key lengths: every parameter,
// d_x and the memory's gradient (added to d_memory) against finite differences; masked keys change nothing.
TEST(NnCrossAttention, ForwardAndBackwardMatchFiniteDifferences) {
  const int B = 2, Tq = 3, Tk = 5, C = 8, N = B * Tq;
  LayerHarness h(B, Tq);
  std::mt19937_64 rng(test::test_seed());
  CrossAttention cross("dec.0.cross.", {.C = C, .H = 4, .Hkv = 2, .Dh = 2, .bias = true});
  cross.set_memory_length(Tk);
  cross.add_params(h.params());
  h.finalize_params(rng);
  cross.schedule_forward(h.sched(), "decoder 0");
  cross.schedule_backward(h.sched(), "decoder 0");
  h.plan([&](PlanBuilder& pb) {
    cross.declare_saved(pb, DType::F64);
    cross.declare_temps(pb, DType::F64);
  });
  HostTensor x({N, C}), y({N, C}), w({N, C}), d_x({N, C}), mem({B * Tk, C}), d_mem({B * Tk, C});
  x.v = test::randn<double>(x.v.size(), rng);
  w.v = test::randn<double>(w.v.size(), rng);
  mem.v = test::randn<double>(mem.v.size(), rng);
  std::vector<int32_t> lens{Tk, 2};
  cross.set_memory(mem.t(), d_mem.t(), test::i32_tensor(lens));
  auto loss = [&] {
    cross.forward(h.env(), x.t(), y.t());
    double l = test::weighted_sum(y.v, w.v);
    const Tensor b = cross.output_bias(h.env());
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < C; ++j) l += test::f64(b)[j] * w.v[static_cast<size_t>(n * C + j)];
    return l;
  };
  auto backward = [&] {
    cross.backward(h.env(), w.t(), x.t(), d_x.t(), /*accumulate=*/false);
    const Tensor db = cross.d_output_bias(h.env());
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < C; ++j) test::f64(db)[j] += w.v[static_cast<size_t>(n * C + j)];
  };
  h.check_param_grads(loss, backward);
  loss();
  const std::vector<double> prefill = test::prefilled<double>(d_mem.v.size(), rng);
  d_mem.v = prefill;
  backward();
  LayerHarness::check_input_grad(loss, x.v, d_x.v, "d_x");
  LayerHarness::check_input_grad(loss, mem.v, test::added(d_mem.v, prefill), "d_memory");
  // Sequence 1 sees its first 2 memory rows only.
  const double base = loss();
  for (int j = 0; j < C; ++j) mem.v[static_cast<size_t>((Tk + 3) * C + j)] += 1.0;
  EXPECT_EQ(loss(), base);
  mem.v[static_cast<size_t>((Tk + 1) * C)] += 1.0;
  EXPECT_NE(loss(), base);
}

}  // namespace
}  // namespace tessera
