// Tensor-level cross-entropy: checks, then the reference (CPU) or the CUDA kernels.
#include <algorithm>

#include "tessera/ops/dispatch.h"
#include "tessera/ops/loss/cross_entropy.h"

namespace tessera {

bool cross_entropy_supports(const CrossEntropyParams& p, DType dtype, Device device, std::string* why) {
  if (!supports_dtype(dtype, device, why)) return false;
  if (p.N < 0 || p.V <= 0) {
    if (why) *why = "needs N >= 0 and V > 0";
    return false;
  }
  if (p.ld != 0 && p.ld < p.V) {
    if (why) *why = "the row stride ld must be 0 (packed) or at least V";
    return false;
  }
  if (!(p.label_smoothing >= 0.0f && p.label_smoothing <= 1.0f)) {
    if (why) *why = "label_smoothing must lie in [0, 1]";
    return false;
  }
  return true;
}

namespace {
// The elements a logits tensor holds: N·V packed, N·ld with a row stride (the view covers whole padded rows).
int64_t logits_extent(const CrossEntropyParams& p) { return static_cast<int64_t>(p.N) * p.row_stride(); }

void check_ce(const char* op, const CrossEntropyParams& p, DType dt, const Context& ctx) {
  std::string why;
  require_supported(cross_entropy_supports(p, dt, ctx.device(), &why), op, why);
}

// The forward's arguments (the fused op's too): the logits' dtype, after every check.
DType check_ce_forward(const char* op, const CrossEntropyParams& p, const Tensor& losses, const Tensor& lse,
                       const Tensor& logits, const Tensor& targets, const Context& ctx) {
  check_ce(op, p, logits.dtype(), ctx);
  const DType dt = logits.dtype(), st = stat_dtype(dt);
  expect(logits, op, "logits", dt, logits_extent(p), ctx);
  expect(targets, op, "targets", DType::I32, p.N, ctx);
  expect(losses, op, "losses", st, p.N, ctx);
  expect(lse, op, "lse", st, p.N, ctx);
  return dt;
}
}  // namespace

void cross_entropy_forward(const CrossEntropyParams& p, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets, Context& ctx) {
  constexpr const char* op = "cross_entropy_forward";
  const DType dt = check_ce_forward(op, p, losses, lse, logits, targets, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        cross_entropy_forward_cuda(p, dt, losses.as<float>(), lse.as<float>(), logits.data(), targets.as<int32_t>(),
                                   ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        cross_entropy_forward_ref<T>(p, losses.as<T>(), lse.as<T>(), logits.as<T>(), targets.as<int32_t>());
      });
}

void cross_entropy_loss_sum(const CrossEntropyParams& p, const Tensor& sum_mean, const Tensor& count,
                            const Tensor& losses, const Tensor& targets, Context& ctx) {
  constexpr const char* op = "cross_entropy_loss_sum";
  const DType st = losses.dtype();
  TS_CHECK(st == DType::F32 || st == DType::F64, op, ": losses must be f32 or f64, got ", dtype_name(st));
  expect(losses, op, "losses", st, p.N, ctx);
  expect(targets, op, "targets", DType::I32, p.N, ctx);
  expect(sum_mean, op, "sum_mean", st, 2, ctx);
  expect(count, op, "count", DType::I32, 1, ctx, /*optional=*/true);
  if (on_cuda(ctx, [&] {
        TS_CHECK(st == DType::F32, op, ": CUDA losses are f32");
        cross_entropy_loss_sum_cuda(p, sum_mean.as<float>(), count.as<int32_t>(), losses.as<float>(),
                                    targets.as<int32_t>(), ctx);
      }))
    return;
  // The host sums in row order in f64, as the CPU model always has.
  const int32_t* y = targets.as<int32_t>();
  double sum = 0;
  int32_t n_counted = 0;
  for (int n = 0; n < p.N; ++n) {
    sum += st == DType::F32 ? static_cast<double>(losses.as<float>()[n]) : losses.as<double>()[n];
    n_counted += y[n] != p.ignore_index;
  }
  const double mean = n_counted ? sum / n_counted : 0.0;
  if (st == DType::F32) {
    sum_mean.as<float>()[0] = static_cast<float>(sum);
    sum_mean.as<float>()[1] = static_cast<float>(mean);
  } else {
    sum_mean.as<double>()[0] = sum;
    sum_mean.as<double>()[1] = mean;
  }
  if (count.defined()) count.as<int32_t>()[0] = n_counted;
}

void cross_entropy_backward(const CrossEntropyParams& p, const Tensor& d_logits, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, double d_loss, const Tensor& count,
                            Context& ctx) {
  constexpr const char* op = "cross_entropy_backward";
  check_ce(op, p, logits.dtype(), ctx);
  const DType dt = logits.dtype(), st = stat_dtype(dt);
  const int64_t NV = logits_extent(p);
  expect(logits, op, "logits", dt, NV, ctx);
  expect(d_logits, op, "d_logits", dt, NV, ctx);
  expect(targets, op, "targets", DType::I32, p.N, ctx);
  expect(lse, op, "lse", st, p.N, ctx);
  expect(count, op, "count", DType::I32, 1, ctx, /*optional=*/true);
  if (on_cuda(ctx, [&] {
        cross_entropy_backward_cuda(p, dt, d_logits.data(), logits.data(), lse.as<float>(), targets.as<int32_t>(),
                                    static_cast<float>(d_loss), count.as<int32_t>(), ctx);
      }))
    return;
  const double scale = count.defined() ? d_loss / std::max(count.as<int32_t>()[0], 1) : d_loss;
  dispatch_ref(dt, op, [&](auto t) {
    using T = decltype(t);
    cross_entropy_backward_ref<T>(p, d_logits.as<T>(), logits.as<T>(), lse.as<T>(), targets.as<int32_t>(), scale);
  });
}

void cross_entropy_forward_backward(const CrossEntropyParams& p, const Tensor& losses, const Tensor& lse,
                                    const Tensor& logits, const Tensor& targets, double d_loss, const Tensor& count,
                                    Context& ctx) {
  constexpr const char* op = "cross_entropy_forward_backward";
  const DType dt = check_ce_forward(op, p, losses, lse, logits, targets, ctx);
  expect(count, op, "count", DType::I32, 1, ctx);
  dispatch(
      ctx, dt, op,
      [&] {
        cross_entropy_forward_backward_cuda(p, dt, losses.as<float>(), lse.as<float>(), logits.data(),
                                            targets.as<int32_t>(), static_cast<float>(d_loss), count.as<int32_t>(),
                                            ctx);
      },
      [&](auto t) {
        using T = decltype(t);
        count.as<int32_t>()[0] =
            static_cast<int32_t>(cross_entropy_forward_backward_ref<T>(p, losses.as<T>(), lse.as<T>(), logits.as<T>(),
                                                                       targets.as<int32_t>(), d_loss));
      });
}

}  // namespace tessera
