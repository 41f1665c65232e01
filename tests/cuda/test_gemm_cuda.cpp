// GEMM (cuBLASLt) and bias gradient: the CUDA path against the f64 reference, through the Tensor-level entries.
#include <cmath>

#include "cuda_test_util.h"
#include "tessera/ops/gemm/gemm.h"

namespace tessera::test {
namespace {

struct GemmShape {
  int M, N, K;
};
// One element; sizes that are multiples of nothing (no 16-byte rows for any dtype); a GPT-2 projection; the
// LM head's vocabulary width 50257 (odd) with a head-sized K.
constexpr GemmShape kShapes[] = {{1, 1, 1}, {7, 13, 33}, {64, 768, 768}, {130, 50257, 64}};

// The four compute modes: f32 exact, f32 TF32, bf16, f16.
struct GemmMode {
  DType dt;
  bool tf32;
  const char* name;
};
constexpr GemmMode kModes[] = {{DType::F32, false, "f32"},
                               {DType::F32, true, "tf32"},
                               {DType::BF16, false, "bf16"},
                               {DType::F16, false, "f16"}};

// The bound on ‖got − ref‖ has two parts, each for what one stage of the kernel may add:
//  - the accumulation, against the size of the terms ‖mag‖ (mag = |alpha| |op(A)| |op(B)| + |beta C0| + |bias|):
//    fp32 rounds each partial sum relative to its own size, so where the terms cancel (the single element of a
//    1x1x1 product) a share of the result would measure the cancellation, not the kernel. fp32 accumulation:
//    ~sqrt(K) 2^-24, 2e-6 at K = 768: 1e-5 of the terms. TF32 keeps 10 mantissa bits of each input, a relative
//    error up to 2^-11 per factor, random in sign over the K terms (measured 3e-4 of the terms at most on an H200
//    over three seeds): 2e-3, loose on purpose; the exact path is the tight check.
//  - the output's rounding to bf16 / f16, against the size of the result ‖ref‖: RMS ~2^-9 / 2^-12 relative, and
//    split-K partials that cuBLASLt may add in the output type: 8e-3 (bf16), 1e-3 (f16). This part is what an
//    accumulator that rounds every partial sum to f16 would break (sqrt(K) 2^-11 of the partial sums, several
//    times f16's output rounding at K = 768, yet only 1e-4-3e-4 of the terms, which the old bound on the terms
//    alone, 2e-3 for f16, let through). cuBLASLt's own 16-bit compute type stayed within it on the H200 and was not
//    caught (bench/results/2026-12-02-test-mutants-h200.md): it does not round that often.
struct GemmBound {
  double terms, result;
};
GemmBound gemm_bound(const GemmMode& m) {
  switch (m.dt) {
    case DType::F32: return {m.tf32 ? 2e-3 : 1e-5, 0.0};
    case DType::BF16: return {1e-5, 8e-3};
    default: return {1e-5, 1e-3};  // f16
  }
}

// For the checks against the size of the result alone (expect_close, where no term cancels): scale on
// cuda_tolerance(dt), TF32's input rounding 200 x f32's 1e-5.
double tolerance_scale(const GemmMode& m) { return m.tf32 ? 200.0 : 1.0; }

// ‖got − ref‖ <= scale (bound.terms ‖mag‖ + bound.result ‖ref‖), element NaNs refused.
void expect_close_to_terms(const std::vector<double>& got, const std::vector<double>& ref,
                           const std::vector<double>& mag, const GemmBound& bound, const std::string& what,
                           double scale = 1.0) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double num = 0, terms = 0, result = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " is NaN (unwritten?) seed " << test_seed();
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    terms += mag[i] * mag[i];
    result += ref[i] * ref[i];
  }
  num = std::sqrt(num), terms = std::sqrt(terms), result = std::sqrt(result);
  const double tol = scale * (bound.terms * terms + bound.result * result);
  EXPECT_LE(num, tol) << what << ": error " << num / result << " of the result, " << num / terms
                      << " of the terms; allowed " << scale << " x (" << bound.terms << " of the terms + "
                      << bound.result << " of the result), seed " << test_seed();
}

std::vector<double> abs_of(std::vector<double> v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

// A row-major (rows, cols) matrix stored transposed: (cols, rows).
std::vector<double> transposed(const std::vector<double>& x, int rows, int cols) {
  std::vector<double> t(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c) * rows + r] = x[static_cast<size_t>(r) * cols + c];
  return t;
}

// All 16 (trans_a, trans_b, beta, bias) variants of one shape in one mode. The f64 product P = op(A) op(B) is
// computed once by the reference (gemm_loop_ref<double>); each variant's expected C is the reference's formula
// alpha * P + beta * C0 + bias, C0 random where beta = 1 and NaN-poisoned where beta = 0.
void run_gemm_shape(const GemmMode& mode, GemmShape s, Context& ctx, std::mt19937_64& rng) {
  const DType dt = mode.dt;
  const int M = s.M, N = s.N, K = s.K;
  const size_t MN = static_cast<size_t>(M) * N;
  const auto a = rounded(dt, randn<double>(static_cast<size_t>(M) * K, rng));  // op(A): (M, K)
  const auto b = rounded(dt, randn<double>(static_cast<size_t>(K) * N, rng));  // op(B): (K, N)
  const auto bias = rounded(dt, randn<double>(N, rng));
  const auto c0 = rounded(dt, randn<double>(MN, rng));
  std::vector<double> prod(MN), prod_abs(MN);
  gemm_loop_ref<double>({.M = M, .N = N, .K = K}, prod.data(), a.data(), b.data(), nullptr);
  gemm_loop_ref<double>({.M = M, .N = N, .K = K}, prod_abs.data(), abs_of(a).data(), abs_of(b).data(), nullptr);

  DeviceArena dev(ctx);
  const Tensor ta[2] = {dev.upload(dt, a), dev.upload(dt, transposed(a, M, K))};
  const Tensor tb[2] = {dev.upload(dt, b), dev.upload(dt, transposed(b, K, N))};
  const Tensor tbias = dev.upload(dt, bias);
  const float alpha = 0.7f;
  for (int trans_a = 0; trans_a < 2; ++trans_a)
    for (int trans_b = 0; trans_b < 2; ++trans_b)
      for (float beta : {0.0f, 1.0f})
        for (bool with_bias : {false, true}) {
          const GemmParams p{.M = M,
                             .N = N,
                             .K = K,
                             .trans_a = trans_a == 1,
                             .trans_b = trans_b == 1,
                             .alpha = alpha,
                             .beta = beta,
                             .allow_tf32 = mode.tf32};
          std::vector<double> ref(MN), mag(MN);
          for (size_t i = 0; i < MN; ++i) {
            ref[i] = alpha * prod[i] + (beta != 0 ? beta * c0[i] : 0.0) + (with_bias ? bias[i % N] : 0.0);
            mag[i] = alpha * prod_abs[i] + std::fabs(beta * c0[i]) + (with_bias ? std::fabs(bias[i % N]) : 0.0);
          }
          const Tensor tc = beta != 0 ? dev.upload(dt, c0) : dev.poisoned(dt, static_cast<int64_t>(MN));
          gemm(p, tc, ta[trans_a], tb[trans_b], with_bias ? tbias : Tensor(), ctx);
          const std::string what = std::string("gemm ") + mode.name + " " + std::to_string(M) + "x" +
                                   std::to_string(N) + "x" + std::to_string(K) + (trans_a ? " trans_a" : "") +
                                   (trans_b ? " trans_b" : "") + " beta=" + std::to_string(static_cast<int>(beta)) +
                                   (with_bias ? " +bias" : "");
          expect_close_to_terms(dev.download(tc), ref, mag, gemm_bound(mode), what);
        }
}

TEST(CudaGemm, MatchesReferenceForEveryTransBetaBiasAndDtype) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (const GemmMode& mode : kModes)
    for (GemmShape s : kShapes) run_gemm_shape(mode, s, ctx, rng);
}

// Exact f32 must follow the CPU reference to accumulation order; check element-wise too, against the size of the
// terms (Σ|a||b|), so that one bad element cannot hide in the global norm.
TEST(CudaGemm, ExactF32IsElementwiseTight) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 37, N = 129, K = 771;
  const auto a = rounded(DType::F32, randn<double>(static_cast<size_t>(M) * K, rng));
  const auto b = rounded(DType::F32, randn<double>(static_cast<size_t>(K) * N, rng));
  std::vector<double> ref(static_cast<size_t>(M) * N), mag(ref.size());
  gemm_loop_ref<double>({.M = M, .N = N, .K = K}, ref.data(), a.data(), b.data(), nullptr);
  gemm_loop_ref<double>({.M = M, .N = N, .K = K}, mag.data(), abs_of(a).data(), abs_of(b).data(), nullptr);
  DeviceArena dev(ctx);
  const Tensor tc = dev.poisoned(DType::F32, M * N);
  gemm({.M = M, .N = N, .K = K, .allow_tf32 = false}, tc, dev.upload(DType::F32, a), dev.upload(DType::F32, b),
       Tensor(), ctx);
  const auto got = dev.download(tc);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - ref[i]), 1e-6 * mag[i]) << "element " << i << " seed " << test_seed();
}

// Pointers that are only element-aligned (a view one element into a buffer, as inside a fused qkv buffer): the
// heuristic must be told the real alignment, and the bias epilogue may be declined (then the bias is added by a
// separate kernel).
TEST(CudaGemm, UnalignedPointers) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 33, N = 65, K = 47;
  for (const GemmMode& mode : kModes) {
    const DType dt = mode.dt;
    const auto a = rounded(dt, randn<double>(static_cast<size_t>(M) * K + 1, rng));
    const auto b = rounded(dt, randn<double>(static_cast<size_t>(K) * N + 1, rng));
    const auto bias = rounded(dt, randn<double>(N + 1, rng));
    const auto c0 = rounded(dt, randn<double>(static_cast<size_t>(M) * N + 1, rng));
    std::vector<double> ref(static_cast<size_t>(M) * N);
    gemm_loop_ref<double>({.M = M, .N = N, .K = K, .beta = 1.0f}, ref.data(), a.data() + 1, b.data() + 1,
                          bias.data() + 1);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += c0[i + 1];  // gemm_loop_ref started from zeros
    DeviceArena dev(ctx);
    const Tensor ta = dev.upload(dt, a), tb = dev.upload(dt, b), tbias = dev.upload(dt, bias), tc = dev.upload(dt, c0);
    gemm({.M = M, .N = N, .K = K, .beta = 1.0f, .allow_tf32 = mode.tf32}, tc.slice1d(1, M * N), ta.slice1d(1, M * K),
         tb.slice1d(1, K * N), tbias.slice1d(1, N), ctx);
    const auto got = dev.download(tc);
    EXPECT_EQ(got[0], c0[0]) << "wrote before C";
    expect_close(std::vector<double>(got.begin() + 1, got.end()), ref, dt, std::string("unaligned ") + mode.name,
                 tolerance_scale(mode));
  }
}

// K = 0: an empty product, C = beta * C + bias (cuBLASLt does not take k = 0; a separate kernel does it).
TEST(CudaGemm, EmptyProduct) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 5, N = 7;
  const auto bias = randn<double>(N, rng), c0 = randn<double>(M * N, rng);
  DeviceArena dev(ctx);
  for (float beta : {0.0f, 1.0f}) {
    const Tensor tc = beta != 0 ? dev.upload(DType::F32, c0) : dev.poisoned(DType::F32, M * N);
    gemm({.M = M, .N = N, .K = 0, .beta = beta}, tc, dev.alloc(DType::F32, 0), dev.alloc(DType::F32, 0),
         dev.upload(DType::F32, bias), ctx);
    std::vector<double> ref(M * N);
    for (int i = 0; i < M * N; ++i) ref[i] = static_cast<float>(beta * c0[i] + bias[i % N]);
    expect_close(dev.download(tc), ref, DType::F32, "K=0 beta=" + std::to_string(static_cast<int>(beta)));
  }
}

// Strided batch: 3 products with gaps between the matrices (strides larger than a matrix) and one shared bias;
// the gaps of C stay poisoned (each output element written once, nothing else).
TEST(CudaGemm, StridedBatch) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 17, N = 24, K = 40, batch = 3;
  const int64_t sa = M * K + 8, sb = K * N + 16, sc = M * N + 8;
  for (const GemmMode& mode : kModes) {
    const DType dt = mode.dt;
    const auto a = rounded(dt, randn<double>(batch * sa, rng));
    const auto b = rounded(dt, randn<double>(batch * sb, rng));
    const auto bias = rounded(dt, randn<double>(N, rng));
    DeviceArena dev(ctx);
    const Tensor tc = dev.poisoned(dt, batch * sc);
    const GemmParams p{.M = M,
                       .N = N,
                       .K = K,
                       .trans_b = true,
                       .allow_tf32 = mode.tf32,
                       .batch = batch,
                       .stride_a = sa,
                       .stride_b = sb,
                       .stride_c = sc};
    gemm(p, tc, dev.upload(dt, a), dev.upload(dt, b), dev.upload(dt, bias), ctx);
    const auto got = dev.download(tc);
    for (int i = 0; i < batch; ++i) {
      std::vector<double> ref(static_cast<size_t>(M) * N);
      gemm_loop_ref<double>({.M = M, .N = N, .K = K, .trans_b = true}, ref.data(), a.data() + i * sa, b.data() + i * sb,
                            bias.data());
      expect_close(std::vector<double>(got.begin() + i * sc, got.begin() + i * sc + M * N), ref, dt,
                   std::string("batch ") + std::to_string(i) + " " + mode.name, tolerance_scale(mode));
      for (int64_t j = i * sc + M * N; j < (i + 1) * sc; ++j)
        EXPECT_TRUE(std::isnan(got[j])) << "batch gap element " << j << " was written (" << mode.name << ")";
    }
  }
}

TEST(CudaGemm, IsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 256, N = 2304, K = 768;
  DeviceArena dev(ctx);
  const Tensor ta = dev.upload(DType::BF16, randn<double>(static_cast<size_t>(K) * M, rng));
  const Tensor tb = dev.upload(DType::BF16, randn<double>(static_cast<size_t>(K) * N, rng));
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor tc = dev.alloc(DType::BF16, static_cast<int64_t>(M) * N);
    gemm({.M = M, .N = N, .K = K, .trans_a = true}, tc, ta, tb, Tensor(), ctx);
    const auto got = dev.download(tc);
    if (run == 0) first = got;
    else ASSERT_EQ(got, first) << "gemm differs between identical runs";
  }
}

// Bias gradient: d_bias (prefilled, accumulated) += column sums of d_c. Shapes: one element, odd widths, the
// vocabulary width, and many rows (several row chunks, summed by the second kernel).
TEST(CudaGemm, BiasGradMatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  struct S {
    int M, N;
  };
  for (DType dt : kCudaFloatTypes)
    for (S s : {S{1, 1}, S{7, 13}, S{130, 50257}, S{4096, 768}, S{1000, 2304}}) {
      const auto d_c = rounded(dt, randn<double>(static_cast<size_t>(s.M) * s.N, rng));
      const auto d_bias0 = rounded(dt, randn<double>(s.N, rng));
      auto ref = d_bias0;
      bias_grad_ref<double>(s.M, s.N, ref.data(), d_c.data());
      DeviceArena dev(ctx);
      const Tensor tdb = dev.upload(dt, d_bias0);
      bias_grad({.M = s.M, .N = s.N}, tdb, dev.upload(dt, d_c), ctx);
      // M terms summed in fp32, one rounding to dt when added to d_bias (measured on an H200: 1.4e-7 for f32 at
      // M = 4096, 1.7e-3 for bf16, 2.6e-4 for f16).
      expect_close(dev.download(tdb), ref, dt, "bias_grad M=" + std::to_string(s.M) + " N=" + std::to_string(s.N));
    }
}

TEST(CudaGemm, BiasGradIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 8192, N = 768;
  DeviceArena dev(ctx);
  const Tensor tdc = dev.upload(DType::BF16, randn<double>(static_cast<size_t>(M) * N, rng));
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor tdb = dev.alloc(DType::BF16, N);
    fill_bytes(tdb, 0, ctx);
    bias_grad({.M = M, .N = N}, tdb, tdc, ctx);
    const auto got = dev.download(tdb);
    if (run == 0) first = got;
    else ASSERT_EQ(got, first) << "bias_grad differs between identical runs";
  }
}

// x (rows, cols) packed, copied into rows `ld` apart with NaN in the padding (which would spread if read).
std::vector<double> padded_rows(const std::vector<double>& x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<double> out(static_cast<size_t>(rows * ld), std::nan(""));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = x[r * cols + c];
  return out;
}

// Row strides: the lm_head's case (logits rows of V = 50257 stored 50304 apart, K = 64 here for speed; every
// transpose, as the forward, dW and dx GEMMs use the padded matrix as C, as A transposed and as A) and an awkward
// small shape with odd paddings. The padded product matches the reference, and C's padding stays NaN.
TEST(CudaGemm, PaddedRowStrides) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  struct Case {
    GemmShape s;
    int pad_a, pad_b, pad_c;
  };
  const Case cases[] = {{{7, 13, 33}, 3, 5, 9}, {{130, 50257, 64}, 0, 0, 47}, {{96, 64, 50257}, 47, 0, 0}};
  for (const GemmMode& mode : kModes) {
    const DType dt = mode.dt;
    for (const Case& cs : cases) {
      const int M = cs.s.M, N = cs.s.N, K = cs.s.K;
      const auto a = rounded(dt, randn<double>(static_cast<size_t>(M) * K, rng));
      const auto b = rounded(dt, randn<double>(static_cast<size_t>(K) * N, rng));
      std::vector<double> prod(static_cast<size_t>(M) * N), prod_abs(prod.size());
      gemm_loop_ref<double>({.M = M, .N = N, .K = K}, prod.data(), a.data(), b.data(), nullptr);
      gemm_loop_ref<double>({.M = M, .N = N, .K = K}, prod_abs.data(), abs_of(a).data(), abs_of(b).data(), nullptr);
      for (int trans_a = 0; trans_a < 2; ++trans_a)
        for (int trans_b = 0; trans_b < 2; ++trans_b) {
          GemmParams p{
              .M = M, .N = N, .K = K, .trans_a = trans_a == 1, .trans_b = trans_b == 1, .allow_tf32 = mode.tf32};
          p.lda = p.a_cols() + cs.pad_a;
          p.ldb = p.b_cols() + cs.pad_b;
          p.ldc = N + cs.pad_c;
          DeviceArena dev(ctx);
          const Tensor ta =
              dev.upload(dt, padded_rows(trans_a ? transposed(a, M, K) : a, p.a_rows(), p.a_cols(), p.lda));
          const Tensor tb =
              dev.upload(dt, padded_rows(trans_b ? transposed(b, K, N) : b, p.b_rows(), p.b_cols(), p.ldb));
          const Tensor tc = dev.poisoned(dt, static_cast<int64_t>(M) * p.ldc);
          gemm(p, tc, ta, tb, Tensor(), ctx);
          const auto got = dev.download(tc);
          std::vector<double> body(prod.size());
          bool padding_kept = true;
          for (int m = 0; m < M; ++m) {
            for (int n = 0; n < N; ++n) body[static_cast<size_t>(m) * N + n] = got[m * p.ldc + n];
            for (int64_t n = N; n < p.ldc; ++n) padding_kept = padding_kept && std::isnan(got[m * p.ldc + n]);
          }
          const std::string what = std::string("gemm ld ") + mode.name + " " + std::to_string(M) + "x" +
                                   std::to_string(N) + "x" + std::to_string(K) + (trans_a ? " trans_a" : "") +
                                   (trans_b ? " trans_b" : "");
          expect_close_to_terms(body, prod, prod_abs, gemm_bound(mode), what);
          EXPECT_TRUE(padding_kept) << what << ": C's row padding was written";
        }
    }
  }
}

// A GEMM planned for fewer SMs (what overlapped data-parallel training asks for) computes the same product.
TEST(CudaGemm, SmCountTargetKeepsTheProduct) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  struct Reset {
    Context& c;
    ~Reset() { c.set_gemm_sm_target(0); }
  } reset{ctx};
  ctx.set_gemm_sm_target(ctx.gpu().sm_count - 16);
  for (const GemmMode& mode : kModes) run_gemm_shape(mode, {256, 768, 3072}, ctx, rng);
}

// The CPU entry (no GPU needed): batches loop over gemm_ref, and the supports() answers.
TEST(CudaGemm, CpuEntryBatchesAndSupports) {
  std::mt19937_64 rng(test_seed());
  const int M = 3, N = 4, K = 5, batch = 2;
  auto a = randn<double>(batch * M * K, rng), b = randn<double>(batch * K * N, rng), bias = randn<double>(N, rng);
  std::vector<double> c(batch * M * N, 0.0);
  Context cpu;
  const GemmParams p{.M = M, .N = N, .K = K, .batch = batch, .stride_a = M * K, .stride_b = K * N, .stride_c = M * N};
  gemm(p, Tensor(c.data(), DType::F64, {batch * M * N}), Tensor(a.data(), DType::F64, {batch * M * K}),
       Tensor(b.data(), DType::F64, {batch * K * N}), Tensor(bias.data(), DType::F64, {N}), cpu);
  for (int i = 0; i < batch; ++i) {
    std::vector<double> ref(M * N);
    gemm_loop_ref<double>({.M = M, .N = N, .K = K}, ref.data(), a.data() + i * M * K, b.data() + i * K * N,
                          bias.data());
    for (int j = 0; j < M * N; ++j) EXPECT_NEAR(c[i * M * N + j], ref[j], 1e-12) << "batch " << i;
  }
  std::string why;
  EXPECT_FALSE(gemm_supports({.M = 1, .N = 1, .K = 1}, DType::BF16, Device::cpu(), &why));
  EXPECT_TRUE(gemm_supports({.M = 1, .N = 1, .K = 1}, DType::F64, Device::cpu(), &why));
  EXPECT_FALSE(gemm_supports({.M = 1, .N = 1, .K = 1, .batch = 0}, DType::F32, Device::cpu(), &why));
  EXPECT_FALSE(gemm_supports({.M = 2, .N = 2, .K = 1, .batch = 2, .stride_c = 3}, DType::F32, Device::cpu(), &why));
  EXPECT_NE(why.find("overlap"), std::string::npos) << why;
  EXPECT_THROW(gemm({.M = 2, .N = 2, .K = 2}, Tensor(c.data(), DType::F64, {3}), Tensor(a.data(), DType::F64, {4}),
                    Tensor(b.data(), DType::F64, {4}), Tensor(), cpu),
               Error);
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// GELU (tanh form) in f64, as activation.h defines it.
double gelu_f64(double u) { return 0.5 * u * (1.0 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u))); }

struct GeluCase {
  int M, N, K;
  bool trans_b;
  int offset;  // elements into each buffer: 1 leaves every pointer only element-aligned
};
// A GPT-2 fc layer's shape in small (N = d_ff a multiple of 8: cuBLASLt's epilogue takes it), the same with B
// transposed as the model's forward has it, a width that is not a multiple of 8 (the unfused fallback), one
// element, and unaligned pointers.
constexpr GeluCase kGeluCases[] = {{130, 3072, 64, true, 0},
                                   {130, 3072, 64, false, 0},
                                   {33, 13, 47, true, 0},
                                   {1, 8, 1, false, 0},
                                   {37, 64, 40, true, 1}};

// gemm_gelu_forward against the f64 formulas: pre = A B + bias, out = gelu(pre). Outputs NaN-poisoned.
void run_gemm_gelu(const GemmMode& mode, const GeluCase& c, Context& ctx, std::mt19937_64& rng) {
  const DType dt = mode.dt;
  const int M = c.M, N = c.N, K = c.K, o = c.offset;
  const size_t MN = static_cast<size_t>(M) * N;
  const auto a = rounded(dt, randn<double>(static_cast<size_t>(M) * K, rng));  // (M, K)
  const auto b = rounded(dt, randn<double>(static_cast<size_t>(K) * N, rng));  // op(B): (K, N)
  const auto bias = rounded(dt, randn<double>(N, rng));
  std::vector<double> prod(MN), prod_abs(MN);
  gemm_loop_ref<double>({.M = M, .N = N, .K = K}, prod.data(), a.data(), b.data(), nullptr);
  gemm_loop_ref<double>({.M = M, .N = N, .K = K}, prod_abs.data(), abs_of(a).data(), abs_of(b).data(), nullptr);
  std::vector<double> ref_pre(MN), mag_pre(MN), ref_out(MN);
  for (size_t i = 0; i < MN; ++i) {
    ref_pre[i] = prod[i] + bias[i % N];
    mag_pre[i] = prod_abs[i] + std::fabs(bias[i % N]);
    ref_out[i] = gelu_f64(ref_pre[i]);
  }
  // Stored operands (with an element in front when offset), and outputs NaN-poisoned.
  auto with_offset = [&](const std::vector<double>& v) {
    std::vector<double> w(v.size() + o, 0.0);
    std::copy(v.begin(), v.end(), w.begin() + o);
    return w;
  };
  DeviceArena dev(ctx);
  auto view = [&](const Tensor& t, int64_t n) { return t.slice1d(o, n); };
  const Tensor ta = view(dev.upload(dt, with_offset(a)), int64_t{M} * K);
  const Tensor tb = view(dev.upload(dt, with_offset(c.trans_b ? transposed(b, K, N) : b)), int64_t{K} * N);
  const Tensor tbias = view(dev.upload(dt, with_offset(bias)), N);
  const Tensor tout = view(dev.poisoned(dt, MN + o), MN), tpre = view(dev.poisoned(dt, MN + o), MN);
  const GemmParams p{.M = M, .N = N, .K = K, .trans_b = c.trans_b, .allow_tf32 = mode.tf32};
  gemm_gelu_forward(p, tout, tpre, ta, tb, tbias, ctx);
  const std::string what = std::string(mode.name) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                           std::to_string(K) + (c.trans_b ? " trans_b" : "") + (o ? " unaligned" : "");
  expect_close_to_terms(dev.download(tpre), ref_pre, mag_pre, gemm_bound(mode), "gemm_gelu pre " + what);
  // out is GELU of the f32 pre-activation, rounded once: the accumulation's error times |gelu'| <= 1.13, plus the
  // epilogue's tanh, against the terms; the output's rounding against out itself.
  expect_close_to_terms(dev.download(tout), ref_out, mag_pre, gemm_bound(mode), "gemm_gelu out " + what, 2.0);
}

TEST(CudaGemmGelu, MatchesReference) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  for (const GemmMode& mode : kModes)
    for (const GeluCase& c : kGeluCases) run_gemm_gelu(mode, c, ctx, rng);
}

// The model's fc shape in bf16 and f16 must take cuBLASLt's fused epilogue (else the test above checks only the
// fallback): the launcher reports whether it ran.
TEST(CudaGemmGelu, GptShapesTakeTheFusedEpilogue) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const int M = 256, C = 768, F = 3072;
  for (DType dt : {DType::BF16, DType::F16}) {
    DeviceArena dev(ctx);
    const Tensor x = dev.alloc(dt, int64_t{M} * C), w1 = dev.alloc(dt, int64_t{F} * C), b1 = dev.alloc(dt, F);
    const Tensor pre = dev.alloc(dt, int64_t{M} * F), out = dev.alloc(dt, int64_t{M} * F);
    for (const Tensor* t : {&x, &w1, &b1}) fill_bytes(*t, 0, ctx);
    EXPECT_TRUE(gemm_gelu_forward_cuda({.M = M, .N = F, .K = C, .trans_b = true}, dt, out.data(), pre.data(), x.data(),
                                       w1.data(), b1.data(), ctx))
        << dtype_label(dt);
    ctx.synchronize();
  }
}

TEST(CudaGemmGelu, IsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const int M = 1024, N = 3072, K = 768;
  DeviceArena dev(ctx);
  const DType dt = DType::BF16;
  const Tensor a = dev.upload(dt, randn<double>(static_cast<size_t>(M) * K, rng));
  const Tensor b = dev.upload(dt, randn<double>(static_cast<size_t>(K) * N, rng));
  const Tensor bias = dev.upload(dt, randn<double>(N, rng));
  std::vector<double> first[2];
  for (int run = 0; run < 3; ++run) {
    const Tensor out = dev.alloc(dt, int64_t{M} * N), pre = dev.alloc(dt, int64_t{M} * N);
    gemm_gelu_forward({.M = M, .N = N, .K = K}, out, pre, a, b, bias, ctx);
    const std::vector<double> got[2] = {dev.download(out), dev.download(pre)};
    for (int i = 0; i < 2; ++i) {
      if (run == 0) first[i] = got[i];
      else ASSERT_EQ(got[i], first[i]) << "output " << i << " differs between identical runs";
    }
  }
}

}  // namespace
}  // namespace tessera::test
