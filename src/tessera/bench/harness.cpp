#include "tessera/bench/harness.h"

#include <algorithm>
#include <chrono>

#include "tessera/core/error.h"

namespace tessera {

Timing timing_summary(std::vector<double> ms) {
  TS_CHECK(!ms.empty(), "bench: no timed runs");
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return {.median_ms = median, .min_ms = ms.front(), .max_ms = ms.back(), .iters = static_cast<int>(n)};
}

BenchHarness::BenchHarness(Context& ctx) : ctx_(&ctx) {
  if (ctx.is_cuda()) {
    flush_ = Buffer(kL2FlushBytes, ctx.device(), "the L2-flush scratch of the benchmark");
    fill_bytes(flush_.view(DType::U8, {static_cast<int64_t>(flush_.bytes())}), 0, ctx);
  }
}

Timing BenchHarness::time(const std::function<void()>& fn, const TimingOptions& opt) {
  TS_CHECK(opt.warmup >= 0, "--warmup must be >= 0, got ", opt.warmup);
  TS_CHECK(opt.iters >= 1, "--iters must be >= 1, got ", opt.iters);
  for (int i = 0; i < opt.warmup; ++i) fn();
  ctx_->synchronize();
  if (ctx_->is_cuda()) {
#if TESSERA_WITH_CUDA
    // Reading 128 MiB evicts whatever the previous run left in L2 and leaves it clean (see the header).
    return timing_summary(time_cuda_runs(
        *ctx_, fn, [&] { read_flush_async(flush_.data(), flush_.bytes(), *ctx_); }, opt.iters));
#else
    TS_THROW("bench: this tessera was built without CUDA");
#endif
  }
  std::vector<double> ms;
  ms.reserve(opt.iters);
  for (int i = 0; i < opt.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return timing_summary(std::move(ms));
}

double BenchHarness::copy_bandwidth_gbs(size_t bytes, const TimingOptions& opt) {
  TS_CHECK(ctx_->is_cuda(), "bench: the copy bandwidth is measured on a GPU only");
  if (copy_src_.bytes() < bytes) {
    copy_src_ = Buffer();  // the old pair goes first: two 1 GiB pairs need not fit at once
    copy_dst_ = Buffer();
    copy_src_ = Buffer(bytes, ctx_->device(), "the copy-bandwidth source");
    copy_dst_ = Buffer(bytes, ctx_->device(), "the copy-bandwidth destination");
    fill_bytes(copy_src_.view(DType::U8, {static_cast<int64_t>(bytes)}), 1, *ctx_);
  }
#if TESSERA_WITH_CUDA
  const Timing t = time([&] { copy_d2d_async(copy_dst_.data(), copy_src_.data(), bytes, *ctx_); }, opt);
  return 2.0 * static_cast<double>(bytes) / (t.median_ms * 1e-3) / 1e9;
#else
  TS_THROW("bench: this tessera was built without CUDA");
#endif
}

}  // namespace tessera
