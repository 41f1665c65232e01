// PyTorch as an oracle for the general attention call on the CPU: the reference's forward and backward (fp64,
// through the Tensor entries) on random inputs of awkward shapes, written out for tests/oracle/attention_oracle.py,
// which recomputes them with torch (explicit softmax with repeat_interleave, and scaled_dot_product_attention with
// enable_gqa where torch has it). Skipped when TESSERA_PYTHON cannot import torch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/core/context.h"
#include "tessera/ops/attention/attention.h"
#include "test_util.h"

namespace tessera {
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

// Runs the case on the CPU entries (contiguous (B, T, heads, Dh) tensors) and writes inputs and results.
void write_case(const std::filesystem::path& dir, int index, const OracleCase& c, std::mt19937_64& rng) {
  const int64_t nq = int64_t{c.B} * c.Tq * c.H * c.Dh, nk = int64_t{c.B} * c.Tk * c.Hkv * c.Dh;
  std::vector<double> q = test::randn<double>(nq, rng, 1.5), k = test::randn<double>(nk, rng, 1.5);
  std::vector<double> v = test::randn<double>(nk, rng), d_out = test::randn<double>(nq, rng);
  std::vector<double> out(nq), lse(int64_t{c.B} * c.H * c.Tq), dq(nq), dk(nk), dv(nk);
  std::vector<int32_t> lens = c.lens;
  AttentionParams p{.B = c.B,
                    .T = c.Tq,
                    .H = c.H,
                    .Dh = c.Dh,
                    .causal = c.causal,
                    .n_kv_heads = c.Hkv,
                    .Tq = c.Tq,
                    .Tk = c.Tk,
                    .q_offset = c.q_offset};
  if (!lens.empty()) p.key_lens = Tensor(lens.data(), DType::I32, {c.B});
  auto t4 = [&](std::vector<double>& x, int T, int heads) {
    return Tensor::strided(x.data(), DType::F64, {c.B, T, heads, c.Dh},
                           {int64_t{T} * heads * c.Dh, heads * c.Dh, c.Dh, 1});
  };
  const Tensor tl(lse.data(), DType::F64, {static_cast<int64_t>(lse.size())});
  Context ctx;
  attention_forward(p, t4(out, c.Tq, c.H), tl, t4(q, c.Tq, c.H), t4(k, c.Tk, c.Hkv), t4(v, c.Tk, c.Hkv), ctx);
  attention_backward(p, t4(dq, c.Tq, c.H), t4(dk, c.Tk, c.Hkv), t4(dv, c.Tk, c.Hkv), t4(d_out, c.Tq, c.H),
                     t4(q, c.Tq, c.H), t4(k, c.Tk, c.Hkv), t4(v, c.Tk, c.Hkv), t4(out, c.Tq, c.H), tl, ctx);
  const std::string stem = "case_" + std::to_string(index);
  std::string lens_json;
  for (size_t i = 0; i < lens.size(); ++i) lens_json += (i ? ", " : "") + std::to_string(lens[i]);
  std::ofstream meta(dir / (stem + ".json"));
  meta << "{\"name\": \"" << c.name << "\", \"B\": " << c.B << ", \"Tq\": " << c.Tq << ", \"Tk\": " << c.Tk
       << ", \"H\": " << c.H << ", \"Hkv\": " << c.Hkv << ", \"Dh\": " << c.Dh
       << ", \"causal\": " << (c.causal ? "true" : "false") << ", \"q_offset\": " << c.q_offset << ", \"lens\": ["
       << lens_json << "]}\n";
  ASSERT_TRUE(meta.good());
  for (auto [name, x] :
       {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"d_out", &d_out}, std::pair{"out", &out},
        std::pair{"lse", &lse}, std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    write_f64(dir / (stem + "_" + name + ".f64"), *x);
}

TEST(AttentionOracle, TorchAgreesOnTheGeneralCall) {
  const std::string probe = std::string(TESSERA_PYTHON) + " -c 'import torch' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << "torch is not importable by " << TESSERA_PYTHON;
  std::mt19937_64 rng(test::test_seed());
  const auto dir = test::temp_dir("attention_oracle");
  const std::vector<OracleCase> cases = {
      {"cross, GQA", 2, 5, 11, 4, 2, 6, false},
      {"cross, MQA, key lengths", 3, 7, 9, 3, 1, 5, false, 0, {9, 4, 1}},
      {"decode step, GQA", 2, 1, 13, 6, 3, 4, true, 12},
      {"chunk at an offset, key lengths", 2, 4, 10, 4, 2, 3, true, 3, {10, 5}},
      {"self, causal, MHA", 1, 8, 8, 2, 2, 7, true},
      {"an empty sequence", 2, 3, 6, 2, 1, 4, true, 2, {0, 6}},
  };
  for (size_t i = 0; i < cases.size(); ++i) write_case(dir, static_cast<int>(i), cases[i], rng);
  const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR +
                          "/tests/oracle/attention_oracle.py '" + dir.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (seed " << test::test_seed() << ")";
}

}  // namespace
}  // namespace tessera
