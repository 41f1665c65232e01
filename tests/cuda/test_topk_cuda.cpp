// The beam top-k's HARS kernels against the host: over issue 48's matrix (tests/ops/test_topk_cases.h) in f32 and
// bf16, the GPU's picks equal the plain full sort of the keys formed with the GPU's own lse (the order of near-ties
// depends on the last bit of lse), its lse is close to the f64 reference's, and its candidate counts equal those of
// HARS run on the host with the same lse. Outputs are poisoned first. A CUDA-graph replay gives the same picks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "../ops/test_topk_cases.h"
#include "../test_util.h"
#include "cuda_test_util.h"
#include "tessera/core/cuda_graph.h"
#include "tessera/ops/topk/topk.h"

namespace tessera {
namespace {

using test::DeviceArena;

struct GpuTopk {
  std::vector<float> scores, lse;
  std::vector<int32_t> indices, counts;
};

Tensor upload_raw(DeviceArena& dev, DType dt, const void* host, int64_t n, Context& ctx) {
  Tensor t = dev.alloc(dt, n);
  copy_bytes(t.data(), t.device(), host, Device::cpu(), static_cast<size_t>(n) * dtype_size(dt), ctx);
  return t;
}

template <typename T>
std::vector<T> download_raw(const Tensor& t, Context& ctx) {
  std::vector<T> v(t.numel());
  copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size() * sizeof(T), ctx);
  return v;
}

// Runs beam_topk on the GPU (optionally captured into a graph and replayed twice) and reads everything back.
GpuTopk run_gpu(const test::TopkInput& in, Context& ctx, bool graph) {
  const BeamTopkParams& p = in.p;
  DeviceArena dev(ctx);
  const int64_t rows = static_cast<int64_t>(p.B) * p.K;
  const Tensor x = upload_raw(dev, in.dtype, in.data(), rows * p.row_stride(), ctx);
  const Tensor beam = upload_raw(dev, DType::F32, in.beam.data(), rows, ctx);
  const Tensor scores = dev.poisoned(DType::F32, p.B * p.k), indices = dev.poisoned(DType::I32, p.B * p.k);
  const Tensor lse = dev.poisoned(DType::F32, rows), counts = dev.poisoned(DType::I32, rows);
  auto step = [&] { beam_topk(p, scores, indices, lse, counts, x, beam, ctx); };
  if (graph) {
    step();  // the scratch is sized outside the capture
    fill_bytes(scores, 0xff, ctx);
    fill_bytes(indices, 0xff, ctx);
    CudaGraph g;
    g.capture(ctx, "beam_topk", step);
    g.launch(ctx);
    g.launch(ctx);
  } else {
    step();
  }
  ctx.synchronize();
  return {download_raw<float>(scores, ctx), download_raw<float>(lse, ctx), download_raw<int32_t>(indices, ctx),
          download_raw<int32_t>(counts, ctx)};
}

void check_case(const test::TopkInput& in, Context& ctx, bool graph, const std::string& what) {
  const BeamTopkParams& p = in.p;
  const GpuTopk g = run_gpu(in, ctx, graph);
  std::vector<float> lse_ref(p.B * p.K);
  beam_topk_lse_ref(p, in.dtype, lse_ref.data(), in.data());
  for (int r = 0; r < p.B * p.K; ++r) {
    if (std::isinf(lse_ref[r])) {
      ASSERT_EQ(g.lse[r], lse_ref[r]) << what << " row " << r;
    } else {
      ASSERT_NEAR(g.lse[r], lse_ref[r], 2e-5 * std::max(1.0f, std::fabs(lse_ref[r]))) << what << " row " << r;
    }
  }
  test::expect_full_sort(in, g.lse, g.scores, g.indices, what);
  std::vector<float> s(p.B * p.k);
  std::vector<int32_t> i(p.B * p.k), counts(p.B * p.K);
  beam_topk_hars_cpu(p, beam_topk_groups(p.k), in.dtype, s.data(), i.data(), counts.data(), in.data(), in.beam.data(),
                     g.lse.data());
  EXPECT_EQ(g.counts, counts) << what;
}

TEST(BeamTopkCuda, EqualsFullSortOverTheMatrix) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  std::mt19937_64 rng(test::test_seed());
  for (int ki = 0; ki < static_cast<int>(std::size(test::kTopkKs)); ++ki) {
    const int k = test::kTopkKs[ki];
    std::vector<int> vs(std::begin(test::kTopkVs), std::end(test::kTopkVs));
    if (k > 1) vs.insert(vs.begin(), k - 1);
    for (int vi = 0; vi < static_cast<int>(vs.size()); ++vi)
      for (int kind = 0; kind < static_cast<int>(std::size(test::kRowKinds)); ++kind) {
        if (!test::topk_case_sampled(k > 1 ? std::max(vi - 1, 0) : vi, kind, ki)) continue;
        for (DType dt : {DType::F32, DType::BF16}) {
          const int V = vs[vi];
          const BeamTopkParams p{.B = 3, .K = 4, .V = V, .k = k, .ld = (V % 2) ? V + 3 : 0};
          const auto in = test::make_topk_input(p, test::kRowKinds[kind], dt, rng);
          const std::string what = std::string(test::row_kind_name(test::kRowKinds[kind])) + " V " + std::to_string(V) +
                                   " k " + std::to_string(k) + " " + std::string(dtype_name(dt)) + " seed " +
                                   std::to_string(test::test_seed());
          check_case(in, ctx, /*graph=*/false, what);
          if (HasFatalFailure()) return;
        }
      }
  }
}

// The bench's shape, f32 and bf16, run as a graph replay: no host sync or allocation inside the step.
TEST(BeamTopkCuda, GraphReplayAtTheBenchShape) {
  TS_CUDA_CONTEXT_OR_SKIP(ctx);
  if (!cuda_graph_capture_supported()) GTEST_SKIP() << "this build cannot capture (Debug)";
  std::mt19937_64 rng(test::test_seed());
  for (DType dt : {DType::F32, DType::BF16}) {
    const BeamTopkParams p{.B = 32, .K = 4, .V = 50257, .k = 8};
    check_case(test::make_topk_input(p, test::RowKind::Random, dt, rng), ctx, /*graph=*/true,
               std::string("graph ") + std::string(dtype_name(dt)));
  }
}

}  // namespace
}  // namespace tessera
