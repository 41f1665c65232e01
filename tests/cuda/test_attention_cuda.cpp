// Attention and RoPE: the CUDA kernels against the f64 reference, through the Tensor-level entries.
#include <array>

#include "cuda_test_util.h"
#include "tessera/ops/attention/attention.h"

namespace tessera::test {
namespace {

// Column block `part` (0 = q, 1 = k, 2 = v) of a (N, 3C) buffer, as a (N, C) vector.
std::vector<double> qkv_part(const std::vector<double>& qkv, int part, size_t N, int C) {
  std::vector<double> r(N * C);
  for (size_t n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) r[n * C + c] = qkv[n * 3 * C + part * C + c];
  return r;
}

void run_attention_case(const AttentionParams& p, DType dt, Context& ctx, std::mt19937_64& rng) {
  const int C = p.H * p.Dh;
  const size_t N = static_cast<size_t>(p.B) * p.T, NC = N * C, n_lse = N * p.H;
  // Scores S ~ N(0, 1.5²): peaked enough that the running max moves between key tiles.
  const auto qkv = rounded(dt, randn<double>(3 * NC, rng, 1.5));
  const auto d_out = rounded(dt, randn<double>(NC, rng, 1.0));

  std::vector<double> out(NC), lse(n_lse), d_qkv(3 * NC);
  attention_forward_ref<double>(p, out.data(), lse.data(), qkv.data());
  // The backward sees out as the model stores it: rounded to the compute dtype.
  const auto out_rounded = rounded(dt, out);
  attention_backward_ref<double>(p, d_qkv.data(), d_out.data(), qkv.data(), out_rounded.data(), lse.data());

  DeviceArena dev(ctx);
  const Tensor tqkv = dev.upload(dt, qkv), tdo = dev.upload(dt, d_out);
  const Tensor tout = dev.poisoned(dt, NC), tlse = dev.poisoned(DType::F32, n_lse);
  const Tensor tdqkv = dev.poisoned(dt, 3 * NC);  // overwritten: every element must be written
  attention_forward(p, tout, tlse, tqkv, ctx);
  attention_backward(p, tdqkv, tdo, tqkv, tout, tlse, ctx);

  const std::string what = std::string(p.causal ? "causal" : "full") + " B=" + std::to_string(p.B) +
                           " T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) + " Dh=" + std::to_string(p.Dh);
  expect_close(dev.download(tout), out, dt, what + " out");
  expect_close(dev.download(tlse), lse, DType::F32, what + " lse", 10.0);
  const auto got = dev.download(tdqkv);
  // dQ and dK vanish at T = 1 (the only key gets P = 1, so dS = P (dP - D) = 0): measure them against the
  // gradient's natural size, ‖dV‖ ≈ ‖dO‖, not against rounding noise.
  const double floor = 0.1 * norm2(qkv_part(d_qkv, 2, N, C));
  static constexpr std::array<const char*, 3> kPart = {" dQ", " dK", " dV"};
  for (int part = 0; part < 3; ++part)
    expect_close(qkv_part(got, part, N, C), qkv_part(d_qkv, part, N, C), dt, what + kPart[part], 3.0, floor);
}

TEST(CudaAttention, MatchesReferenceOnAwkwardShapes) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // T: one row, a partial tile, one full tile, several tiles with a partial last one. Dh: every compiled width
  // (32, 64, 96, 128) and ones that run padded (16 in 32, 80 in 96).
  for (DType dt : kCudaFloatTypes)
    for (bool causal : {true, false})
      for (int Dh : {16, 32, 64, 80, 96, 128})
        for (int T : {1, 17, 64, 200})
          for (int B : {1, 2})
            for (int H : {1, 3}) run_attention_case({.B = B, .T = T, .H = H, .Dh = Dh, .causal = causal}, dt, ctx, rng);
}

TEST(CudaAttention, BackwardIsDeterministic) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  const AttentionParams p{.B = 2, .T = 333, .H = 4, .Dh = 64, .causal = true};
  const size_t NC = static_cast<size_t>(p.B) * p.T * p.H * p.Dh;
  DeviceArena dev(ctx);
  const Tensor tqkv = dev.upload(DType::BF16, randn<double>(3 * NC, rng));
  const Tensor tdo = dev.upload(DType::BF16, randn<double>(NC, rng));
  const Tensor tout = dev.alloc(DType::BF16, NC), tlse = dev.alloc(DType::F32, NC / p.Dh);
  attention_forward(p, tout, tlse, tqkv, ctx);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    const Tensor tdqkv = dev.poisoned(DType::BF16, 3 * NC);
    attention_backward(p, tdqkv, tdo, tqkv, tout, tlse, ctx);
    const auto got = dev.download(tdqkv);
    if (run == 0) first = got;
    else ASSERT_EQ(got, first) << "d_qkv differs between identical runs";
  }
}

void run_rope_case(const RopeParams& p, DType dt, Context& ctx, std::mt19937_64& rng) {
  const size_t n = static_cast<size_t>(p.B) * p.T * 3 * p.H * p.Dh;
  const auto x = rounded(dt, randn<double>(n, rng, 1.0));
  const auto g = rounded(dt, randn<double>(n, rng, 1.0));
  std::vector<double> x_ref = x, g_ref = g;
  rope_forward_ref<double>(p, x_ref.data());
  rope_backward_ref<double>(p, g_ref.data());

  DeviceArena dev(ctx);
  const Tensor tx = dev.upload(dt, x), tg = dev.upload(dt, g);  // in place: the inputs are the outputs
  rope_forward(p, tx, ctx);
  rope_backward(p, tg, ctx);
  const std::string what = "rope B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) +
                           " Dh=" + std::to_string(p.Dh) + " theta=" + std::to_string(p.theta) +
                           " pos_offset=" + std::to_string(p.pos_offset);
  const auto got_x = dev.download(tx), got_g = dev.download(tg);
  expect_close(got_x, x_ref, dt, what + " forward");
  expect_close(got_g, g_ref, dt, what + " backward");
  // The v part is not touched (bit for bit).
  const int C = p.H * p.Dh;
  const size_t N = static_cast<size_t>(p.B) * p.T;
  EXPECT_EQ(qkv_part(got_x, 2, N, C), qkv_part(x, 2, N, C)) << what << " forward changed v";
  EXPECT_EQ(qkv_part(got_g, 2, N, C), qkv_part(g, 2, N, C)) << what << " backward changed d_v";
}

TEST(CudaRope, MatchesReferenceInPlace) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test_seed());
  // An odd head dim (its last element is not rotated), long positions (angles in the thousands of radians, where
  // an f32 angle would be off by 1e-4) and a Llama-3 theta.
  const RopeParams shapes[] = {{.B = 1, .T = 1, .H = 1, .Dh = 2},
                               {.B = 2, .T = 17, .H = 3, .Dh = 64},
                               {.B = 1, .T = 200, .H = 2, .Dh = 80},
                               {.B = 2, .T = 64, .H = 3, .Dh = 128, .theta = 500000.0f},
                               {.B = 1, .T = 5, .H = 2, .Dh = 7},
                               {.B = 2, .T = 300, .H = 1, .Dh = 32, .pos_offset = 4000}};
  for (DType dt : kCudaFloatTypes)
    for (const RopeParams& p : shapes) run_rope_case(p, dt, ctx, rng);
}

TEST(CudaAttention, SupportsHeadDimsUpToKernelLimit) {
  std::string why;
  EXPECT_FALSE(
      attention_supports({.B = 1, .T = 8, .H = 2, .Dh = kAttentionMaxDh + 1}, DType::BF16, Device::cuda(0), &why));
  EXPECT_NE(why.find("Dh up to"), std::string::npos) << why;
  EXPECT_TRUE(attention_supports({.B = 1, .T = 8, .H = 2, .Dh = 80}, DType::BF16, Device::cuda(0), &why)) << why;
  EXPECT_TRUE(attention_supports({.B = 1, .T = 8, .H = 2, .Dh = 256}, DType::F64, Device::cpu(), &why)) << why;
  EXPECT_FALSE(attention_supports({.B = 1, .T = 8, .H = 2, .Dh = 64}, DType::BF16, Device::cpu(), &why));
  EXPECT_FALSE(attention_supports({.B = 1, .T = 8, .H = 0, .Dh = 64}, DType::F32, Device::cpu(), &why));
  EXPECT_TRUE(rope_supports({.B = 1, .T = 8, .H = 2, .Dh = 7}, DType::F16, Device::cuda(0), &why)) << why;
  EXPECT_FALSE(rope_supports({.B = 1, .T = 8, .H = 2, .Dh = 64}, DType::F16, Device::cpu(), &why));
}

}  // namespace
}  // namespace tessera::test
