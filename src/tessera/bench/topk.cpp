#include "tessera/bench/topk.h"

#include <algorithm>
#include <random>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"

namespace tessera {

namespace {

// Host logits ~ N(0, 3^2) and in `dtype` (f32 or bf16).
std::vector<unsigned char> random_logits(int64_t n, DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = nd(rng);
    if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(x);
    else reinterpret_cast<float*>(bytes.data())[i] = x;
  }
  return bytes;
}

}  // namespace

TopkBench bench_beam_topk(const BeamTopkParams& p, DType dtype, BenchHarness& h, const TimingOptions& timing) {
  Context& ctx = h.context();
  TS_CHECK(dtype == DType::F32 || dtype == DType::BF16, "bench topk: logits in f32 or bf16 only");
  std::string why;
  TS_CHECK(beam_topk_supports(p, dtype, ctx.device(), &why), "bench topk: ", why);
  const int64_t rows = static_cast<int64_t>(p.B) * p.K;
  std::mt19937_64 rng(20261206);
  const auto logits_host = random_logits(rows * p.V, dtype, rng);
  std::vector<float> beam_host(static_cast<size_t>(rows));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& s : beam_host) s = nd(rng);
  Buffer logits_buf(logits_host.size(), ctx.device(), "the bench logits"), beam_buf(rows * 4, ctx.device()),
      scores_buf(p.B * p.k * 4, ctx.device()), indices_buf(p.B * p.k * 4, ctx.device()),
      lse_buf(rows * 4, ctx.device()), counts_buf(rows * 4, ctx.device());
  copy_bytes(logits_buf.data(), ctx.device(), logits_host.data(), Device::cpu(), logits_host.size(), ctx);
  copy_bytes(beam_buf.data(), ctx.device(), beam_host.data(), Device::cpu(), rows * 4, ctx);
  ctx.synchronize();  // the host vectors are read before they go
  const Tensor logits = logits_buf.view(dtype, {rows, p.V}), beam = beam_buf.view(DType::F32, {rows});
  const Tensor scores = scores_buf.view(DType::F32, {p.B, p.k}), indices = indices_buf.view(DType::I32, {p.B, p.k});
  const Tensor lse = lse_buf.view(DType::F32, {rows}), counts = counts_buf.view(DType::I32, {rows});

  TopkBench r;
  r.logit_bytes = static_cast<double>(logits_host.size());
  r.t = h.time([&] { beam_topk(p, scores, indices, lse, Tensor(), logits, beam, ctx); }, timing);
  r.candidates.resize(static_cast<size_t>(rows));
  if (ctx.is_cuda()) {
    beam_topk(p, scores, indices, lse, counts, logits, beam, ctx);
    copy_bytes(r.candidates.data(), Device::cpu(), counts.data(), ctx.device(), rows * 4, ctx);
  } else {
    std::vector<float> s(static_cast<size_t>(p.B) * p.k);
    std::vector<int32_t> i(s.size());
    beam_topk_hars_cpu(p, beam_topk_groups(p.k), dtype, s.data(), i.data(), r.candidates.data(), logits.data(),
                       beam.as<float>(), lse.as<float>());
  }
  return r;
}

std::string topk_candidate_summary(std::vector<int32_t> c) {
  TS_CHECK(!c.empty(), "internal: no candidate counts");
  std::sort(c.begin(), c.end());
  return std::to_string(c.front()) + " / " + std::to_string(c[c.size() / 2]) + " / " + std::to_string(c.back());
}

}  // namespace tessera
