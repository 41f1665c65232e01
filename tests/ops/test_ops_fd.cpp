// Every op's backward against fp64 central differences, on awkward shapes with fresh random inputs.
// Outputs an op overwrites are filled with NaN before the call (a value it fails to write shows up), and
// outputs it accumulates into (+=, as the op headers say: weight, bias and norm-input gradients) are filled
// with random values first; the test then checks result - prefill against the true gradient.
#include <cmath>
#include <set>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_naive.h"
#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/loss/cross_entropy.h"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/residual.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::added;
using test::fd_rel_error;
using test::kFdTolF64;
using test::poisoned;
using test::prefilled;
using test::randn;
using test::weighted_sum;

class OpsFd : public ::testing::Test {
 protected:
  std::mt19937_64 rng{test::test_seed()};
  void SetUp() override { RecordProperty("seed", std::to_string(test::test_seed())); }
};

TEST_F(OpsFd, Embedding) {
  for (float dropout : {0.0f, 0.3f}) {
    const EmbeddingParams p{.B = 2,
                            .T = 5,
                            .C = 7,
                            .V = 11,
                            .max_seq = 9,
                            .pos_offset = 2,
                            .scale = 1.7f,
                            .padding_id = 3,
                            .dropout = dropout,
                            .seed = 99,
                            .stream = 5};
    auto wte = randn<double>(p.V * p.C, rng), wpe = randn<double>(p.max_seq * p.C, rng);
    auto tokens = test::randint(p.B * p.T, p.V, rng);
    for (auto& t : tokens) t = t == 3 ? 2 : t;
    tokens[4] = 3;  // exactly one padding token
    const auto w = randn<double>(p.B * p.T * p.C, rng);
    auto loss = [&] {
      auto out = poisoned<double>(w.size());
      embedding_forward_ref(p, out.data(), tokens.data(), wte.data(), wpe.data());
      return weighted_sum(out, w);
    };
    const auto wte_pre = prefilled<double>(wte.size(), rng), wpe_pre = prefilled<double>(wpe.size(), rng);
    auto d_wte = wte_pre, d_wpe = wpe_pre;
    embedding_backward_ref(p, d_wte.data(), d_wpe.data(), w.data(), tokens.data());
    EXPECT_LT(fd_rel_error(loss, wte, added(d_wte, wte_pre)), kFdTolF64);
    EXPECT_LT(fd_rel_error(loss, wpe, added(d_wpe, wpe_pre)), kFdTolF64);
    for (int c = 0; c < p.C; ++c) EXPECT_EQ(d_wte[3 * p.C + c], wte_pre[3 * p.C + c]);  // padding row: no gradient

    auto out = poisoned<double>(w.size());
    embedding_forward_ref(p, out.data(), tokens.data(), wte.data(), wpe.data());
    for (int c = 0; c < p.C; ++c) EXPECT_EQ(out[4 * p.C + c], 0.0);  // padding gives zeros
    int zeros = 0;
    for (double v : out) {
      ASSERT_FALSE(std::isnan(v));
      zeros += v == 0.0;
    }
    if (dropout == 0) EXPECT_EQ(zeros, p.C);
    else EXPECT_GT(zeros, p.C);
  }
}

TEST_F(OpsFd, EmbeddingRejectsBadTokens) {
  const EmbeddingParams p{.B = 1, .T = 3, .C = 4, .V = 5, .max_seq = 3};
  std::vector<double> wte(20), out(12);
  std::vector<int32_t> tokens{0, 5, 1};
  EXPECT_THROW(embedding_forward_ref<double>(p, out.data(), tokens.data(), wte.data(), nullptr), Error);
  tokens = {0, -1, 1};
  EXPECT_THROW(embedding_forward_ref<double>(p, out.data(), tokens.data(), wte.data(), nullptr), Error);
}

TEST_F(OpsFd, LayerNorm) {
  for (bool with_bias : {true, false}) {
    const NormParams p{.N = 5, .C = 13, .eps = 1e-5f};
    auto x = randn<double>(p.N * p.C, rng), wt = randn<double>(p.C, rng), b = randn<double>(p.C, rng);
    const auto w = randn<double>(p.N * p.C, rng);
    std::vector<double> mean(p.N), rstd(p.N);
    auto loss = [&] {
      auto out = poisoned<double>(w.size());
      mean = poisoned<double>(p.N);
      rstd = poisoned<double>(p.N);
      layernorm_forward_ref(p, out.data(), mean.data(), rstd.data(), x.data(), wt.data(),
                            with_bias ? b.data() : nullptr);
      return weighted_sum(out, w);
    };
    loss();
    const auto dx_pre = prefilled<double>(x.size(), rng), dw_pre = prefilled<double>(p.C, rng),
               db_pre = prefilled<double>(p.C, rng);
    auto dx = dx_pre, dw = dw_pre, db = db_pre;
    layernorm_backward_ref(p, dx.data(), dw.data(), with_bias ? db.data() : nullptr, w.data(), x.data(), wt.data(),
                           mean.data(), rstd.data());
    EXPECT_LT(fd_rel_error(loss, x, added(dx, dx_pre)), kFdTolF64);
    EXPECT_LT(fd_rel_error(loss, wt, added(dw, dw_pre)), kFdTolF64);
    if (with_bias) {
      EXPECT_LT(fd_rel_error(loss, b, added(db, db_pre)), kFdTolF64);
    }
  }
}

TEST_F(OpsFd, LayerNormStatistics) {
  const NormParams p{.N = 3, .C = 1000, .eps = 1e-5f};
  auto x = randn<float>(p.N * p.C, rng, 3.0);
  for (auto& v : x) v += 100.0f;  // a large mean: one-pass variance formulas lose digits here
  std::vector<float> out = poisoned<float>(x.size()), mean = poisoned<float>(p.N), rstd = poisoned<float>(p.N);
  std::vector<float> wt(p.C, 1.0f);
  layernorm_forward_ref<float>(p, out.data(), mean.data(), rstd.data(), x.data(), wt.data(), nullptr);
  for (int n = 0; n < p.N; ++n) {
    double s = 0, s2 = 0;
    for (int c = 0; c < p.C; ++c) {
      s += out[n * p.C + c];
      s2 += static_cast<double>(out[n * p.C + c]) * out[n * p.C + c];
    }
    EXPECT_NEAR(s / p.C, 0.0, 1e-5);
    EXPECT_NEAR(s2 / p.C, 1.0, 1e-3);
    EXPECT_NEAR(mean[n], 100.0, 0.5);
    EXPECT_GT(rstd[n], 0.2f);
    EXPECT_LT(rstd[n], 0.5f);  // 1 / std, std ≈ 3
  }
}

TEST_F(OpsFd, RmsNorm) {
  const NormParams p{.N = 4, .C = 17, .eps = 1e-6f};
  auto x = randn<double>(p.N * p.C, rng), wt = randn<double>(p.C, rng);
  const auto w = randn<double>(p.N * p.C, rng);
  std::vector<double> rstd(p.N);
  auto loss = [&] {
    auto out = poisoned<double>(w.size());
    rstd = poisoned<double>(p.N);
    rmsnorm_forward_ref(p, out.data(), rstd.data(), x.data(), wt.data());
    return weighted_sum(out, w);
  };
  loss();
  const auto dx_pre = prefilled<double>(x.size(), rng), dw_pre = prefilled<double>(p.C, rng);
  auto dx = dx_pre, dw = dw_pre;
  rmsnorm_backward_ref(p, dx.data(), dw.data(), w.data(), x.data(), wt.data(), rstd.data());
  EXPECT_LT(fd_rel_error(loss, x, added(dx, dx_pre)), kFdTolF64);
  EXPECT_LT(fd_rel_error(loss, wt, added(dw, dw_pre)), kFdTolF64);
}

// The attention reference's d_qkv against central differences of sum(w ∘ out), on fresh random qkv and w.
void expect_attention_gradients(const AttentionParams& p, std::mt19937_64& rng) {
  const int C = p.H * p.Dh;
  auto qkv = randn<double>(p.B * p.T * 3 * C, rng);
  const auto w = randn<double>(p.B * p.T * C, rng);
  std::vector<double> out(w.size()), lse(p.B * p.H * p.T);
  auto loss = [&] {
    out = poisoned<double>(out.size());
    lse = poisoned<double>(lse.size());
    attention_forward_ref(p, out.data(), lse.data(), qkv.data());
    return weighted_sum(out, w);
  };
  loss();
  std::vector<double> dqkv = poisoned<double>(qkv.size());
  attention_backward_ref(p, dqkv.data(), w.data(), qkv.data(), out.data(), lse.data());
  EXPECT_LT(fd_rel_error(loss, qkv, dqkv), kFdTolF64) << "B=" << p.B << " T=" << p.T << " dropout=" << p.dropout;
}

TEST_F(OpsFd, Attention) {
  struct Shape {
    int B, T, H, Dh;
    bool causal;
  };
  for (Shape s : {Shape{2, 7, 3, 5, true}, Shape{1, 1, 2, 4, true}, Shape{2, 6, 2, 3, false}})
    expect_attention_gradients({.B = s.B, .T = s.T, .H = s.H, .Dh = s.Dh, .causal = s.causal}, rng);
}

// The forward against the textbook formula with an explicit score matrix.
TEST_F(OpsFd, AttentionForwardMatchesExplicitSoftmax) {
  const int B = 1, T = 9, H = 2, Dh = 4, C = H * Dh;
  auto qkv = randn<double>(B * T * 3 * C, rng);
  std::vector<double> out = poisoned<double>(B * T * C), lse = poisoned<double>(B * H * T);
  attention_forward_ref<double>({.B = B, .T = T, .H = H, .Dh = Dh}, out.data(), lse.data(), qkv.data());
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < T; ++i) {
      std::vector<double> s(i + 1);
      double z = 0;
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < Dh; ++d) dot += qkv[i * 3 * C + h * Dh + d] * qkv[j * 3 * C + C + h * Dh + d];
        s[j] = std::exp(dot / std::sqrt(4.0));
        z += s[j];
      }
      EXPECT_NEAR(lse[h * T + i], std::log(z), 1e-12);
      for (int d = 0; d < Dh; ++d) {
        double o = 0;
        for (int j = 0; j <= i; ++j) o += s[j] / z * qkv[j * 3 * C + 2 * C + h * Dh + d];
        EXPECT_NEAR(out[i * C + h * Dh + d], o, 1e-12);
      }
    }
  }
}

// Attention dropout: the gradients of the dropped forward (the mask is a function of seed and stream, so the
// finite differences see the same one), causal and not.
TEST_F(OpsFd, AttentionWithDropout) {
  struct Shape {
    int B, T, H, Dh;
    bool causal;
  };
  for (Shape s : {Shape{2, 7, 3, 5, true}, Shape{2, 6, 2, 3, false}})
    expect_attention_gradients(
        {.B = s.B, .T = s.T, .H = s.H, .Dh = s.Dh, .causal = s.causal, .dropout = 0.3f, .seed = 11, .stream = 5}, rng);
}

// Attention dropout's draw for (query i, key j) of head bh, written out from attention_dropout.h's formula with the
// element-indexed philox_u16 (block b's word w, half s is element 8 b + 2 w + s), not with its helpers.
bool attention_keep_by_formula(uint64_t seed, uint64_t stream, float rate, uint64_t bh, int T, int i, int j) {
  const uint64_t g = (static_cast<uint64_t>(T) + 15) / 16, gi = 8 * g, gj = 4 * g;
  const uint64_t ii = 8 * static_cast<uint64_t>(i / 16) + i % 8, jj = 4 * static_cast<uint64_t>(j / 16) + (j / 2) % 4;
  const uint64_t block = (bh * gi + ii) * gj + jj;
  const int word = 2 * ((i / 8) % 2) + (j / 8) % 2, half = j % 2;
  return philox_u16(seed, stream, 8 * block + 2 * word + half) / 65536.0 >= rate;
}

// The dropped forward against the textbook formula: O_i = sum_j softmax(S)_ij Z_ij v_j, with Z drawn as
// attention_dropout.h lays the draws out; lse stays the undropped one; the kept share is near 1 - p; no two scores
// of a head share a draw; and dropout 0 is the plain forward, bit for bit. T = 40: 16-row groups, one partial.
TEST_F(OpsFd, AttentionDropoutDropsTheDrawnElements) {
  const int B = 2, T = 40, H = 2, Dh = 4, C = H * Dh;
  const float rate = 0.25f;
  const AttentionParams p{.B = B, .T = T, .H = H, .Dh = Dh, .causal = false, .dropout = rate, .seed = 3, .stream = 9};
  auto qkv = randn<double>(B * T * 3 * C, rng);
  std::vector<double> out = poisoned<double>(B * T * C), lse = poisoned<double>(B * H * T);
  attention_forward_ref<double>(p, out.data(), lse.data(), qkv.data());
  long kept = 0;
  std::set<uint64_t> draws;  // (block, word, half) of every score: all distinct
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const uint64_t bh = static_cast<uint64_t>(b) * H + h;
        const double* q = &qkv[(b * T + i) * 3 * C + h * Dh];
        std::vector<double> e(T);
        double z = 0;
        for (int j = 0; j < T; ++j) {
          double dot = 0;
          for (int d = 0; d < Dh; ++d) dot += q[d] * qkv[(b * T + j) * 3 * C + C + h * Dh + d];
          e[j] = std::exp(dot / 2.0);
          z += e[j];
        }
        EXPECT_NEAR(lse[(b * H + h) * T + i], std::log(z), 1e-12);
        for (int d = 0; d < Dh; ++d) {
          double o = 0;
          for (int j = 0; j < T; ++j)
            if (attention_keep_by_formula(p.seed, p.stream, rate, bh, T, i, j))
              o += e[j] / z / (1.0 - rate) * qkv[(b * T + j) * 3 * C + 2 * C + h * Dh + d];
          EXPECT_NEAR(out[(b * T + i) * C + h * Dh + d], o, 1e-12);
        }
        for (int j = 0; j < T; ++j) {
          kept += attention_keep_by_formula(p.seed, p.stream, rate, bh, T, i, j);
          const uint64_t g = (T + 15) / 16;
          const uint64_t block = (bh * 8 * g + 8 * (i / 16) + i % 8) * 4 * g + 4 * (j / 16) + (j / 2) % 4;
          draws.insert(8 * block + 2 * (2 * ((i / 8) % 2) + (j / 8) % 2) + j % 2);
        }
      }
  const double n = static_cast<double>(B) * H * T * T, share = kept / n;
  EXPECT_NEAR(share, 1.0 - rate, 4.0 * std::sqrt(rate * (1.0 - rate) / n));  // 6400 draws: within 4 sigma
  EXPECT_EQ(draws.size(), static_cast<size_t>(n));

  AttentionParams none = p;
  none.dropout = 0.0f;
  std::vector<double> plain = poisoned<double>(out.size()), plain_lse = poisoned<double>(lse.size());
  std::vector<double> zero = poisoned<double>(out.size()), zero_lse = poisoned<double>(lse.size());
  attention_forward_ref<double>({.B = B, .T = T, .H = H, .Dh = Dh, .causal = false}, plain.data(), plain_lse.data(),
                                qkv.data());
  attention_forward_ref<double>(none, zero.data(), zero_lse.data(), qkv.data());
  EXPECT_EQ(plain, zero);
  EXPECT_NE(plain, out);
}

// Dropout outside [0, 1) is refused by every backend; inside it the CPU and the CUDA kernels take it, and the naive
// path (the yardstick of the flash tests) refuses it in one line that says why.
TEST_F(OpsFd, AttentionDropoutOutsideItsRangeIsRefused) {
  std::string why;
  std::vector<Device> devices = {Device::cpu()};
  if (built_with_cuda()) devices.push_back(Device::cuda(0));
  for (float bad : {-0.1f, 1.0f, NAN})
    for (Device dev : devices) {
      const AttentionParams p{.B = 1, .T = 4, .H = 1, .Dh = 8, .dropout = bad};
      EXPECT_FALSE(attention_supports(p, DType::F32, dev, &why)) << bad;
      EXPECT_NE(why.find("attention dropout must be in [0, 1)"), std::string::npos) << why;
    }
  const AttentionParams p{.B = 1, .T = 4, .H = 1, .Dh = 8, .dropout = 0.1f};
  EXPECT_TRUE(attention_supports(p, DType::F32, Device::cpu(), &why)) << why;
  if (built_with_cuda()) {
    EXPECT_TRUE(attention_supports(p, DType::BF16, Device::cuda(0), &why)) << why;
  }
  EXPECT_FALSE(attention_naive_supports(p, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("no attention dropout"), std::string::npos) << why;
}

TEST_F(OpsFd, Rope) {
  const RopeParams p{.B = 2, .T = 5, .H = 3, .Dh = 6, .theta = 10000.0f, .pos_offset = 1};
  const int C = p.H * p.Dh;
  auto qkv = randn<double>(p.B * p.T * 3 * C, rng);
  const auto w = randn<double>(qkv.size(), rng);
  auto loss = [&] {
    std::vector<double> y = qkv;
    rope_forward_ref(p, y.data());
    return weighted_sum(y, w);
  };
  std::vector<double> d = w;
  rope_backward_ref(p, d.data());
  EXPECT_LT(fd_rel_error(loss, qkv, d), kFdTolF64);
  // v is untouched, and a rotation keeps the norm of every head.
  std::vector<double> y = qkv;
  rope_forward_ref(p, y.data());
  for (int r = 0; r < p.B * p.T; ++r)
    for (int c = 2 * C; c < 3 * C; ++c) EXPECT_EQ(y[r * 3 * C + c], qkv[r * 3 * C + c]);
  EXPECT_NEAR(weighted_sum(y, y), weighted_sum(qkv, qkv), 1e-9);
}

// Attention with RoPE through the Tensor-level entries (the model's path): the forward rotates q and k of qkv in
// place and attends over them; the backward's d_qkv is the gradient with respect to q and k before the rotation.
// Finite differences of the whole (rotation, then attention), each evaluation from a fresh copy; and the forward's
// qkv afterwards is rope_forward's, v untouched.
TEST_F(OpsFd, AttentionWithRope) {
  Context ctx;
  for (const AttentionParams& p :
       {AttentionParams{.B = 2, .T = 6, .H = 2, .Dh = 6, .causal = true, .rope_theta = 10000.0f},
        AttentionParams{.B = 1,
        .T = 5,
        .H = 3,
        .Dh = 4,
        .causal = false,
        .dropout = 0.3f,
        .seed = 4,
        .stream = 2,
        .rope_theta = 500.0f,
        .rope_pos_offset = 7}}) {
    const int C = p.H * p.Dh;
    const int64_t N = int64_t{p.B} * p.T;
    std::vector<double> x = randn<double>(N * 3 * C, rng);  // the point finite differences move
    const auto w = randn<double>(N * C, rng);
    std::vector<double> qkv(x.size()), out(N * C), lse(N * p.H), d_qkv = poisoned<double>(x.size());
    const Tensor tqkv(qkv.data(), DType::F64, {N * 3 * C}), tout(out.data(), DType::F64, {N * C});
    const Tensor tlse(lse.data(), DType::F64, {N * p.H}), tdqkv(d_qkv.data(), DType::F64, {N * 3 * C});
    auto w_copy = w;
    const Tensor tw(w_copy.data(), DType::F64, {N * C});
    auto loss = [&] {
      qkv = x;
      attention_forward(p, tout, tlse, tqkv, ctx);
      return weighted_sum(out, w);
    };
    loss();
    std::vector<double> rotated = x;
    rope_forward_ref(attention_rope(p), rotated.data());
    EXPECT_EQ(qkv, rotated) << "the forward leaves qkv rotated (v untouched)";
    attention_backward(p, tdqkv, tw, tqkv, tout, tlse, ctx);
    EXPECT_LT(fd_rel_error(loss, x, d_qkv), kFdTolF64) << "T=" << p.T << " pos_offset=" << p.rope_pos_offset;
  }
  std::string why;
  for (float bad : {-1.0f, NAN, INFINITY}) {
    EXPECT_FALSE(
        attention_supports({.B = 1, .T = 4, .H = 1, .Dh = 8, .rope_theta = bad}, DType::F32, Device::cpu(), &why));
    EXPECT_NE(why.find("rope_theta >= 0 and finite"), std::string::npos) << why;
  }
  // The GPU's cos / sin table covers 2^22 positions; the CPU computes each angle.
  const AttentionParams far{.B = 1, .T = 4, .H = 1, .Dh = 8, .rope_theta = 1e4f, .rope_pos_offset = (1 << 22) - 3};
  EXPECT_TRUE(attention_supports(far, DType::F32, Device::cpu(), &why)) << why;
  if (built_with_cuda()) {
    EXPECT_FALSE(attention_supports(far, DType::BF16, Device::cuda(0), &why));
    EXPECT_NE(why.find("positions up to 4194304"), std::string::npos) << why;
  }
  EXPECT_FALSE(
      attention_naive_supports({.B = 1, .T = 4, .H = 1, .Dh = 8, .rope_theta = 1e4f}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("no RoPE"), std::string::npos) << why;
}

// The rotation itself, against its definition (the finite-difference check above holds for any rotation the
// forward and backward share): head element i < Dh/2 of q and k at sequence position pos_offset + t pairs with
// i + Dh/2 and turns by the angle (pos_offset + t) / theta^(2i/Dh).
TEST_F(OpsFd, RopeAnglesArePositionOverThetaPower) {
  const RopeParams p{.B = 2, .T = 4, .H = 2, .Dh = 8, .theta = 10000.0f, .pos_offset = 3};
  const int C = p.H * p.Dh, half = p.Dh / 2;
  const auto qkv = randn<double>(p.B * p.T * 3 * C, rng);
  std::vector<double> y = qkv;
  rope_forward_ref(p, y.data());
  for (int b = 0; b < p.B; ++b)
    for (int t = 0; t < p.T; ++t)
      for (int part = 0; part < 2; ++part)
        for (int h = 0; h < p.H; ++h)
          for (int i = 0; i < half; ++i) {
            const size_t at = (static_cast<size_t>(b) * p.T + t) * 3 * C + part * C + h * p.Dh + i;
            const double angle = (p.pos_offset + t) / std::pow(10000.0, 2.0 * i / p.Dh);
            EXPECT_NEAR(y[at], qkv[at] * std::cos(angle) - qkv[at + half] * std::sin(angle), 1e-12);
            EXPECT_NEAR(y[at + half], qkv[at + half] * std::cos(angle) + qkv[at] * std::sin(angle), 1e-12);
          }
}

TEST_F(OpsFd, Activations) {
  for (Activation kind : {Activation::Gelu, Activation::Relu, Activation::Swiglu, Activation::GeluErf}) {
    for (bool with_bias : {true, false}) {
      // With a bias: output dropout on too (the same mask in the forward and the backward).
      const ActivationParams p{
          .N = 3, .d_ff = 7, .kind = kind, .dropout = with_bias ? 0.3f : 0.0f, .seed = 5, .stream = 2};
      const int in_w = kind == Activation::Swiglu ? 2 * p.d_ff : p.d_ff;
      auto in = randn<double>(p.N * in_w, rng), bias = randn<double>(in_w, rng);
      const auto w = randn<double>(p.N * p.d_ff, rng);
      auto loss = [&] {
        auto out = poisoned<double>(w.size());
        activation_forward_ref(p, out.data(), in.data(), with_bias ? bias.data() : nullptr);
        return weighted_sum(out, w);
      };
      const auto d_b_pre = prefilled<double>(in_w, rng);
      auto d_in = poisoned<double>(in.size()), d_b = d_b_pre;
      activation_backward_ref(p, d_in.data(), with_bias ? d_b.data() : nullptr, w.data(), in.data(),
                              with_bias ? bias.data() : nullptr);
      EXPECT_LT(fd_rel_error(loss, in, d_in), kFdTolF64) << activation_name(kind);
      if (with_bias) {
        EXPECT_LT(fd_rel_error(loss, bias, added(d_b, d_b_pre)), kFdTolF64) << activation_name(kind);
      }
    }
  }
}

TEST_F(OpsFd, GeluMatchesTanhFormula) {
  std::vector<double> x{-3.0, -0.5, 0.0, 0.7, 2.0}, y = poisoned<double>(5);
  activation_forward_ref<double>({.N = 1, .d_ff = 5, .kind = Activation::Gelu}, y.data(), x.data(), nullptr);
  // Values of 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) computed independently.
  const double expect[] = {-0.0036373920817729943, -0.15428599017485606, 0.0, 0.5305701347051167, 1.954597694087775};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], expect[i], 1e-12);
}

TEST_F(OpsFd, ResidualWithDropout) {
  for (float dropout : {0.0f, 0.4f}) {
    const ResidualParams p{.N = 6, .C = 5, .dropout = dropout, .seed = 7, .stream = 11};
    auto res = randn<double>(p.N * p.C, rng), x = randn<double>(p.N * p.C, rng), b = randn<double>(p.C, rng);
    const auto w = randn<double>(p.N * p.C, rng);
    auto loss = [&] {
      auto out = poisoned<double>(w.size());
      residual_forward_ref(p, out.data(), res.data(), x.data(), b.data());
      return weighted_sum(out, w);
    };
    const auto db_pre = prefilled<double>(p.C, rng);
    auto dx = poisoned<double>(x.size()), db = db_pre;
    residual_backward_ref(p, dx.data(), db.data(), w.data());
    EXPECT_LT(fd_rel_error(loss, x, dx), kFdTolF64);
    EXPECT_LT(fd_rel_error(loss, b, added(db, db_pre)), kFdTolF64);
    EXPECT_LT(fd_rel_error(loss, res, w), kFdTolF64);  // d_residual = d_out
  }
}

// The norm backward fused with the residual add's, through the Tensor-level entry on the CPU: for
// loss = Σ W ⊙ norm(mid) + Σ V ⊙ mid, mid = r + Drop(y + b) (V: the gradient the residual stream's other reader
// sends back, which d_x holds before the call), d_x becomes the gradient of r and d_y, d_bias those of y and b.
// With dropout; LayerNorm with a bias and RMSNorm without.
TEST_F(OpsFd, NormResidualBackward) {
  Context cpu(Device::cpu());
  for (bool layernorm : {true, false}) {
    const int N = 5, C = 7;
    const NormParams np{.N = N, .C = C, .eps = 1e-5f};
    const ResidualParams rp{.N = N, .C = C, .dropout = 0.3f, .seed = 5, .stream = 3};
    auto r = randn<double>(N * C, rng), y = randn<double>(N * C, rng), b = randn<double>(C, rng);
    auto nw = randn<double>(C, rng), nb = randn<double>(C, rng);
    auto W = randn<double>(N * C, rng);
    const auto V = randn<double>(N * C, rng);
    std::vector<double> mid(N * C), mean(N), rstd(N);
    auto forward = [&] {
      residual_forward_ref(rp, mid.data(), r.data(), y.data(), b.data());
      auto out = poisoned<double>(W.size());
      if (layernorm) layernorm_forward_ref(np, out.data(), mean.data(), rstd.data(), mid.data(), nw.data(), nb.data());
      else rmsnorm_forward_ref(np, out.data(), rstd.data(), mid.data(), nw.data());
      return weighted_sum(out, W) + weighted_sum(mid, V);
    };
    forward();  // mid, mean, rstd of the point the gradients are taken at
    const auto dbias_pre = prefilled<double>(C, rng), dw_pre = prefilled<double>(C, rng);
    const auto db_pre = prefilled<double>(C, rng);
    auto dx = V, dbias = dbias_pre, dw = dw_pre, db = db_pre, dy = poisoned<double>(N * C);
    auto t = [](std::vector<double>& v) { return Tensor(v.data(), DType::F64, {static_cast<int64_t>(v.size())}); };
    norm_residual_backward(np, layernorm, t(dx), t(dw), layernorm ? t(db) : Tensor(), t(W), t(mid), t(nw),
                           layernorm ? t(mean) : Tensor(), t(rstd), {rp, t(dy), t(dbias)}, cpu);
    const char* what = layernorm ? "layernorm" : "rmsnorm";
    EXPECT_LT(fd_rel_error(forward, y, dy), kFdTolF64) << what;
    EXPECT_LT(fd_rel_error(forward, b, added(dbias, dbias_pre)), kFdTolF64) << what;
    EXPECT_LT(fd_rel_error(forward, r, dx), kFdTolF64) << what;
    EXPECT_LT(fd_rel_error(forward, nw, added(dw, dw_pre)), kFdTolF64) << what;
    // d_y in d_x's memory would read a d_x already overwritten: refused.
    EXPECT_THROW(norm_residual_backward(np, layernorm, t(dx), t(dw), layernorm ? t(db) : Tensor(), t(W), t(mid), t(nw),
                                        layernorm ? t(mean) : Tensor(), t(rstd), {rp, t(dx), t(dbias)}, cpu),
                 Error);
  }
}

// The residual add fused ahead of the norm, through the Tensor-level entry on the CPU: mid and the norm's outputs
// are the two references' bit for bit (the forward whose backward NormResidualBackward checks).
TEST_F(OpsFd, NormResidualForwardIsTheResidualThenTheNorm) {
  Context cpu(Device::cpu());
  for (bool layernorm : {true, false}) {
    const int N = 4, C = 9;
    const NormParams np{.N = N, .C = C, .eps = 1e-5f};
    const ResidualParams rp{.N = N, .C = C, .dropout = 0.25f, .seed = 9, .stream = 2};
    auto r = randn<double>(N * C, rng), y = randn<double>(N * C, rng), bias = randn<double>(C, rng);
    auto w = randn<double>(C, rng), b = randn<double>(C, rng);
    std::vector<double> mid(N * C), out(N * C), mean(N), rstd(N);
    residual_forward_ref(rp, mid.data(), r.data(), y.data(), bias.data());
    if (layernorm) layernorm_forward_ref(np, out.data(), mean.data(), rstd.data(), mid.data(), w.data(), b.data());
    else rmsnorm_forward_ref(np, out.data(), rstd.data(), mid.data(), w.data());
    auto got_mid = poisoned<double>(N * C), got_out = poisoned<double>(N * C);
    auto got_mean = poisoned<double>(N), got_rstd = poisoned<double>(N);
    auto t = [](std::vector<double>& v) { return Tensor(v.data(), DType::F64, {static_cast<int64_t>(v.size())}); };
    norm_residual_forward(np, layernorm, rp, t(got_mid), t(got_out), layernorm ? t(got_mean) : Tensor(), t(got_rstd),
                          t(r), t(y), t(bias), t(w), layernorm ? t(b) : Tensor(), cpu);
    EXPECT_EQ(got_mid, mid);
    EXPECT_EQ(got_out, out);
    EXPECT_EQ(got_rstd, rstd);
    if (layernorm) {
      EXPECT_EQ(got_mean, mean);
    }
    // mid over y, or out over mid (which the backward reads): refused.
    EXPECT_THROW(norm_residual_forward(np, layernorm, rp, t(y), t(got_out), layernorm ? t(got_mean) : Tensor(),
                                       t(got_rstd), t(r), t(y), t(bias), t(w), layernorm ? t(b) : Tensor(), cpu),
                 Error);
    EXPECT_THROW(norm_residual_forward(np, layernorm, rp, t(got_mid), t(got_mid), layernorm ? t(got_mean) : Tensor(),
                                       t(got_rstd), t(r), t(y), t(bias), t(w), layernorm ? t(b) : Tensor(), cpu),
                 Error);
  }
}

TEST_F(OpsFd, CrossEntropyLabelSmoothingAndIgnore) {
  const CrossEntropyParams p{.N = 6, .V = 9, .label_smoothing = 0.1f, .ignore_index = -100};
  auto logits = randn<double>(p.N * p.V, rng, 2.0);
  auto targets = test::randint(p.N, p.V, rng);
  targets[2] = -100;
  std::vector<double> losses(p.N), lse(p.N);
  long count = 0;
  auto loss = [&] {
    losses = poisoned<double>(p.N);
    lse = poisoned<double>(p.N);
    count = cross_entropy_forward_ref(p, losses.data(), lse.data(), logits.data(), targets.data());
    double s = 0;
    for (double l : losses) s += l;
    return s / count;
  };
  const double mean = loss();
  EXPECT_EQ(count, 5);
  std::vector<double> d = poisoned<double>(logits.size());
  cross_entropy_backward_ref(p, d.data(), logits.data(), lse.data(), targets.data(), 1.0 / count);
  EXPECT_LT(fd_rel_error(loss, logits, d), kFdTolF64);
  // Value: -Σ_j p_j log q_j with p = (1 - eps) onehot + eps / V, computed from the definition.
  double expect = 0;
  for (int n = 0; n < p.N; ++n) {
    if (targets[n] == -100) continue;
    double z = 0;
    for (int j = 0; j < p.V; ++j) z += std::exp(logits[n * p.V + j]);
    for (int j = 0; j < p.V; ++j) {
      const double eps = p.label_smoothing;
      const double pj = (j == targets[n] ? 1.0 - eps : 0.0) + eps / p.V;
      expect -= pj * std::log(std::exp(logits[n * p.V + j]) / z);
    }
  }
  EXPECT_NEAR(mean, expect / count, 1e-12);
  for (int j = 0; j < p.V; ++j) EXPECT_EQ(d[2 * p.V + j], 0.0);
  // Each counted row of q - p sums to zero.
  double row = 0;
  for (int j = 0; j < p.V; ++j) row += d[j];
  EXPECT_NEAR(row, 0.0, 1e-15);
}

}  // namespace
}  // namespace tessera
