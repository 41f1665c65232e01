// kv_append and attention_decode on the GPU against the f64 CPU references (attention_decode.h): the append's
// rotated queries and cache rows against kv_append_ref, then the decode, with splits 1, 3 and the launcher's
// choice, against attention_decode_ref over the cache and queries the GPU append left. Cache entries that no
// sequence can see are NaN, so that a kernel reading past a sequence's keys shows; outputs are poisoned.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/ops/attention/attention_decode.h"

namespace tessera::test {
namespace {

struct DCase {
  const char* name;
  int B, Tq, H, Hkv, Dh, max_seq;
  float rope_theta;
  bool use_slots;
  std::vector<int32_t> pos;
};

std::string describe(const DCase& c, DType dt) {
  std::string s = std::string(c.name) + " " + dtype_label(dt) + " B=" + std::to_string(c.B) +
                  " Tq=" + std::to_string(c.Tq) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
                  " Dh=" + std::to_string(c.Dh) + " max_seq=" + std::to_string(c.max_seq) +
                  " theta=" + std::to_string(c.rope_theta) + (c.use_slots ? " slots" : " no slots") + " pos=";
  for (size_t b = 0; b < std::min<size_t>(c.pos.size(), 4); ++b) s += std::to_string(c.pos[b]) + ",";
  return s + (c.pos.size() > 4 ? "..." : "");
}

// The CPU test's awkward shapes, an odd head dim (the scalar paths), a group of more query rows than one block
// holds (H / Hkv x Tq = 60: row chunks), long caches with batch 16, and a wide head under multi-query attention.
std::vector<DCase> cases(std::mt19937_64& rng) {
  std::vector<DCase> c = {
      {"GQA, RoPE, decode", 3, 1, 6, 2, 24, 37, 10000.0f, false, {0, 17, 36}},
      {"GQA, slots, prefill", 3, 3, 6, 2, 64, 29, 0.0f, true, {5, 0, 26}},
      {"MHA, RoPE, slots", 3, 3, 6, 6, 24, 41, 500.0f, true, {0, 38, 13}},
      {"MQA, RoPE, slots, decode", 3, 1, 6, 1, 64, 23, 10000.0f, true, {22, 0, 9}},
      {"MQA, prefill", 3, 3, 6, 1, 24, 19, 0.0f, false, {16, 3, 0}},
      {"odd Dh, slots", 3, 3, 6, 2, 23, 37, 0.0f, true, {4, 0, 30}},
      {"row chunks, RoPE, slots", 2, 20, 6, 2, 64, 100, 10000.0f, true, {10, 80}},
      {"long, MQA, Dh 128, RoPE", 2, 3, 8, 1, 128, 4096, 10000.0f, false, {4000, 4093}},
  };
  for (bool slots : {false, true}) {
    DCase l{"long, batch 16, GQA, RoPE", 16, 1, 8, 2, 64, 4096, 10000.0f, slots, {}};
    std::uniform_int_distribution<int32_t> near_end(3800, 4095);
    for (int b = 0; b < l.B; ++b) l.pos.push_back(b == 0 ? 0 : b == 1 ? 4095 : near_end(rng));
    c.push_back(l);
  }
  return c;
}

// Host buffers of one case: the fused projection output qkv (B, Tq, H + 2 Hkv, Dh) whose slices are q, k_new and
// v_new, the cache (S = B + 1 slots), pos and the slot table. `seen` marks the (slot, position) pairs some
// sequence reads or writes (t < pos[b] + Tq at slot(b, t)); the cache holds NaN everywhere else.
struct Host {
  DCase c;
  DecodeAttentionParams p;
  int64_t W;
  std::vector<double> qkv, k, v;
  std::vector<int32_t> slots;
  std::vector<char> seen;

  Host(const DCase& c_, DType dt, std::mt19937_64& rng) : c(c_) {
    p = {.B = c.B,
         .Tq = c.Tq,
         .H = c.H,
         .Hkv = c.Hkv,
         .Dh = c.Dh,
         .S = c.B + 1,
         .max_seq = c.max_seq,
         .rope_theta = c.rope_theta};
    W = static_cast<int64_t>(c.H + 2 * c.Hkv) * c.Dh;
    qkv = rounded(dt, randn<double>(static_cast<size_t>(c.B) * c.Tq * W, rng));
    if (c.use_slots) scatter_slots(rng);
    seen.assign(static_cast<size_t>(p.S) * c.max_seq, 0);
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.pos[b] + c.Tq; ++t) seen[static_cast<size_t>(slot(b, t)) * c.max_seq + t] = 1;
    const size_t n = static_cast<size_t>(p.S) * c.Hkv * c.max_seq * c.Dh;
    k = rounded(dt, randn<double>(n, rng));
    v = rounded(dt, randn<double>(n, rng));
    for (size_t e = 0; e < n; ++e) {
      const size_t s = e / (static_cast<size_t>(c.Hkv) * c.max_seq * c.Dh), t = e / c.Dh % c.max_seq;
      if (!seen[s * c.max_seq + t]) k[e] = v[e] = std::numeric_limits<double>::quiet_NaN();
    }
  }
  // As the CPU test: shared history before the shortest sequence's pos, a permutation of slots at each later
  // position (no two sequences write one (slot, position), and none writes where another reads).
  void scatter_slots(std::mt19937_64& rng) {
    slots.assign(static_cast<size_t>(c.B) * c.max_seq, -1);
    const int shared_end = *std::min_element(c.pos.begin(), c.pos.end());
    std::uniform_int_distribution<int> any(0, p.S - 1);
    std::vector<int> perm(p.S);
    for (int t = 0; t < c.max_seq; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int b = 0; b < c.B; ++b) slots[static_cast<size_t>(b) * c.max_seq + t] = t < shared_end ? any(rng) : perm[b];
    }
  }
  int slot(int b, int t) const { return slots.empty() ? b : slots[static_cast<size_t>(b) * c.max_seq + t]; }
  const int32_t* slots_ptr() const { return slots.empty() ? nullptr : slots.data(); }

  // Views of a qkv-shaped buffer: q at column 0, k_new at H Dh, v_new at (H + Hkv) Dh.
  template <typename T>
  AttentionView<T> part(T* x, int col_heads) const {
    return {x + static_cast<int64_t>(col_heads) * c.Dh, c.Tq * W, W, c.Dh};
  }
  // The seen entries of a cache, in (slot, head, position, d) order.
  std::vector<double> seen_entries(const std::vector<double>& cache) const {
    std::vector<double> r;
    for (size_t e = 0; e < cache.size(); ++e) {
      const size_t s = e / (static_cast<size_t>(c.Hkv) * c.max_seq * c.Dh), t = e / c.Dh % c.max_seq;
      if (seen[s * c.max_seq + t]) r.push_back(cache[e]);
    }
    return r;
  }
  // The q part of a qkv-shaped buffer, in (b, i, h, d) order.
  std::vector<double> q_part(const std::vector<double>& x) const {
    std::vector<double> r;
    for (int bi = 0; bi < c.B * c.Tq; ++bi) r.insert(r.end(), x.begin() + bi * W, x.begin() + bi * W + c.H * c.Dh);
    return r;
  }
};

void run_case(const DCase& c, DType dt, Context& ctx, std::mt19937_64& rng) {
  const Host h(c, dt, rng);
  const std::string what = describe(c, dt);
  // The f64 append on the host.
  std::vector<double> ref_qkv = h.qkv, ref_k = h.k, ref_v = h.v;
  kv_append_ref<double>(h.p, ref_k.data(), ref_v.data(), h.part(ref_qkv.data(), 0),
                        h.part<const double>(ref_qkv.data(), c.H), h.part<const double>(ref_qkv.data(), c.H + c.Hkv),
                        c.pos.data(), h.slots_ptr());

  DeviceArena dev(ctx);
  const Tensor qkv = dev.upload(dt, h.qkv), ck = dev.upload(dt, h.k), cv = dev.upload(dt, h.v);
  const Tensor pos = dev.upload_i32(c.pos);
  const Tensor slots = h.slots.empty() ? Tensor() : dev.upload_i32(h.slots);
  auto slice = [&](int col_heads, int heads) {
    return Tensor::strided(static_cast<char*>(qkv.data()) + col_heads * c.Dh * dtype_size(dt), dt,
                           {c.B, c.Tq, heads, c.Dh}, {c.Tq * h.W, h.W, c.Dh, 1}, ctx.device());
  };
  const KvCacheView cache{.k = Tensor(ck.data(), dt, {h.p.S, c.Hkv, c.max_seq, c.Dh}, ctx.device()),
                          .v = Tensor(cv.data(), dt, {h.p.S, c.Hkv, c.max_seq, c.Dh}, ctx.device())};
  kv_append(h.p, cache, slice(0, c.H), slice(c.H, c.Hkv), slice(c.H + c.Hkv, c.Hkv), pos, slots, ctx);
  const std::vector<double> got_qkv = dev.download(qkv), got_k = dev.download(ck), got_v = dev.download(cv);
  expect_close(h.q_part(got_qkv), h.q_part(ref_qkv), dt, what + " rotated q");
  expect_close(h.seen_entries(got_k), h.seen_entries(ref_k), dt, what + " cache K");
  expect_close(h.seen_entries(got_v), h.seen_entries(ref_v), dt, what + " cache V");
  for (size_t e = 0; e < got_qkv.size(); ++e) {
    if (static_cast<int64_t>(e % h.W) < static_cast<int64_t>(c.H) * c.Dh) continue;
    ASSERT_EQ(got_qkv[e], h.qkv[e]) << what << ": k_new / v_new changed at " << e;
  }

  // The decode's reference over what the GPU append left (the cache's unseen NaNs are never read).
  std::vector<double> want(static_cast<size_t>(c.B) * c.Tq * c.H * c.Dh);
  const int64_t row = static_cast<int64_t>(c.H) * c.Dh;
  attention_decode_ref<double>(h.p, AttentionView<double>{want.data(), c.Tq * row, row, c.Dh},
                               h.part<const double>(got_qkv.data(), 0), got_k.data(), got_v.data(), c.pos.data(),
                               h.slots_ptr());
  for (int splits : {1, 3, 0}) {
    DecodeAttentionParams p = h.p;
    p.splits = splits;
    const Tensor out = dev.poisoned(dt, static_cast<int64_t>(want.size()));
    attention_decode(p,
                     Tensor::strided(out.data(), dt, {c.B, c.Tq, c.H, c.Dh}, {c.Tq * row, row, c.Dh, 1}, ctx.device()),
                     slice(0, c.H), cache, pos, slots, ctx);
    expect_close(dev.download(out), want, dt, what + " out, splits " + std::to_string(splits));
  }
}

TEST(CudaAttentionDecode, MatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const DCase& c : cases(rng)) run_case(c, dt, ctx, rng);
}

// A decode step (append, then attention with the launcher's splits: the combine runs) captured once in a CUDA graph
// after one eager step, then replayed with new q, k, v and pos written to the same device buffers: each replay
// equals the f64 references run step by step on the host.
TEST(CudaAttentionDecode, GraphReplayReadsNewPositions) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!cuda_graph_capture_supported()) GTEST_SKIP() << "this build cannot capture CUDA graphs";
  std::mt19937_64 rng(test_seed());
  for (DType dt : {DType::F32, DType::BF16}) {
    const DCase c{"graph", 3, 1, 6, 2, 64, 300, 10000.0f, false, {0, 150, 290}};
    Host h(c, dt, rng);
    for (double& x : h.k) x = std::isnan(x) ? 0.0 : x;  // later steps read positions past the first step's
    for (double& x : h.v) x = std::isnan(x) ? 0.0 : x;
    DeviceArena dev(ctx);
    const Tensor qkv = dev.upload(dt, h.qkv), ck = dev.upload(dt, h.k), cv = dev.upload(dt, h.v);
    std::vector<int32_t> pos = c.pos;
    const Tensor tpos = dev.upload_i32(pos);
    const int64_t row = static_cast<int64_t>(c.H) * c.Dh;
    const Tensor out = dev.poisoned(dt, static_cast<int64_t>(c.B) * row);
    auto slice = [&](int col_heads, int heads) {
      return Tensor::strided(static_cast<char*>(qkv.data()) + col_heads * c.Dh * dtype_size(dt), dt,
                             {c.B, 1, heads, c.Dh}, {h.W, h.W, c.Dh, 1}, ctx.device());
    };
    const KvCacheView cache{.k = Tensor(ck.data(), dt, {h.p.S, c.Hkv, c.max_seq, c.Dh}, ctx.device()),
                            .v = Tensor(cv.data(), dt, {h.p.S, c.Hkv, c.max_seq, c.Dh}, ctx.device())};
    auto step = [&] {
      kv_append(h.p, cache, slice(0, c.H), slice(c.H, c.Hkv), slice(c.H + c.Hkv, c.Hkv), tpos, Tensor(), ctx);
      attention_decode(h.p, Tensor::strided(out.data(), dt, {c.B, 1, c.H, c.Dh}, {row, row, c.Dh, 1}, ctx.device()),
                       slice(0, c.H), cache, tpos, Tensor(), ctx);
    };
    CudaGraph graph;
    for (int s = 0; s < 4; ++s) {
      std::vector<double> x = rounded(dt, randn<double>(h.qkv.size(), rng));
      for (int b = 0; b < c.B; ++b) pos[b] = c.pos[b] + s;
      copy_bytes(tpos.data(), ctx.device(), pos.data(), Device::cpu(), pos.size() * 4, ctx);
      const Tensor fresh = dev.upload(dt, x);
      copy_bytes(qkv.data(), ctx.device(), fresh.data(), ctx.device(), h.qkv.size() * dtype_size(dt), ctx);
      fill_bytes(out, 0xff, ctx);
      if (s == 0) {
        step();
        graph.capture(ctx, "decode step", step);
      } else {
        graph.launch(ctx);
      }
      kv_append_ref<double>(h.p, h.k.data(), h.v.data(), h.part(x.data(), 0), h.part<const double>(x.data(), c.H),
                            h.part<const double>(x.data(), c.H + c.Hkv), pos.data(), nullptr);
      // The GPU holds the rotated q and keys in dt.
      x = rounded(dt, x), h.k = rounded(dt, h.k);
      std::vector<double> want(static_cast<size_t>(c.B) * row);
      attention_decode_ref<double>(h.p, AttentionView<double>{want.data(), row, row, c.Dh},
                                   h.part<const double>(x.data(), 0), h.k.data(), h.v.data(), pos.data(), nullptr);
      expect_close(dev.download(out), want, dt, describe(c, dt) + " step " + std::to_string(s));
    }
  }
}

}  // namespace
}  // namespace tessera::test
