// Tensor-level beam top-k: checks, then the full-sort reference (CPU) or the HARS kernels (CUDA).
#include "tessera/ops/topk/topk.h"
#include "tessera/ops/dispatch.h"

namespace tessera {

bool beam_topk_supports(const BeamTopkParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.B < 0 || p.K < 1 || p.V < 1) {
    if (why) *why = "needs B >= 0, K >= 1 and V >= 1";
    return false;
  }
  if (p.k < 1 || p.k > kTopkMaxK) {
    if (why) *why = "k must lie in [1, " + std::to_string(kTopkMaxK) + "], got " + std::to_string(p.k);
    return false;
  }
  if (p.ld != 0 && p.ld < p.V) {
    if (why) *why = "the row stride ld must be 0 (packed) or at least V";
    return false;
  }
  if (static_cast<int64_t>(p.K) * p.V > INT32_MAX) {
    if (why) *why = "K * V must fit the int32 candidate index";
    return false;
  }
  return true;
}

void beam_topk(const BeamTopkParams& p, const Tensor& scores, const Tensor& indices, const Tensor& lse,
               const Tensor& counts, const Tensor& logits, const Tensor& beam_scores, Context& ctx) {
  constexpr const char* op = "beam_topk";
  const DType dt = logits.dtype();
  std::string why;
  require_supported(beam_topk_supports(p, dt, ctx.device(), &why), op, why);
  const int64_t rows = static_cast<int64_t>(p.B) * p.K;
  // The view may stop at the last row's V-th column, or cover whole padded rows.
  const int64_t extent = rows ? (rows - 1) * p.row_stride() + p.V : 0;
  TS_CHECK(logits.defined() && logits.device() == ctx.device() && logits.is_contiguous(), op,
           ": logits must be a contiguous tensor on ", ctx.device().str());
  TS_CHECK(logits.numel() == extent || logits.numel() == rows * p.row_stride(), op, ": logits has ", logits.numel(),
           " elements ", logits.shape_str(), ", expected ", extent, " or ", rows * p.row_stride());
  expect(beam_scores, op, "beam_scores", DType::F32, rows, ctx);
  expect(scores, op, "scores", DType::F32, static_cast<int64_t>(p.B) * p.k, ctx);
  expect(indices, op, "indices", DType::I32, static_cast<int64_t>(p.B) * p.k, ctx);
  expect(lse, op, "lse", DType::F32, rows, ctx);
  expect(counts, op, "counts", DType::I32, rows, ctx, /*optional=*/true);
  if (on_cuda(ctx, [&] {
        const size_t cand = static_cast<size_t>(rows) * p.k;
        char* ws = static_cast<char*>(ctx.scratch(cand * (sizeof(float) + sizeof(int32_t))));
        beam_topk_cuda(p, dt, scores.as<float>(), indices.as<int32_t>(), lse.as<float>(), counts.as<int32_t>(),
                       logits.data(), beam_scores.as<float>(), reinterpret_cast<float*>(ws),
                       reinterpret_cast<int32_t*>(ws + cand * sizeof(float)), ctx);
      }))
    return;
  beam_topk_lse_ref(p, dt, lse.as<float>(), logits.data());
  beam_topk_sort_ref(p, dt, scores.as<float>(), indices.as<int32_t>(), logits.data(), beam_scores.as<float>(),
                     lse.as<float>());
  // The reference has no retrieve: its candidates are every selectable key of the row.
  if (counts.defined())
    for (int64_t r = 0; r < rows; ++r) counts.as<int32_t>()[r] = p.V;
}

}  // namespace tessera
