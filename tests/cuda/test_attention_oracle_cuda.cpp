// PyTorch as an oracle for the general attention call on the GPU, in bf16 and f16: the CUDA entries' forward and
// backward on random inputs of awkward shapes (grouped and multi-query KV heads, Tq != Tk, causal q_offset, key
// lengths with an empty sequence), written out with the inputs as the kernels saw them (rounded to the dtype) for
// tests/oracle/attention_oracle.py, which recomputes everything in fp64 with an explicit softmax over
// repeat_interleave'd heads and with scaled_dot_product_attention(enable_gqa=True) where torch has it.
// The bounds are the dtype's, as the other CUDA attention tests derive them: cuda_tolerance(dt) for out, three
// times that for the gradients relative to max(norm, 0.1 norm(dV)), f32's bound times ten for lse (kept in f32).
// TESSERA_FLASH_PATH picks the flash family per run. Skipped without a GPU or without torch.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/ops/attention/attention.h"

namespace tessera::test {
namespace {

struct OracleCase {
  const char* name;
  int B, Tq, Tk, H, Hkv, Dh;
  bool causal;
  int q_offset = 0;
  std::vector<int32_t> lens = {};
};

void write_f64(const std::filesystem::path& path, const std::vector<double>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(double)));
  ASSERT_TRUE(f.good()) << path;
}

// Runs c on the GPU with contiguous (B, T, heads, Dh) tensors, outputs poisoned first, and writes the case.
void write_gpu_case(const std::filesystem::path& dir, int index, const OracleCase& c, DType dt, Context& ctx,
                    std::mt19937_64& rng) {
  const int64_t nq = int64_t{c.B} * c.Tq * c.H * c.Dh, nk = int64_t{c.B} * c.Tk * c.Hkv * c.Dh;
  const int64_t nl = int64_t{c.B} * c.H * c.Tq;
  const auto q = rounded(dt, randn<double>(nq, rng, 1.5)), k = rounded(dt, randn<double>(nk, rng, 1.5));
  const auto v = rounded(dt, randn<double>(nk, rng)), d_out = rounded(dt, randn<double>(nq, rng));
  AttentionParams p{.B = c.B,
                    .T = c.Tq,
                    .H = c.H,
                    .Dh = c.Dh,
                    .causal = c.causal,
                    .n_kv_heads = c.Hkv,
                    .Tq = c.Tq,
                    .Tk = c.Tk,
                    .q_offset = c.q_offset};
  DeviceArena dev(ctx);
  if (!c.lens.empty()) p.key_lens = dev.upload_i32(c.lens);
  auto t4 = [&](const Tensor& buf, int T, int heads) {
    return Tensor::strided(buf.data(), dt, {c.B, T, heads, c.Dh}, {int64_t{T} * heads * c.Dh, heads * c.Dh, c.Dh, 1},
                           buf.device());
  };
  const Tensor tq = dev.upload(dt, q), tk = dev.upload(dt, k), tv = dev.upload(dt, v), tdo = dev.upload(dt, d_out);
  const Tensor tout = dev.poisoned(dt, nq), tlse = dev.poisoned(DType::F32, nl), tdq = dev.poisoned(dt, nq);
  const Tensor tdk = dev.poisoned(dt, nk), tdv = dev.poisoned(dt, nk);
  attention_forward(p, t4(tout, c.Tq, c.H), tlse, t4(tq, c.Tq, c.H), t4(tk, c.Tk, c.Hkv), t4(tv, c.Tk, c.Hkv), ctx);
  attention_backward(p, t4(tdq, c.Tq, c.H), t4(tdk, c.Tk, c.Hkv), t4(tdv, c.Tk, c.Hkv), t4(tdo, c.Tq, c.H),
                     t4(tq, c.Tq, c.H), t4(tk, c.Tk, c.Hkv), t4(tv, c.Tk, c.Hkv), t4(tout, c.Tq, c.H), tlse, ctx);
  const std::vector<double> out = dev.download(tout), lse = dev.download(tlse), dq = dev.download(tdq);
  const std::vector<double> dk = dev.download(tdk), dv = dev.download(tdv);
  for (const auto* x : {&out, &dq, &dk, &dv})
    for (double e : *x) ASSERT_FALSE(std::isnan(e)) << c.name << ": an output element is NaN (unwritten?)";

  const std::string stem = "case_" + std::to_string(index);
  const std::string family = attention_cuda_kernel_general(p, dt, ctx);
  std::string lens_json;
  for (size_t i = 0; i < c.lens.size(); ++i) lens_json += (i ? ", " : "") + std::to_string(c.lens[i]);
  std::ofstream meta(dir / (stem + ".json"));
  meta << "{\"name\": \"[" << family << "] " << c.name << " " << dtype_label(dt) << " Dh " << c.Dh
       << "\", \"B\": " << c.B << ", \"Tq\": " << c.Tq << ", \"Tk\": " << c.Tk << ", \"H\": " << c.H
       << ", \"Hkv\": " << c.Hkv << ", \"Dh\": " << c.Dh << ", \"causal\": " << (c.causal ? "true" : "false")
       << ", \"q_offset\": " << c.q_offset << ", \"lens\": [" << lens_json << "], \"tol\": " << cuda_tolerance(dt)
       << ", \"grad_tol\": " << 3.0 * cuda_tolerance(dt) << ", \"grad_floor\": " << 0.1 * norm2(dv)
       << ", \"lse_tol\": " << 10.0 * cuda_tolerance(DType::F32) << "}\n";
  ASSERT_TRUE(meta.good());
  for (auto [name, x] :
       {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"d_out", &d_out}, std::pair{"out", &out},
        std::pair{"lse", &lse}, std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    write_f64(dir / (stem + "_" + name + ".f64"), *x);
}

TEST(CudaAttentionOracle, TorchAgreesWithTheGpuInSixteenBits) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  const std::string probe = std::string(TESSERA_PYTHON) + " -c 'import torch' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << "torch is not importable by " << TESSERA_PYTHON;
  std::mt19937_64 rng(test_seed());
  const auto dir = temp_dir("attention_oracle_cuda");
  int index = 0;
  for (DType dt : {DType::BF16, DType::F16})
    for (int Dh : {64, 128, 40}) {
      const std::vector<OracleCase> cases = {
          {"cross, GQA", 2, 70, 133, 4, 2, Dh, false},
          {"cross, MQA, key lengths", 3, 33, 129, 3, 1, Dh, false, 0, {129, 64, 1}},
          {"decode step, GQA", 2, 1, 200, 8, 2, Dh, true, 199},
          {"chunk at an offset, GQA, key lengths", 2, 65, 150, 4, 2, Dh, true, 70, {150, 100}},
          {"self, GQA, causal", 1, 130, 130, 6, 3, Dh, true},
          {"an empty sequence", 2, 17, 40, 2, 2, Dh, false, 0, {0, 40}},
      };
      for (const OracleCase& c : cases) write_gpu_case(dir, index++, c, dt, ctx, rng);
    }
  const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR +
                          "/tests/oracle/attention_oracle.py '" + dir.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (seed " << test_seed() << ")";
}

}  // namespace
}  // namespace tessera::test
