// The general attention entry (separate strided q, k, v; Tq != Tk; grouped KV heads; causal offset; key lengths)
// and the packed call with grouped KV heads, on the CPU reference: fp64 finite differences of every input, and
// identities that tie each new case to an old one (GQA = MHA over repeated K / V, key lengths = shorter keys,
// q_offset = the tail of a longer causal call, packed = general over views of qkv).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_naive.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::fd_rel_error;
using test::kFdTolF64;
using test::poisoned;
using test::randn;

// One (B, T, heads, Dh) argument held inside a larger buffer: rows padded by 3 elements, sequences by 5, so that
// the entries must honour the strides; the padding holds a sentinel that no call may change.
struct Strided {
  int B = 0, T = 0, heads = 0, Dh = 0;
  int64_t st = 0, sb = 0;
  std::vector<double> buf;
  static constexpr double kSentinel = 12345.0;

  Strided(int B_, int T_, int heads_, int Dh_) : B(B_), T(T_), heads(heads_), Dh(Dh_) {
    st = static_cast<int64_t>(heads) * Dh + 3;
    sb = T * st + 5;
    buf.assign(static_cast<size_t>(B * sb + 1), kSentinel);
  }
  int64_t numel() const { return static_cast<int64_t>(B) * T * heads * Dh; }
  double& at(int b, int t, int h, int d) { return buf[b * sb + t * st + static_cast<int64_t>(h) * Dh + d]; }
  Tensor tensor() { return Tensor::strided(buf.data(), DType::F64, {B, T, heads, Dh}, {sb, st, Dh, 1}); }
  // The logical elements, in (b, t, h, d) order.
  std::vector<double> values() {
    std::vector<double> v;
    for_each([&](double& x) { v.push_back(x); });
    return v;
  }
  void set(const std::vector<double>& v) {
    size_t i = 0;
    for_each([&](double& x) { x = v[i++]; });
  }
  void fill(double x) {
    for_each([&](double& e) { e = x; });
  }
  bool padding_intact() {
    std::vector<char> logical(buf.size(), 0);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < Dh; ++d) logical[&at(b, t, h, d) - buf.data()] = 1;
    for (size_t i = 0; i < buf.size(); ++i)
      if (!logical[i] && buf[i] != kSentinel) return false;
    return true;
  }
  template <typename F>
  void for_each(F&& f) {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < Dh; ++d) f(at(b, t, h, d));
  }
};

struct Case {
  const char* name;
  int B, Tq, Tk, H, Hkv, Dh;
  bool causal;
  int q_offset = 0;
  std::vector<int32_t> lens = {};
  float dropout = 0.0f;
};

std::string describe(const Case& c) {
  std::string s = std::string(c.name) + ": B=" + std::to_string(c.B) + " Tq=" + std::to_string(c.Tq) +
                  " Tk=" + std::to_string(c.Tk) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
                  " Dh=" + std::to_string(c.Dh) + (c.causal ? " causal" : " full") +
                  " q_offset=" + std::to_string(c.q_offset) + " dropout=" + std::to_string(c.dropout);
  if (!c.lens.empty()) {
    s += " lens=";
    for (int32_t l : c.lens) s += std::to_string(l) + ",";
  }
  return s;
}

// The general call's buffers and its forward / backward through the Tensor entries, on the CPU in fp64.
struct General {
  Case c;
  AttentionParams p;
  std::vector<int32_t> lens;
  Strided q, k, v, out, d_out, dq, dk, dv;
  std::vector<double> lse;
  Context ctx;

  General(const Case& c_, std::mt19937_64& rng)
      : c(c_), lens(c_.lens), q(c.B, c.Tq, c.H, c.Dh), k(c.B, c.Tk, c.Hkv, c.Dh), v(c.B, c.Tk, c.Hkv, c.Dh),
        out(c.B, c.Tq, c.H, c.Dh), d_out(c.B, c.Tq, c.H, c.Dh), dq(c.B, c.Tq, c.H, c.Dh), dk(c.B, c.Tk, c.Hkv, c.Dh),
        dv(c.B, c.Tk, c.Hkv, c.Dh), lse(static_cast<size_t>(c.B) * c.H * c.Tq) {
    p = {.B = c.B,
         .T = c.Tq,
         .H = c.H,
         .Dh = c.Dh,
         .causal = c.causal,
         .dropout = c.dropout,
         .seed = 21,
         .stream = 3,
         .n_kv_heads = c.Hkv,
         .Tq = c.Tq,
         .Tk = c.Tk,
         .q_offset = c.q_offset};
    if (!lens.empty()) p.key_lens = Tensor(lens.data(), DType::I32, {c.B});
    for (Strided* s : {&q, &k, &v, &d_out}) s->set(randn<double>(s->numel(), rng));
  }
  void forward() {
    out.fill(std::numeric_limits<double>::quiet_NaN());
    lse = poisoned<double>(lse.size());
    attention_forward(p, out.tensor(), Tensor(lse.data(), DType::F64, {static_cast<int64_t>(lse.size())}), q.tensor(),
                      k.tensor(), v.tensor(), ctx);
  }
  void backward() {
    for (Strided* s : {&dq, &dk, &dv}) s->fill(std::numeric_limits<double>::quiet_NaN());
    attention_backward(p, dq.tensor(), dk.tensor(), dv.tensor(), d_out.tensor(), q.tensor(), k.tensor(), v.tensor(),
                       out.tensor(), Tensor(lse.data(), DType::F64, {static_cast<int64_t>(lse.size())}), ctx);
  }
  // Σ d_out ∘ out: its gradients are the backward's outputs.
  double loss() {
    forward();
    const auto o = out.values(), w = d_out.values();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
    return s;
  }
};

std::vector<Case> awkward_cases() {
  return {
      {"cross, GQA", 2, 5, 7, 4, 2, 3, false},
      {"cross, MQA, key lengths", 2, 4, 6, 3, 1, 5, false, 0, {6, 3}},
      {"causal offset, GQA", 2, 3, 8, 4, 2, 4, true, 5},
      {"causal offset, key lengths", 2, 4, 6, 2, 2, 3, true, 1, {5, 2}},
      {"an empty sequence", 2, 3, 5, 2, 1, 4, false, 0, {0, 4}},
      {"self, GQA, causal", 1, 6, 6, 6, 3, 4, true},
      {"dropout, cross, GQA, causal offset", 2, 4, 9, 4, 2, 3, true, 4, {9, 7}, 0.3f},
  };
}

class AttentionGeneral : public ::testing::Test {
 protected:
  std::mt19937_64 rng{test::test_seed()};
  void SetUp() override { RecordProperty("seed", std::to_string(test::test_seed())); }
};

// dQ, dK and dV of the reference (through the strided Tensor entries) against central differences.
TEST_F(AttentionGeneral, GradientsMatchFiniteDifferences) {
  for (const Case& c : awkward_cases()) {
    General g(c, rng);
    g.loss();
    g.backward();
    for (auto [x, dx, name] :
         {std::tuple{&g.q, &g.dq, "dq"}, std::tuple{&g.k, &g.dk, "dk"}, std::tuple{&g.v, &g.dv, "dv"}}) {
      std::vector<double> point = x->values();
      auto loss = [&] {
        x->set(point);
        return g.loss();
      };
      EXPECT_LT(fd_rel_error(loss, point, dx->values()), kFdTolF64) << describe(c) << " " << name;
      x->set(point);
    }
    for (Strided* s : {&g.out, &g.dq, &g.dk, &g.dv}) EXPECT_TRUE(s->padding_intact()) << describe(c);
  }
}

// Grouped KV heads are multi-head attention over K and V repeated to H heads (head h reads KV head h / (H/Hkv)),
// with each KV head's dK / dV the sum over its group.
TEST_F(AttentionGeneral, GqaIsMhaOverRepeatedKv) {
  for (const Case& c : {Case{"GQA", 2, 5, 7, 6, 2, 3, false, 0, {7, 4}}, Case{"MQA", 1, 4, 4, 3, 1, 4, true},
                        Case{"GQA dropout", 2, 3, 5, 4, 2, 2, true, 2, {}, 0.2f}}) {
    General gqa(c, rng);
    Case m = c;
    m.Hkv = c.H;
    General mha(m, rng);
    mha.q.set(gqa.q.values());
    mha.d_out.set(gqa.d_out.values());
    const int group = c.H / c.Hkv;
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.Tk; ++t)
        for (int h = 0; h < c.H; ++h)
          for (int d = 0; d < c.Dh; ++d) {
            mha.k.at(b, t, h, d) = gqa.k.at(b, t, h / group, d);
            mha.v.at(b, t, h, d) = gqa.v.at(b, t, h / group, d);
          }
    for (General* g : {&gqa, &mha}) g->forward(), g->backward();
    EXPECT_EQ(gqa.out.values(), mha.out.values()) << describe(c);
    EXPECT_EQ(gqa.lse, mha.lse) << describe(c);
    EXPECT_EQ(gqa.dq.values(), mha.dq.values()) << describe(c);
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.Tk; ++t)
        for (int g = 0; g < c.Hkv; ++g)
          for (int d = 0; d < c.Dh; ++d) {
            double sk = 0, sv = 0;
            for (int h = g * group; h < (g + 1) * group; ++h) sk += mha.dk.at(b, t, h, d), sv += mha.dv.at(b, t, h, d);
            EXPECT_NEAR(gqa.dk.at(b, t, g, d), sk, 1e-12) << describe(c);
            EXPECT_NEAR(gqa.dv.at(b, t, g, d), sv, 1e-12) << describe(c);
          }
  }
}

// Key length L of a sequence is that sequence attending over its first L keys alone; the masked keys get zero
// gradients. A sequence of length 0 has out = 0, lse = +inf and zero gradients (attention.h's convention).
TEST_F(AttentionGeneral, KeyLengthsAreShorterKeys) {
  const Case c{"key lengths", 3, 4, 6, 4, 2, 3, false, 0, {6, 2, 0}};
  General g(c, rng);
  g.forward();
  g.backward();
  for (int b = 0; b < c.B; ++b) {
    const int L = c.lens[b];
    if (L == 0) {
      for (int i = 0; i < c.Tq; ++i)
        for (int h = 0; h < c.H; ++h) {
          EXPECT_EQ(g.lse[(b * c.H + h) * c.Tq + i], std::numeric_limits<double>::infinity());
          for (int d = 0; d < c.Dh; ++d) {
            EXPECT_EQ(g.out.at(b, i, h, d), 0.0);
            EXPECT_EQ(g.dq.at(b, i, h, d), 0.0);
          }
        }
    } else {
      General one({"one sequence", 1, c.Tq, L, c.H, c.Hkv, c.Dh, false}, rng);
      for (auto [dst, src] :
           {std::pair{&one.q, &g.q}, std::pair{&one.k, &g.k}, std::pair{&one.v, &g.v}, std::pair{&one.d_out, &g.d_out}})
        for (int t = 0; t < dst->T; ++t)
          for (int h = 0; h < dst->heads; ++h)
            for (int d = 0; d < c.Dh; ++d) dst->at(0, t, h, d) = src->at(b, t, h, d);
      one.forward();
      one.backward();
      for (int i = 0; i < c.Tq; ++i)
        for (int h = 0; h < c.H; ++h)
          for (int d = 0; d < c.Dh; ++d) {
            EXPECT_EQ(g.out.at(b, i, h, d), one.out.at(0, i, h, d)) << "b=" << b;
            EXPECT_EQ(g.dq.at(b, i, h, d), one.dq.at(0, i, h, d)) << "b=" << b;
          }
      for (int j = 0; j < L; ++j)
        for (int h = 0; h < c.Hkv; ++h)
          for (int d = 0; d < c.Dh; ++d) {
            EXPECT_EQ(g.dk.at(b, j, h, d), one.dk.at(0, j, h, d)) << "b=" << b;
            EXPECT_EQ(g.dv.at(b, j, h, d), one.dv.at(0, j, h, d)) << "b=" << b;
          }
    }
    for (int j = L; j < c.Tk; ++j)
      for (int h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.Dh; ++d) {
          EXPECT_EQ(g.dk.at(b, j, h, d), 0.0);
          EXPECT_EQ(g.dv.at(b, j, h, d), 0.0);
        }
  }
}

// Causal queries at offset Tk - Tq are the last Tq rows of the causal call whose queries cover every key.
TEST_F(AttentionGeneral, CausalOffsetIsTheTailOfTheFullCall) {
  const int B = 2, Tq = 3, Tk = 7, H = 4, Hkv = 2, Dh = 5;
  General tail({"tail", B, Tq, Tk, H, Hkv, Dh, true, Tk - Tq}, rng);
  General full({"full", B, Tk, Tk, H, Hkv, Dh, true}, rng);
  full.k.set(tail.k.values());
  full.v.set(tail.v.values());
  full.d_out.fill(0.0);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Tq; ++i)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < Dh; ++d) {
          full.q.at(b, Tk - Tq + i, h, d) = tail.q.at(b, i, h, d);
          full.d_out.at(b, Tk - Tq + i, h, d) = tail.d_out.at(b, i, h, d);
        }
  for (General* g : {&tail, &full}) g->forward(), g->backward();
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Tq; ++i)
      for (int h = 0; h < H; ++h) {
        EXPECT_EQ(tail.lse[(b * H + h) * Tq + i], full.lse[(b * H + h) * Tk + Tk - Tq + i]);
        for (int d = 0; d < Dh; ++d) {
          EXPECT_EQ(tail.out.at(b, i, h, d), full.out.at(b, Tk - Tq + i, h, d));
          EXPECT_EQ(tail.dq.at(b, i, h, d), full.dq.at(b, Tk - Tq + i, h, d));
        }
      }
  // The full call's other queries have d_out = 0, so its dK / dV come from the tail's queries alone.
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < Tk; ++j)
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < Dh; ++d) {
          EXPECT_NEAR(tail.dk.at(b, j, h, d), full.dk.at(b, j, h, d), 1e-13);
          EXPECT_NEAR(tail.dv.at(b, j, h, d), full.dv.at(b, j, h, d), 1e-13);
        }
}

// The packed call with grouped KV heads is the general call over views of its qkv rows [q | k | v], RoPE
// included (q and k at the same positions); its d_qkv holds the general call's dq, dk and dv.
TEST_F(AttentionGeneral, PackedGqaIsTheGeneralCallOverViews) {
  Context ctx;
  for (float theta : {0.0f, 1000.0f}) {
    const int B = 2, T = 5, H = 6, Hkv = 2, Dh = 4;
    const int64_t W = (H + 2 * Hkv) * Dh, N = int64_t{B} * T, C = H * Dh;
    const AttentionParams p{.B = B,
                            .T = T,
                            .H = H,
                            .Dh = Dh,
                            .causal = true,
                            .dropout = 0.25f,
                            .seed = 8,
                            .stream = 1,
                            .rope_theta = theta,
                            .rope_pos_offset = 3,
                            .n_kv_heads = Hkv};
    const std::vector<double> x = randn<double>(N * W, rng), w = randn<double>(N * C, rng);
    std::vector<double> qkv = x, out = poisoned<double>(N * C), lse = poisoned<double>(N * H);
    std::vector<double> d_qkv = poisoned<double>(N * W), w_copy = w;
    const Tensor tqkv(qkv.data(), DType::F64, {N * W}), tout(out.data(), DType::F64, {N * C});
    const Tensor tlse(lse.data(), DType::F64, {N * H}), tw(w_copy.data(), DType::F64, {N * C});
    attention_forward(p, tout, tlse, tqkv, ctx);
    attention_backward(p, Tensor(d_qkv.data(), DType::F64, {N * W}), tw, tqkv, tout, tlse, ctx);

    std::vector<double> g_qkv = x, g_out = poisoned<double>(N * C), g_lse = poisoned<double>(N * H);
    std::vector<double> g_d = poisoned<double>(N * W);
    auto view = [&](std::vector<double>& buf, int64_t col, int heads) {
      return Tensor::strided(buf.data() + col, DType::F64, {B, T, heads, Dh}, {T * W, W, Dh, 1});
    };
    const Tensor o4 = Tensor::strided(g_out.data(), DType::F64, {B, T, H, Dh}, {T * C, C, Dh, 1});
    const Tensor w4 = Tensor::strided(w_copy.data(), DType::F64, {B, T, H, Dh}, {T * C, C, Dh, 1});
    const Tensor l(g_lse.data(), DType::F64, {N * H});
    attention_forward(p, o4, l, view(g_qkv, 0, H), view(g_qkv, C, Hkv), view(g_qkv, C + Hkv * Dh, Hkv), ctx);
    attention_backward(p, view(g_d, 0, H), view(g_d, C, Hkv), view(g_d, C + Hkv * Dh, Hkv), w4, view(g_qkv, 0, H),
                       view(g_qkv, C, Hkv), view(g_qkv, C + Hkv * Dh, Hkv), o4, l, ctx);
    EXPECT_EQ(out, g_out) << "theta=" << theta;
    EXPECT_EQ(lse, g_lse) << "theta=" << theta;
    EXPECT_EQ(qkv, g_qkv) << "both leave q and k rotated alike, theta=" << theta;
    EXPECT_EQ(d_qkv, g_d) << "theta=" << theta;
  }
}

// RoPE in the general call: q rotated at positions rope_pos_offset + q_offset + i, k at rope_pos_offset + j;
// finite differences through the rotation.
TEST_F(AttentionGeneral, RopeGradients) {
  General g({"rope", 2, 3, 6, 4, 2, 4, true, 2, {6, 5}}, rng);
  g.p.rope_theta = 500.0f;
  g.p.rope_pos_offset = 4;
  const std::vector<double> q0 = g.q.values(), k0 = g.k.values(), v0 = g.v.values();
  auto loss = [&] {
    g.q.set(q0), g.k.set(k0), g.v.set(v0);
    return g.loss();
  };
  loss();
  g.backward();
  for (auto [x, dx, point0, name] : {std::tuple{&g.q, &g.dq, &q0, "dq"}, std::tuple{&g.k, &g.dk, &k0, "dk"}}) {
    std::vector<double> point = *point0;
    auto moved = [&] {
      g.q.set(q0), g.k.set(k0), g.v.set(v0);
      x->set(point);
      return g.loss();
    };
    EXPECT_LT(fd_rel_error(moved, point, dx->values()), kFdTolF64) << name;
  }
}

TEST_F(AttentionGeneral, RefusesBadArguments) {
  std::string why;
  EXPECT_FALSE(attention_supports({.B = 1, .T = 4, .H = 6, .Dh = 8, .n_kv_heads = 4}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("n_kv_heads must divide"), std::string::npos) << why;
  EXPECT_FALSE(attention_supports({.B = 1, .T = 4, .H = 2, .Dh = 8, .q_offset = -1}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("q_offset >= 0"), std::string::npos) << why;
  EXPECT_FALSE(
      attention_naive_supports({.B = 1, .T = 4, .H = 2, .Dh = 8, .n_kv_heads = 1}, DType::F32, Device::cpu(), &why));

  General g({"checks", 2, 3, 4, 2, 1, 3, false, 0, {4, 5}}, rng);
  EXPECT_NE(test::error_of([&] { g.forward(); }).find("key_lens[1] = 5 is outside [0, 4]"), std::string::npos);
  g.lens = {4, 4};
  g.p.n_kv_heads = 2;
  EXPECT_NE(test::error_of([&] { g.forward(); }).find("k is (2, 4, 1, 3), expected (2, 4, 2, 3)"), std::string::npos);
  g.p.n_kv_heads = 1;
  g.p.Tq = 0;  // 0: T, which is 3 here: accepted
  EXPECT_EQ(test::error_of([&] { g.forward(); }), "");

  Context ctx;
  std::vector<double> buf(64);
  const Tensor t(buf.data(), DType::F64, {64});
  const AttentionParams cross{.B = 1, .T = 2, .H = 1, .Dh = 4, .Tk = 3};
  EXPECT_NE(test::error_of([&] { attention_forward(cross, t, t, t, ctx); }).find("packed qkv call has Tq = Tk"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
