#include "tessera/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/ops/dispatch.h"

namespace tessera {

void sampler_check(const SamplerParams& p) {
  TS_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "--temperature must be >= 0 (0 is greedy), got ",
           p.temperature);
  TS_CHECK(p.top_k >= 0, "--top-k must be >= 0, got ", p.top_k);
  TS_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got ", p.top_p);  // false for NaN too
}

int32_t sample_token(const SamplerParams& p, const float* logits, int V, uint64_t draw) {
  sampler_check(p);
  TS_CHECK(V > 0, "sample_token: the vocabulary is empty");
  // A NaN would break the strict weak ordering the sort below relies on (undefined behaviour), and an
  // infinity makes the softmax NaN: both mean the model diverged, which sampling must not hide.
  for (int i = 0; i < V; ++i)
    TS_CHECK(std::isfinite(logits[i]), "sampling: logit ", i, " is ",
             std::isnan(logits[i]) ? std::string("NaN") : std::to_string(logits[i]),  // not "-nan": its sign is noise
             " (the model produced NaN or infinite logits)");
  if (p.temperature == 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  // Most likely first; ties by id so the order is deterministic.
  std::sort(idx.begin(), idx.end(),
            [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  int keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  std::vector<double> prob(keep);
  const double mx = logits[idx[0]];
  double z = 0;
  for (int i = 0; i < keep; ++i) z += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  if (p.top_p < 1) {
    double cum = 0;
    int k = 0;
    while (k < keep) {
      cum += prob[k++] / z;
      if (cum >= p.top_p) break;
    }
    keep = k;
    z = 0;
    for (int i = 0; i < keep; ++i) z += prob[i];
  }
  const double u = philox_uniform(p.seed, 0, draw) * z;
  double cum = 0;
  for (int i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Model& model, std::vector<int32_t> tokens, int max_new, const SamplerParams& p,
                              const std::function<void(int32_t)>& on_token) {
  sampler_check(p);
  TS_CHECK(!tokens.empty(), "generate: the prompt is empty");
  const int V = model.config().vocab, max_seq = model.config().max_seq;
  if (max_new <= 0) return tokens;
  // The longest context is the last one: the prompt and all but the last new token, capped at max_seq.
  const size_t longest = tokens.size() + static_cast<size_t>(max_new) - 1;
  model.reserve(1, static_cast<int>(std::min<size_t>(longest, static_cast<size_t>(max_seq))));
  for (int i = 0; i < max_new; ++i) {
    const int T = std::min<int>(static_cast<int>(tokens.size()), max_seq);
    const int32_t* ctx = tokens.data() + tokens.size() - T;
    model.forward(ctx, nullptr, 1, T, {});
    const std::vector<float> last = model.read_logits_row(T - 1);  // one explicit copy of one row
    tokens.push_back(sample_token(p, last.data(), V, i));
    if (on_token) on_token(tokens.back());
  }
  return tokens;
}

void sample_params_check(const SampleParams& p) {
  TS_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "--temperature must be >= 0 (0 is greedy), got ",
           p.temperature);
  TS_CHECK(p.top_k >= 0, "--top-k must be >= 0, got ", p.top_k);
  TS_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got ", p.top_p);  // false for NaN too
  TS_CHECK(p.min_p >= 0 && p.min_p <= 1, "--min-p must be in [0, 1], got ", p.min_p);
  TS_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0,
           "--repetition-penalty must be > 0 (1 is off), got ", p.repetition_penalty);
  TS_CHECK(std::isfinite(p.presence_penalty), "--presence-penalty must be finite, got ", p.presence_penalty);
  TS_CHECK(std::isfinite(p.frequency_penalty), "--frequency-penalty must be finite, got ", p.frequency_penalty);
  TS_CHECK(p.logprobs >= 0 && p.logprobs <= SampleParams::kMaxLogprobs, "--logprobs must be in [0, ",
           SampleParams::kMaxLogprobs, "], got ", p.logprobs);
  TS_CHECK(p.rows >= 0 && p.V > 0 && p.V <= (1 << 24), "sample_rows: needs rows >= 0 and V in [1, 2^24], got rows ",
           p.rows, ", V ", p.V);
  TS_CHECK(p.ld == 0 || p.ld >= p.V, "sample_rows: the row stride ", p.ld, " is below V = ", p.V);
  TS_CHECK(p.n_bias >= 0, "sample_rows: n_bias must be >= 0, got ", p.n_bias);
}

void sampler_bias_check(const std::vector<std::pair<int32_t, float>>& bias, int V) {
  std::set<int32_t> seen;
  for (const auto& [id, b] : bias) {
    TS_CHECK(id >= 0 && id < V, "--logit-bias: token id ", id, " is outside the vocabulary [0, ", V, ")");
    TS_CHECK(seen.insert(id).second, "--logit-bias: token id ", id, " is listed twice");
    TS_CHECK(!std::isnan(b) && b != std::numeric_limits<float>::infinity(), "--logit-bias: the bias of token ", id,
             " must be a number below +inf (-inf bans it), got ", b);
  }
}

void sample_rows(const SampleParams& p, const Tensor& tokens, const Tensor& logits, const Tensor& counts,
                 const Tensor& bias_ids, const Tensor& bias_values, const Tensor& steps, const Tensor& logprob_ids,
                 const Tensor& logprob_values, Context& ctx) {
  constexpr const char* op = "sample_rows";
  sample_params_check(p);
  const DType dt = logits.dtype();
  if (ctx.is_cuda())
    TS_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16, op,
             ": the CUDA kernel samples f32, bf16 or f16 logits, not ", dtype_name(dt));
  else
    TS_CHECK(dt == DType::F32 || dt == DType::F64, op, ": the CPU reference samples f32 or f64 logits, not ",
             dtype_name(dt));
  const int64_t extent = p.rows == 0 ? 0 : (p.rows - 1) * p.row_stride() + p.V;
  TS_CHECK(logits.defined() && logits.device() == ctx.device() && logits.is_contiguous() && logits.numel() >= extent,
           op, ": logits must be a contiguous tensor on ", ctx.device().str(), " of at least ", extent, " elements");
  expect(tokens, op, "tokens", DType::I32, p.rows, ctx);
  expect(steps, op, "steps", DType::I32, p.rows, ctx);
  const int64_t table = static_cast<int64_t>(p.rows) * p.V;
  expect(counts, op, "counts", DType::I32, table, ctx, /*optional=*/!p.penalized() && !p.count_drawn);
  expect(bias_ids, op, "bias_ids", DType::I32, p.n_bias, ctx, /*optional=*/p.n_bias == 0);
  expect(bias_values, op, "bias_values", DType::F32, p.n_bias, ctx, /*optional=*/p.n_bias == 0);
  const int64_t lp = static_cast<int64_t>(p.rows) * p.logprobs;
  expect(logprob_ids, op, "logprob_ids", DType::I32, lp, ctx, /*optional=*/p.logprobs == 0);
  expect(logprob_values, op, "logprob_values", DType::F32, lp, ctx, /*optional=*/p.logprobs == 0);
  auto* steps_u = static_cast<uint32_t*>(steps.data());  // the counters are uint32 held in an i32 tensor
  dispatch(
      ctx, dt, op,
      [&] {
        sample_rows_cuda(p, dt, tokens.as<int32_t>(), logits.data(), counts.as<int32_t>(), bias_ids.as<int32_t>(),
                         bias_values.as<float>(), steps_u, logprob_ids.as<int32_t>(), logprob_values.as<float>(), ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        sample_rows_ref<T>(p, tokens.as<int32_t>(), logits.as<T>(), counts.as<int32_t>(), bias_ids.as<int32_t>(),
                           bias_values.as<float>(), steps_u, logprob_ids.as<int32_t>(), logprob_values.as<float>());
      });
}

void sampler_counts_add(int rows, int V, int max_len, const Tensor& counts, const Tensor& tokens, const Tensor& lengths,
                        Context& ctx) {
  constexpr const char* op = "sampler_counts_add";
  TS_CHECK(rows >= 0 && V > 0 && max_len >= 0, op, ": needs rows >= 0, V > 0 and max_len >= 0");
  expect(counts, op, "counts", DType::I32, static_cast<int64_t>(rows) * V, ctx);
  expect(tokens, op, "tokens", DType::I32, static_cast<int64_t>(rows) * max_len, ctx);
  expect(lengths, op, "lengths", DType::I32, rows, ctx);
  if (on_cuda(ctx, [&] {
        sampler_counts_add_cuda(rows, V, max_len, counts.as<int32_t>(), tokens.as<int32_t>(), lengths.as<int32_t>(),
                                ctx);
      }))
    return;
  for (int n = 0; n < rows; ++n) {
    const int len = lengths.as<int32_t>()[n];
    TS_CHECK(len >= 0 && len <= max_len, op, ": row ", n, " has length ", len, ", outside [0, ", max_len, "]");
    for (int i = 0; i < len; ++i) {
      const int32_t t = tokens.as<int32_t>()[static_cast<size_t>(n) * max_len + i];
      TS_CHECK(t >= 0 && t < V, op, ": row ", n, " holds token ", t, ", outside the vocabulary [0, ", V, ")");
      ++counts.as<int32_t>()[static_cast<size_t>(n) * V + t];
    }
  }
}

}  // namespace tessera
