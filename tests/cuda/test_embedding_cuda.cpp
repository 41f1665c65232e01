// Fused embedding: the CUDA kernels against the f64 reference, through the Tensor-level entries.
#include <algorithm>
#include <iterator>
#include <random>

#include "cuda_test_util.h"
#include "tessera/ops/embedding/embedding.h"

namespace tessera::test {
namespace {

struct EmbCase {
  int B, T, C, V;
  int distinct;  // tokens drawn from [0, distinct): small values make long runs of one token in the backward
};
// T = 1, widths that are not multiples of the 8-wide vector, GPT-2's vocab, one token repeated over the batch.
constexpr EmbCase kCases[] = {{1, 1, 1, 1, 1},        {2, 3, 33, 7, 7},         {3, 1, 40, 50257, 50257},
                              {4, 33, 40, 50257, 50}, {8, 64, 768, 1000, 1000}, {5, 17, 100, 300, 3},
                              {2, 128, 64, 97, 1}};

struct EmbOptions {
  bool positions = true;  // a learned wpe (with d_wpe)
  bool padding = false;   // padding_id = 0, and some tokens are 0
  float dropout = 0.0f;
  float scale = 1.0f;
  int pos_offset = 0;
};

// tokens_in: the B*T token ids to use instead of random ones in [0, e.distinct).
void run_embedding_case(DType dt, EmbCase e, EmbOptions o, Context& ctx, std::mt19937_64& rng,
                        const std::vector<int32_t>* tokens_in = nullptr) {
  const int BT = e.B * e.T, max_seq = o.pos_offset + e.T + 3;
  const EmbeddingParams p{.B = e.B,
                          .T = e.T,
                          .C = e.C,
                          .V = e.V,
                          .max_seq = max_seq,
                          .pos_offset = o.pos_offset,
                          .scale = o.scale,
                          .padding_id = o.padding ? 0 : -1,
                          .dropout = o.dropout,
                          .seed = rng(),
                          .stream = rng() % 1000};
  std::vector<int32_t> tokens = tokens_in ? *tokens_in : randint(BT, e.distinct, rng);
  const size_t VC = static_cast<size_t>(e.V) * e.C, SC = static_cast<size_t>(max_seq) * e.C;
  const size_t NC = static_cast<size_t>(BT) * e.C;
  const auto wte = rounded(dt, randn<double>(VC, rng)), wpe = rounded(dt, randn<double>(SC, rng));
  const auto d_out = rounded(dt, randn<double>(NC, rng));
  const auto d_wte0 = rounded(dt, randn<double>(VC, rng)), d_wpe0 = rounded(dt, randn<double>(SC, rng));

  std::vector<double> out(NC), d_wte = d_wte0, d_wpe = d_wpe0;
  embedding_forward_ref<double>(p, out.data(), tokens.data(), wte.data(), o.positions ? wpe.data() : nullptr);
  embedding_backward_ref<double>(p, d_wte.data(), o.positions ? d_wpe.data() : nullptr, d_out.data(), tokens.data());

  DeviceArena dev(ctx);
  const Tensor ttok = dev.upload_i32(tokens), twte = dev.upload(dt, wte);
  const Tensor twpe = o.positions ? dev.upload(dt, wpe) : Tensor(), tdo = dev.upload(dt, d_out);
  const Tensor tout = dev.poisoned(dt, NC), tdwte = dev.upload(dt, d_wte0);
  const Tensor tdwpe = o.positions ? dev.upload(dt, d_wpe0) : Tensor();
  embedding_forward(p, tout, ttok, twte, twpe, ctx);
  embedding_backward(p, tdwte, tdwpe, tdo, ttok, ctx);

  const std::string what = "embedding B=" + std::to_string(e.B) + " T=" + std::to_string(e.T) +
                           " C=" + std::to_string(e.C) + " V=" + std::to_string(e.V) +
                           " distinct=" + std::to_string(e.distinct) + (o.positions ? " +wpe" : "") +
                           (o.padding ? " +pad" : "") + " dropout=" + std::to_string(o.dropout) +
                           " scale=" + std::to_string(o.scale) + " pos_offset=" + std::to_string(o.pos_offset);
  expect_close(dev.download(tout), out, dt, what + " out");
  // d_wte and d_wpe are mostly their prefill; compare the change so that the error is measured against the
  // gradient, not against the prefill.
  const auto delta = [](std::vector<double> a, const std::vector<double>& a0) {
    for (size_t i = 0; i < a.size(); ++i) a[i] -= a0[i];
    return a;
  };
  // In 16 bits the change also carries the rounding of prefill + gradient, a 2^-9 (bf16) or 2^-12 (f16) share of
  // it: with the gradient at least half the prefill's size (scale 0.5, one row an id) that is under 3x the dtype's
  // tolerance's share. The whole table alone hid a 16-bit backward that overwrote d_wte or skipped it: at V =
  // 50257 the gradient is under 1% of the table.
  const double delta_scale = dt == DType::F32 ? 10.0 : 4.0;
  const auto got_wte = dev.download(tdwte);
  expect_close(got_wte, d_wte, dt, what + " d_wte", 2.0);
  expect_close(delta(got_wte, d_wte0), delta(d_wte, d_wte0), dt, what + " Δd_wte", delta_scale);
  if (o.positions) {
    const auto got_wpe = dev.download(tdwpe);
    expect_close(got_wpe, d_wpe, dt, what + " d_wpe", 2.0);
    expect_close(delta(got_wpe, d_wpe0), delta(d_wpe, d_wpe0), dt, what + " Δd_wpe", delta_scale);
  }
}

TEST(CudaEmbedding, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (EmbCase e : kCases) {
      run_embedding_case(dt, e, {}, ctx, rng);
      run_embedding_case(dt, e, {.positions = false, .scale = 27.7f}, ctx, rng);
      run_embedding_case(dt, e, {.padding = true, .dropout = 0.1f, .scale = 0.5f, .pos_offset = 2}, ctx, rng);
    }
}

// The GPU drops exactly the elements the reference drops: wte = 1, no positions, out is 0 or 1 / (1 - p).
TEST(CudaEmbedding, DropsTheSameElementsAsTheReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const EmbeddingParams p{.B = 3, .T = 7, .C = 64, .V = 5, .dropout = 0.3f, .seed = 99, .stream = 12};
  std::mt19937_64 rng(test_seed());
  const auto tokens = randint(21, p.V, rng);
  const std::vector<double> wte(static_cast<size_t>(p.V) * p.C, 1.0);
  std::vector<double> out(21 * 64);
  embedding_forward_ref<double>(p, out.data(), tokens.data(), wte.data(), nullptr);
  DeviceArena dev(ctx);
  const Tensor tout = dev.poisoned(DType::F32, 21 * 64);
  embedding_forward(p, tout, dev.upload_i32(tokens), dev.upload(DType::F32, wte), Tensor(), ctx);
  const auto got = dev.download(tout);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(got[i] == 0.0, out[i] == 0.0) << "element " << i;
}

TEST(CudaEmbedding, BackwardIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const EmbeddingParams p{.B = 8, .T = 1024, .C = 768, .V = 2000, .max_seq = 1024};
  const size_t NC = static_cast<size_t>(p.B) * p.T * p.C;
  DeviceArena dev(ctx);
  const Tensor ttok = dev.upload_i32(randint(static_cast<size_t>(p.B) * p.T, 300, rng));  // long runs
  const Tensor tdo = dev.upload(DType::BF16, randn<double>(NC, rng));
  std::vector<double> first_wte, first_wpe;
  for (int run = 0; run < 3; ++run) {
    const Tensor tdwte = dev.alloc(DType::BF16, static_cast<int64_t>(p.V) * p.C);
    const Tensor tdwpe = dev.alloc(DType::BF16, static_cast<int64_t>(p.max_seq) * p.C);
    fill_bytes(tdwte, 0, ctx);
    fill_bytes(tdwpe, 0, ctx);
    embedding_backward(p, tdwte, tdwpe, tdo, ttok, ctx);
    const auto wte = dev.download(tdwte), wpe = dev.download(tdwpe);
    if (run == 0) {
      first_wte = wte;
      first_wpe = wpe;
    } else {
      ASSERT_EQ(wte, first_wte) << "d_wte differs between identical runs";
      ASSERT_EQ(wpe, first_wpe) << "d_wpe differs between identical runs";
    }
  }
}

// ---- Long runs of one token id: the backward sums a run in chunks of 32 sorted positions (pass 1 writes the
// partial of every chunk that begins inside a run, pass 2 adds them after the run's first piece). ----

// n ids drawn from a Zipf law over [0, V): P(id k) ∝ 1 / (k + 1), text's shape (id 0 takes ~1/ln(V) of the rows).
std::vector<int32_t> zipf_tokens(size_t n, int V, std::mt19937_64& rng) {
  std::vector<double> w(static_cast<size_t>(V));
  for (int k = 0; k < V; ++k) w[k] = 1.0 / (k + 1);
  std::discrete_distribution<int32_t> d(w.begin(), w.end());
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Runs whose lengths straddle the chunk boundaries once sorted: id k gets lengths[k] rows, shuffled over the batch.
// Sorted, id 0 fills positions 0-30, id 1 position 31, id 2 exactly chunk 1, id 3 chunks 2 and 3 (one row), ...,
// and the last id more than 32 chunks (pass 2 reads the continuing chunks' keys 32 at a time).
std::vector<int32_t> straddling_tokens(size_t n, std::mt19937_64& rng) {
  const int lengths[] = {31, 1, 32, 33, 64, 65, 97, 1, 2, 2100};
  std::vector<int32_t> t;
  for (int k = 0; k < static_cast<int>(std::size(lengths)); ++k) t.insert(t.end(), lengths[k], k);
  t.resize(n, static_cast<int32_t>(std::size(lengths)));  // the rest: one more id (or the list cut short)
  std::shuffle(t.begin(), t.end(), rng);
  return t;
}

TEST(CudaEmbedding, LongRunsMatchReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (DType dt : kCudaFloatTypes)
    for (int C : {40, 64}) {  // 40: the scalar path (not a multiple of the 8-wide pack); 64: packs
      // Every row the same id (one run over every chunk), with B*T = 4100 not a multiple of 32.
      const EmbCase same{4, 1025, C, 11, 1};
      const std::vector<int32_t> sevens(4100, 7);
      run_embedding_case(dt, same, {}, ctx, rng, &sevens);
      run_embedding_case(dt, same, {.positions = false, .dropout = 0.1f, .scale = 2.0f}, ctx, rng, &sevens);
      // Zipf ids over GPT-2's vocab; padding_id = 0 takes the most frequent id out of the sort.
      const EmbCase zipf{8, 512, C, 50257, 50257};
      const auto z = zipf_tokens(8 * 512, 50257, rng);
      run_embedding_case(dt, zipf, {}, ctx, rng, &z);
      run_embedding_case(dt, zipf, {.padding = true, .dropout = 0.1f, .scale = 0.5f, .pos_offset = 3}, ctx, rng, &z);
      // Runs that begin, end and straddle at every place relative to the chunks.
      const EmbCase straddle{2, 1500, C, 12, 12};
      const auto st = straddling_tokens(3000, rng);
      run_embedding_case(dt, straddle, {}, ctx, rng, &st);
      run_embedding_case(dt, straddle, {.positions = false, .dropout = 0.2f}, ctx, rng, &st);
    }
}

// The backward's f32 sums, bit for bit: each id's rows in ascending row order (the stable sort), its first
// chunk of 32 sorted positions summed row by row, then each later chunk's own row-by-row sum added in chunk order
// (embedding.cu). Emulated here in f32; a sort that is not stable, or a chunk added out of order, changes the
// rounding. Run on both sorts: the bucket sort (B*T up to kEmbeddingBucketSortMaxRows) and the radix sort.
// d_wpe's column sums (each position's rows over the batch, in order, padded and invalid rows skipped) are checked
// bit for bit too. `rounds` calls follow one another on the same Context, each with other run lengths for the ids
// and the rows shuffled anew: the backward's kernels are programmatic dependents of each other (embedding.cu), and
// one that read its scratch before the kernel before it had written it would find the previous call's counts and
// order there. That is a race, which these calls give a chance to show, not a certainty: a build without the
// ranking kernel's wait passed the one-call version of this test three times out of three.
//
// V and padding_id: with padding_id = 0 the 50 rows of id 0 are padding; with -1 they are a real id, sorted first,
// and only the ids past V are left out. The radix sort sorts key_bits(V) bits, and V itself (every left-out row's
// key) must fit in them: at a power-of-two V one bit short would sort those rows in among id 0's.
void check_stable_order_sums(int B, int T, int rounds, std::mt19937_64& rng, Context& ctx, int V = 40,
                             int padding_id = 0) {
  const EmbeddingParams p{.B = B, .T = T, .C = 24, .V = V, .max_seq = T, .padding_id = padding_id};
  const int n = B * T;
  // Id k + 1 gets lengths[k] rows; padding (0) and ids past V (never summed) sort after them all, so the sorted
  // positions are fixed: runs ending one short of a chunk, one row, starting on a chunk boundary, exactly one
  // chunk, one past it, the bucket sort's per-lane walk limit (64) and one past it (65, read by the whole warp),
  // and a run of thousands. The remaining rows take id 12.
  const int lengths[] = {31, 1, 32, 33, 64, 65, 97, 2, 130, 2100, 40};
  constexpr int kIds = static_cast<int>(std::size(lengths));
  const auto f32 = [](std::vector<double> v) {
    for (double& x : v) x = static_cast<float>(x);
    return v;
  };
  const auto d_out = f32(randn<double>(static_cast<size_t>(n) * p.C, rng));
  const auto d_wte0 = f32(randn<double>(static_cast<size_t>(p.V) * p.C, rng));
  const auto d_wpe0 = f32(randn<double>(static_cast<size_t>(T) * p.C, rng));
  DeviceArena dev(ctx);
  const Tensor tdo = dev.upload(DType::F32, d_out);
  for (int round = 0; round < rounds; ++round) {
    std::vector<int32_t> tokens;  // this round: id (k + round) % kIds + 1 gets lengths[k] rows
    for (int k = 0; k < kIds; ++k) tokens.insert(tokens.end(), lengths[k], (k + round) % kIds + 1);
    tokens.insert(tokens.end(), 50, 0);
    for (int k = 0; k < 30; ++k) tokens.push_back(p.V + k % 5);
    tokens.resize(static_cast<size_t>(n), 12);
    std::shuffle(tokens.begin(), tokens.end(), rng);
    // The emulation: sorted positions of the summed rows (stable), their chunks, and the sums in f32.
    std::vector<int32_t> order(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) order[r] = r;
    const auto key = [&](int32_t r) {
      return tokens[r] < 0 || tokens[r] >= p.V || tokens[r] == p.padding_id ? p.V : tokens[r];
    };
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) < key(b); });
    std::vector<double> want = d_wte0;
    for (int i = 0; i < n;) {
      const int id = key(order[i]);
      int end = i;
      while (end < n && key(order[end]) == id) ++end;
      if (id != p.V)
        for (int c = 0; c < p.C; ++c) {
          float acc = 0.0f;
          for (int q = i; q < end;) {  // the run's piece in each chunk it touches, in chunk order
            const int chunk_end = std::min(end, (q / 32 + 1) * 32);
            const bool first = q == i;
            float piece = 0.0f;
            for (; q < chunk_end; ++q) piece += static_cast<float>(d_out[static_cast<size_t>(order[q]) * p.C + c]);
            acc = first ? piece : acc + piece;
          }
          const size_t e = static_cast<size_t>(id) * p.C + c;
          want[e] = static_cast<float>(static_cast<float>(d_wte0[e]) + acc);
        }
      i = end;
    }
    std::vector<double> want_wpe = d_wpe0;
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < p.C; ++c) {
        float acc = 0.0f;
        for (int b = 0; b < B; ++b) {
          const size_t row = static_cast<size_t>(b) * T + t;
          if (key(static_cast<int32_t>(row)) != p.V) acc += static_cast<float>(d_out[row * p.C + c]);
        }
        const size_t e = static_cast<size_t>(t) * p.C + c;
        want_wpe[e] = static_cast<float>(static_cast<float>(d_wpe0[e]) + acc);
      }
    const Tensor tdwte = dev.upload(DType::F32, d_wte0), tdwpe = dev.upload(DType::F32, d_wpe0);
    embedding_backward(p, tdwte, tdwpe, tdo, dev.upload_i32(tokens), ctx);
    const auto got = dev.download(tdwte), got_wpe = dev.download(tdwpe);
    for (size_t e = 0; e < got.size(); ++e)
      ASSERT_EQ(got[e], want[e]) << "B*T=" << n << ", call " << round << ": d_wte element " << e << " (id " << e / p.C
                                 << "): not the stable order's sum";
    for (size_t e = 0; e < got_wpe.size(); ++e)
      ASSERT_EQ(got_wpe[e], want_wpe[e]) << "B*T=" << n << ", call " << round << ": d_wpe element " << e;
  }
}

TEST(CudaEmbedding, BackwardSumsEachIdsRowsInStableOrder) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  check_stable_order_sums(3, 1100, /*rounds=*/4, rng, ctx);  // the bucket sort
  static_assert(41 * 1000 > kEmbeddingBucketSortMaxRows);
  check_stable_order_sums(41, 1000, /*rounds=*/2, rng, ctx);                               // the radix sort
  check_stable_order_sums(41, 1000, /*rounds=*/1, rng, ctx, /*V=*/64, /*padding_id=*/-1);  // V = 2^6: 7 key bits
}

// Long runs give bit-identical d_wte on reruns (f32, where a change of summation order shows in the low bits).
TEST(CudaEmbedding, LongRunsAreDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const EmbeddingParams p{.B = 16, .T = 1024, .C = 768, .V = 50257, .max_seq = 1024, .dropout = 0.1f, .seed = 5};
  const size_t n = static_cast<size_t>(p.B) * p.T, NC = n * p.C;
  DeviceArena dev(ctx);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor tdo = dev.upload(dt, randn<double>(NC, rng));
    for (const auto& tokens : {std::vector<int32_t>(n, 42), zipf_tokens(n, p.V, rng)}) {
      const Tensor ttok = dev.upload_i32(tokens);
      std::vector<double> first;
      for (int run = 0; run < 3; ++run) {
        const Tensor tdwte = dev.alloc(dt, static_cast<int64_t>(p.V) * p.C);
        fill_bytes(tdwte, 0, ctx);
        embedding_backward(p, tdwte, Tensor(), tdo, ttok, ctx);
        const auto wte = dev.download(tdwte);
        if (run == 0) first = wte;
        else ASSERT_EQ(wte, first) << dtype_label(dt) << ": d_wte differs between identical runs";
      }
    }
  }
}

TEST(CudaEmbedding, SupportsAnswersWithoutAGpu) {
  std::string why;
  EXPECT_FALSE(embedding_supports({.B = 1, .T = 1, .C = 8, .V = 4}, DType::BF16, Device::cpu(), &why));
  EXPECT_TRUE(embedding_supports({.B = 1, .T = 1, .C = 8, .V = 4}, DType::F64, Device::cpu(), &why));
  EXPECT_FALSE(embedding_supports({.B = 1, .T = 1, .C = 8, .V = 4, .dropout = 1.5f}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("dropout"), std::string::npos) << why;
  EXPECT_FALSE(embedding_supports({.B = 1, .T = 1, .C = 0, .V = 4}, DType::F32, Device::cpu(), &why));
}

// A CPU run through the Tensor-level entry names a position beyond max_seq.
TEST(CudaEmbedding, EntryRejectsPositionsBeyondTheTable) {
  Context cpu;
  const EmbeddingParams p{.B = 1, .T = 4, .C = 2, .V = 3, .max_seq = 4, .pos_offset = 1};
  std::vector<float> out(8), wte(6), wpe(8);
  std::vector<int32_t> tok(4, 0);
  EXPECT_THROW(embedding_forward(p, Tensor(out.data(), DType::F32, {8}), Tensor(tok.data(), DType::I32, {4}),
                                 Tensor(wte.data(), DType::F32, {6}), Tensor(wpe.data(), DType::F32, {8}), cpu),
               Error);
}

}  // namespace
}  // namespace tessera::test
