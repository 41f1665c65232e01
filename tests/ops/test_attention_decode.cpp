// kv_append and attention_decode (attention_decode.h) on the CPU reference, through the Tensor entries: the cache
// after an append holds exactly the rotated new keys and values at the slots the table names (and nothing else
// changes), and the decode equals the general attention reference (attention_forward_ref with Tq, Tk, q_offset and
// grouped KV heads) over K and V gathered from the cache into plain tensors, rotated by rope_rotate_view_ref.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_decode.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::error_of;
using test::randn;
using test::rel_error;

struct DecodeCase {
  const char* name;
  int B, Tq, H, Hkv, Dh, max_seq;
  float rope_theta;
  bool use_slots;
  std::vector<int32_t> pos;
};

std::string describe(const DecodeCase& c) {
  std::string s = std::string(c.name) + ": B=" + std::to_string(c.B) + " Tq=" + std::to_string(c.Tq) +
                  " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) + " Dh=" + std::to_string(c.Dh) +
                  " max_seq=" + std::to_string(c.max_seq) + " theta=" + std::to_string(c.rope_theta) +
                  (c.use_slots ? " slots" : " no slots") + " pos=";
  for (int32_t x : c.pos) s += std::to_string(x) + ",";
  return s;
}

// Unequal positions (pos 0 among them, and a sequence that fills the cache to its last position), caches whose
// max_seq is a multiple of nothing in sight, grouped (Hkv 2), multi-query (Hkv 1) and plain (Hkv = H) heads.
std::vector<DecodeCase> awkward_cases() {
  return {
      {"GQA, RoPE, decode", 3, 1, 6, 2, 24, 37, 10000.0f, false, {0, 17, 36}},
      {"GQA, slots, prefill", 3, 3, 6, 2, 64, 29, 0.0f, true, {5, 0, 26}},
      {"MHA, RoPE, slots", 3, 3, 6, 6, 24, 41, 500.0f, true, {0, 38, 13}},
      {"MQA, RoPE, slots, decode", 3, 1, 6, 1, 64, 23, 10000.0f, true, {22, 0, 9}},
      {"MQA, prefill", 3, 3, 6, 1, 24, 19, 0.0f, false, {16, 3, 0}},
      {"MHA, RoPE, decode", 3, 1, 6, 6, 64, 31, 10000.0f, false, {30, 7, 1}},
  };
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::F64 : DType::F32;
}

// One call's buffers: q, k_new and v_new are slices of a fused (B, Tq, H + 2 Hkv, Dh) projection output; the
// cache has one spare slot beyond B (slots S = B + 1) and starts filled with random "earlier" keys and values.
template <typename T>
struct Decode {
  DecodeCase c;
  DecodeAttentionParams p;
  int64_t W = 0;
  std::vector<T> qkv, cache_k, cache_v, out;
  std::vector<int32_t> pos, slots;
  Context ctx;

  Decode(const DecodeCase& c_, std::mt19937_64& rng) : c(c_), pos(c_.pos) {
    p = {.B = c.B,
         .Tq = c.Tq,
         .H = c.H,
         .Hkv = c.Hkv,
         .Dh = c.Dh,
         .S = c.B + 1,
         .max_seq = c.max_seq,
         .rope_theta = c.rope_theta};
    W = static_cast<int64_t>(c.H + 2 * c.Hkv) * c.Dh;
    qkv = randn<T>(static_cast<size_t>(c.B * c.Tq * W), rng);
    const size_t cache_numel = static_cast<size_t>(p.S) * c.Hkv * c.max_seq * c.Dh;
    cache_k = randn<T>(cache_numel, rng);
    cache_v = randn<T>(cache_numel, rng);
    out = test::poisoned<T>(static_cast<size_t>(c.B) * c.Tq * c.H * c.Dh);
    if (c.use_slots) scatter_slots(rng);
  }

  // Positions before every sequence's pos are history that no call writes: any slot, shared between sequences
  // as beams share a prefix. From there on, each position's slots are a permutation over the sequences, so that
  // no two sequences write (or one writes where another reads) the same (slot, position).
  void scatter_slots(std::mt19937_64& rng) {
    slots.assign(static_cast<size_t>(c.B) * c.max_seq, -1);
    const int shared_end = *std::min_element(pos.begin(), pos.end());
    std::uniform_int_distribution<int> any(0, p.S - 1);
    std::vector<int> perm(p.S);
    for (int t = 0; t < c.max_seq; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int b = 0; b < c.B; ++b) slots[static_cast<size_t>(b) * c.max_seq + t] = t < shared_end ? any(rng) : perm[b];
    }
  }
  int slot(int b, int t) const { return slots.empty() ? b : slots[static_cast<size_t>(b) * c.max_seq + t]; }
  int64_t cache_at(int s, int g, int t) const { return ((static_cast<int64_t>(s) * c.Hkv + g) * c.max_seq + t) * c.Dh; }

  // (B, Tq, heads, Dh) slices of qkv: q at column 0, k_new at H Dh, v_new at (H + Hkv) Dh.
  Tensor slice(int64_t col, int heads) {
    return Tensor::strided(qkv.data() + col, dtype_of<T>(), {c.B, c.Tq, heads, c.Dh}, {c.Tq * W, W, c.Dh, 1});
  }
  Tensor q() { return slice(0, c.H); }
  Tensor k_new() { return slice(static_cast<int64_t>(c.H) * c.Dh, c.Hkv); }
  Tensor v_new() { return slice(static_cast<int64_t>(c.H + c.Hkv) * c.Dh, c.Hkv); }
  KvCacheView cache() {
    return {.k = Tensor(cache_k.data(), dtype_of<T>(), {p.S, c.Hkv, c.max_seq, c.Dh}),
            .v = Tensor(cache_v.data(), dtype_of<T>(), {p.S, c.Hkv, c.max_seq, c.Dh})};
  }
  Tensor pos_tensor() { return Tensor(pos.data(), DType::I32, {c.B}); }
  Tensor slots_tensor() { return slots.empty() ? Tensor() : Tensor(slots.data(), DType::I32, {c.B, c.max_seq}); }
  Tensor out_tensor() { return Tensor(out.data(), dtype_of<T>(), {c.B, c.Tq, c.H, c.Dh}); }

  void append() { kv_append(p, cache(), q(), k_new(), v_new(), pos_tensor(), slots_tensor(), ctx); }
  void decode() {
    std::fill(out.begin(), out.end(), std::numeric_limits<T>::quiet_NaN());
    attention_decode(p, out_tensor(), q(), cache(), pos_tensor(), slots_tensor(), ctx);
  }
};

// Heads [h0, h0 + heads) of every token of sequence b of the fused buffer, as a plain (1, Tq, heads, Dh) array,
// rotated at positions pos[b] + i when the case has RoPE.
template <typename T>
std::vector<T> rotated_part(const Decode<T>& d, const std::vector<T>& qkv, int b, int h0, int heads) {
  const DecodeCase& c = d.c;
  std::vector<T> x(static_cast<size_t>(c.Tq) * heads * c.Dh);
  for (int i = 0; i < c.Tq; ++i)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < c.Dh; ++e)
        x[(static_cast<size_t>(i) * heads + h) * c.Dh + e] = qkv[(b * c.Tq + i) * d.W + (h0 + h) * c.Dh + e];
  if (c.rope_theta > 0.0f) {
    const RopeParams r{.B = 1, .T = c.Tq, .H = heads, .Dh = c.Dh, .theta = c.rope_theta, .pos_offset = d.pos[b]};
    rope_rotate_view_ref<T>(r, heads, AttentionView<T>{x.data(), 0, static_cast<int64_t>(heads) * c.Dh, c.Dh}, 1.0);
  }
  return x;
}

// The cache after the append, built independently: the old cache with sequence b's token i written at
// (slot(b, pos[b] + i), g, pos[b] + i) as the rotated k_new (the plain v_new).
template <typename T>
void expected_cache(const Decode<T>& d, const std::vector<T>& qkv0, std::vector<T>& k, std::vector<T>& v) {
  const DecodeCase& c = d.c;
  for (int b = 0; b < c.B; ++b) {
    const std::vector<T> kr = rotated_part(d, qkv0, b, c.H, c.Hkv);
    for (int i = 0; i < c.Tq; ++i) {
      const int t = d.pos[b] + i;
      for (int g = 0; g < c.Hkv; ++g)
        for (int e = 0; e < c.Dh; ++e) {
          const int64_t at = d.cache_at(d.slot(b, t), g, t) + e;
          k[at] = kr[(static_cast<size_t>(i) * c.Hkv + g) * c.Dh + e];
          v[at] = qkv0[(b * c.Tq + i) * d.W + (c.H + c.Hkv + g) * c.Dh + e];
        }
    }
  }
}

// The decode's expectation: per sequence, the general reference with Tq queries at q_offset pos[b] against the
// Tk = pos[b] + Tq keys gathered from the expected cache through the slot table.
template <typename T>
std::vector<T> expected_out(const Decode<T>& d, const std::vector<T>& q_rot, const std::vector<T>& k,
                            const std::vector<T>& v) {
  const DecodeCase& c = d.c;
  const int64_t row = static_cast<int64_t>(c.H) * c.Dh, kv_row = static_cast<int64_t>(c.Hkv) * c.Dh;
  std::vector<T> out(static_cast<size_t>(c.B) * c.Tq * row);
  for (int b = 0; b < c.B; ++b) {
    const int Tk = d.pos[b] + c.Tq;
    std::vector<T> kb(static_cast<size_t>(Tk) * kv_row), vb(kb.size()), lse(static_cast<size_t>(c.H) * c.Tq);
    for (int t = 0; t < Tk; ++t)
      for (int g = 0; g < c.Hkv; ++g)
        for (int e = 0; e < c.Dh; ++e) {
          kb[t * kv_row + g * c.Dh + e] = k[d.cache_at(d.slot(b, t), g, t) + e];
          vb[t * kv_row + g * c.Dh + e] = v[d.cache_at(d.slot(b, t), g, t) + e];
        }
    const AttentionParams ap{.B = 1,
                             .T = c.Tq,
                             .H = c.H,
                             .Dh = c.Dh,
                             .causal = true,
                             .n_kv_heads = c.Hkv,
                             .Tq = c.Tq,
                             .Tk = Tk,
                             .q_offset = d.pos[b]};
    const T* qb = q_rot.data() + static_cast<size_t>(b) * c.Tq * row;
    attention_forward_ref<T>(ap, AttentionView<T>{out.data() + b * c.Tq * row, 0, row, c.Dh}, lse.data(),
                             AttentionView<const T>{qb, 0, row, c.Dh},
                             AttentionView<const T>{kb.data(), 0, kv_row, c.Dh},
                             AttentionView<const T>{vb.data(), 0, kv_row, c.Dh});
  }
  return out;
}

template <typename T>
void check_against_general_reference(const DecodeCase& c, std::mt19937_64& rng, double tol) {
  Decode<T> d(c, rng);
  const std::vector<T> qkv0 = d.qkv;
  std::vector<T> k = d.cache_k, v = d.cache_v;
  expected_cache(d, qkv0, k, v);
  std::vector<T> q_rot;
  for (int b = 0; b < c.B; ++b) {
    const std::vector<T> qb = rotated_part(d, qkv0, b, 0, c.H);
    q_rot.insert(q_rot.end(), qb.begin(), qb.end());
  }
  d.append();
  // The append writes exactly the expected cache (the same f64 rotation, so bit for bit) and rotates q in place;
  // k_new and v_new are left as they were.
  EXPECT_EQ(d.cache_k, k) << describe(c);
  EXPECT_EQ(d.cache_v, v) << describe(c);
  std::vector<T> qkv_expected = qkv0;
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < c.Tq; ++i)
      for (int e = 0; e < c.H * c.Dh; ++e)
        qkv_expected[(b * c.Tq + i) * d.W + e] = q_rot[(static_cast<size_t>(b) * c.Tq + i) * c.H * c.Dh + e];
  EXPECT_EQ(d.qkv, qkv_expected) << describe(c);

  d.decode();
  const std::vector<T> want = expected_out(d, q_rot, k, v);
  EXPECT_LT(rel_error(d.out, want), tol) << describe(c);
}

class AttentionDecode : public ::testing::Test {
 protected:
  std::mt19937_64 rng{test::test_seed()};
  void SetUp() override { RecordProperty("seed", std::to_string(test::test_seed())); }
};

TEST_F(AttentionDecode, MatchesGeneralReferenceOverGatheredCacheF64) {
  for (const DecodeCase& c : awkward_cases()) check_against_general_reference<double>(c, rng, 1e-12);
}

TEST_F(AttentionDecode, MatchesGeneralReferenceOverGatheredCacheF32) {
  for (const DecodeCase& c : awkward_cases()) check_against_general_reference<float>(c, rng, test::kRefTolF32);
}

// Appending Tq tokens one call at a time (Tq = 1, pos advancing) leaves the cache and the rotated queries exactly
// as one append of all of them, and decode step j equals query j of the one Tq-query decode (causal), bit for bit.
TEST_F(AttentionDecode, TokenByTokenEqualsOneAppend) {
  for (const DecodeCase& c0 : awkward_cases()) {
    DecodeCase c = c0;
    c.Tq = 3;
    for (int32_t& x : c.pos) x = std::min(x, c.max_seq - c.Tq);
    Decode<double> all(c, rng);
    DecodeCase c1 = c;
    c1.Tq = 1;
    Decode<double> one(c1, rng);
    one.cache_k = all.cache_k, one.cache_v = all.cache_v, one.slots = all.slots;
    const std::vector<double> qkv0 = all.qkv;
    all.append();
    all.decode();
    const int64_t W = all.W, row = static_cast<int64_t>(c.H) * c.Dh;
    for (int j = 0; j < c.Tq; ++j) {
      for (int b = 0; b < c.B; ++b) {
        one.pos[b] = c.pos[b] + j;
        std::copy_n(&qkv0[(b * c.Tq + j) * W], W, &one.qkv[b * W]);
      }
      one.append();
      one.decode();
      for (int b = 0; b < c.B; ++b) {
        const auto at_all = all.qkv.begin() + (b * c.Tq + j) * W, at_one = one.qkv.begin() + b * W;
        EXPECT_TRUE(std::equal(at_one, at_one + row, at_all)) << describe(c) << " q, token " << j << " seq " << b;
        const auto out_all = all.out.begin() + (b * c.Tq + j) * row, out_one = one.out.begin() + b * row;
        EXPECT_TRUE(std::equal(out_one, out_one + row, out_all)) << describe(c) << " out, token " << j << " seq " << b;
      }
    }
    EXPECT_EQ(one.cache_k, all.cache_k) << describe(c);
    EXPECT_EQ(one.cache_v, all.cache_v) << describe(c);
  }
}

::testing::AssertionResult has(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the message \"" << message << "\" lacks \"" << part << "\"";
}

// Bad calls fail with one line naming the op and the problem, and an append that fails writes nothing.
TEST_F(AttentionDecode, RefusesBadCalls) {
  const DecodeCase c{"errors", 3, 3, 6, 2, 24, 19, 10000.0f, true, {0, 16, 4}};
  auto message = [&](auto edit) {
    Decode<double> d(c, rng);
    edit(d);
    return error_of([&] { d.append(); });
  };
  EXPECT_TRUE(has(message([](Decode<double>& d) { d.p.Hkv = 4; }),
                  "kv_append: not supported: the KV heads Hkv 4 must "
                  "divide the query heads H 6"));
  EXPECT_TRUE(has(message([](Decode<double>& d) { d.p.Tq = 0; }), "Tq >= 1"));
  EXPECT_TRUE(has(message([](Decode<double>& d) { d.p.S = 2; }), "S >= B"));
  EXPECT_TRUE(
      has(message([](Decode<double>& d) { d.p.Dh = 22; }), "kv_append: q is (3, 3, 6, 24), expected (3, 3, 6, 22)"));
  EXPECT_TRUE(has(message([](Decode<double>& d) { d.pos[1] = 17; }),
                  "kv_append: sequence 1 at pos 17 with 3 new tokens "
                  "passes the cache's max_seq 19"));
  EXPECT_TRUE(has(message([](Decode<double>& d) { d.pos[0] = -1; }), "kv_append: pos[0] = -1 is negative"));
  EXPECT_TRUE(has(message([](Decode<double>& d) { d.slots[2 * 19 + 6] = 4; }),
                  "kv_append: slots[2, 6] = 4 is outside "
                  "[0, 4)"));

  Decode<double> d(c, rng);
  const std::vector<double> k0 = d.cache_k, qkv0 = d.qkv;
  d.slots[2 * 19 + 5] = -3;  // the last sequence's last new token
  EXPECT_TRUE(has(error_of([&] { d.append(); }), "slots[2, 5] = -3"));
  EXPECT_EQ(d.cache_k, k0);
  EXPECT_EQ(d.qkv, qkv0);
  d.slots[2 * 19 + 5] = 0;
  d.slots[1 * 19 + 3] = 7;  // history that sequence 1 reads
  EXPECT_TRUE(has(error_of([&] { d.decode(); }), "attention_decode: slots[1, 3] = 7 is outside [0, 4)"));
  std::vector<float> pos_f(3);
  EXPECT_TRUE(has(error_of([&] {
                    attention_decode(d.p, d.out_tensor(), d.q(), d.cache(), Tensor(pos_f.data(), DType::F32, {3}),
                                     d.slots_tensor(), d.ctx);
                  }),
                  "attention_decode: pos is F32, expected I32"));

  // Every view is checked, not q alone: k_new and v_new take Hkv heads, out H.
  Decode<double> e(c, rng);
  EXPECT_TRUE(has(error_of([&] {
                    kv_append(e.p, e.cache(), e.q(), e.q(), e.v_new(), e.pos_tensor(), e.slots_tensor(), e.ctx);
                  }),
                  "kv_append: k_new is (3, 3, 6, 24), expected (3, 3, 2, 24)"));
  EXPECT_TRUE(has(error_of([&] {
                    kv_append(e.p, e.cache(), e.q(), e.k_new(), e.q(), e.pos_tensor(), e.slots_tensor(), e.ctx);
                  }),
                  "kv_append: v_new is (3, 3, 6, 24), expected (3, 3, 2, 24)"));
  EXPECT_TRUE(has(error_of([&] {
                    attention_decode(e.p, e.k_new(), e.q(), e.cache(), e.pos_tensor(), e.slots_tensor(), e.ctx);
                  }),
                  "attention_decode: out is (3, 3, 2, 24), expected (3, 3, 6, 24)"));
}

}  // namespace
}  // namespace tessera
