#include "tessera/bench/allreduce.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/core/units.h"

#ifdef TESSERA_WITH_NCCL
#include "tessera/dist/nccl_communicator.h"
#endif

namespace tessera {

namespace {

// The largest of every rank's time for each run (the collective is done when its last rank is).
std::vector<double> slowest_rank(Communicator& control, const std::vector<double>& mine) {
  const int n = control.size();
  const int64_t k = static_cast<int64_t>(mine.size());
  std::vector<double> all(mine.size() * n), copy = mine;
  control.all_gather(Tensor(copy.data(), DType::F64, {k}), Tensor(all.data(), DType::F64, {k * n}));
  std::vector<double> out(mine.size(), 0.0);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) out[i] = std::max(out[i], all[r * k + i]);
  return out;
}

// The elements at both ends and the middle ← rank + 1, all-reduced, then checked on the host against n(n + 1)/2.
// Only those elements travel to and from the host: the size's one buffer is all this benchmark holds, which is what
// bench allreduce checks against the memory before timing (full host copies would add twice the size a rank).
void check_result(Communicator& comm, Context& ctx, const Tensor& x) {
  const int64_t n = x.numel();
  const int r = comm.rank(), N = comm.size();
  const size_t es = dtype_size(x.dtype());
  const int64_t checked[] = {0, n / 2, n - 1};
  for (const int64_t i : checked) {
    unsigned char e[8];
    const float mine = static_cast<float>(r + 1);
    convert_from_f32(&mine, 1, x.dtype(), e);
    copy_bytes(static_cast<char*>(x.data()) + i * es, x.device(), e, Device::cpu(), es, ctx);
  }
  comm.all_reduce(x, ReduceOp::Sum);
  const float want = static_cast<float>(N * (N + 1) / 2);
  for (const int64_t i : checked) {
    unsigned char e[8];
    copy_bytes(e, Device::cpu(), static_cast<const char*>(x.data()) + i * es, x.device(), es, ctx);
    float got = 0;
    convert_to_f32(e, x.dtype(), 1, &got);
    TS_CHECK(got == want, "bench allreduce: element ", i, " of the all-reduce is ", got, ", not ", want,
             ": the collective is wrong");
  }
}

}  // namespace

std::vector<AllreduceRow> bench_allreduce(Communicator& comm, Communicator& control, Context& ctx,
                                          const std::vector<size_t>& sizes, DType dtype, const TimingOptions& timing) {
  TS_CHECK(comm.device() == ctx.device(), "bench allreduce: the communicator works on ", comm.device().str(),
           " but the context is ", ctx.device().str());
  TS_CHECK(timing.iters >= 1 && timing.warmup >= 0, "bench allreduce: --iters must be >= 1 and --warmup >= 0");
  const size_t es = dtype_size(dtype);
  std::vector<AllreduceRow> rows;
  for (const size_t bytes : sizes) {
    TS_CHECK(bytes >= es && bytes % es == 0, "bench allreduce: size ", bytes, " bytes is not a whole number of ",
             dtype_name(dtype), " elements");
    const int64_t n = static_cast<int64_t>(bytes / es);
    Buffer buf(bytes, ctx.device(), "the all-reduce benchmark buffer");
    const Tensor x = buf.view(dtype, {n});
    fill_bytes(x, 0, ctx);  // zeros stay finite under any number of sums
    ctx.synchronize();
    std::vector<double> ms;
    for (int it = 0; it < timing.warmup + timing.iters; ++it) {
      // On GPUs the barrier is the NCCL one (a one-word all-reduce that every rank waits for), as
      // torch.distributed's dist.barrier() is in the peer: the ranks' streams start the timed collective
      // together. An MPI barrier lines up the hosts only: a rank whose launch came later would count as collective
      // time in the slowest rank's figure.
      if (ctx.is_cuda()) comm.barrier();
      else control.barrier();
      double t = 0;
      if (ctx.is_cuda()) {
#ifdef TESSERA_WITH_NCCL
        auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
        TS_CHECK(nccl, "bench allreduce: a GPU context needs the NCCL communicator");
        t = time_launch_cuda(ctx, nccl->stream(), [&] { return comm.all_reduce_async(x, ReduceOp::Sum); });
#else
        TS_THROW("bench allreduce: this tessera was built without NCCL");
#endif
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        comm.all_reduce(x, ReduceOp::Sum);
        t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
      if (it >= timing.warmup) ms.push_back(t);
    }
    const std::vector<double> slowest = slowest_rank(control, ms);
    const Timing summary = timing_summary(slowest);
    const double mean = std::accumulate(slowest.begin(), slowest.end(), 0.0) / static_cast<double>(slowest.size());
    rows.push_back({.bytes = bytes, .median_ms = summary.median_ms, .mean_ms = mean});
    check_result(comm, ctx, x);
  }
  return rows;
}

std::vector<size_t> parse_sizes(const std::string& list) {
  std::vector<size_t> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    at = comma + 1;
    const std::optional<double> bytes = parse_byte_size(item);
    TS_CHECK(bytes && *bytes > 0, "--sizes: '", item, "' is not a size (like 1MB, 10MB, 1GB, 64KiB)");
    // llround of a value past 2^63 is undefined: a size that large is refused before it is rounded.
    TS_CHECK(*bytes <= 1e18, "--sizes: '", item, "' is more than 1 EB");
    out.push_back(static_cast<size_t>(std::llround(*bytes)));
    if (comma == list.size()) break;
  }
  return out;
}

std::string size_name(size_t bytes) {
  char buf[32];
  const struct {
    double scale;
    const char* unit;
  } units[] = {{1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}, {1073741824.0, "GiB"}, {1048576.0, "MiB"}, {1024.0, "KiB"}};
  for (const auto& u : units) {
    const double v = static_cast<double>(bytes) / u.scale;
    if (v >= 1 && std::abs(v - std::round(v)) < 1e-9) {
      std::snprintf(buf, sizeof buf, "%.0f %s", v, u.unit);
      return buf;
    }
  }
  std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

}  // namespace tessera
