// The collectives themselves, on every backend, against values computed by hand: element i of rank r holds
// (r + 1) · 2^(i mod 5), so every sum and average below is exact in f32, f64, bf16 and i32 and the checks are
// equalities. Sizes are awkward (1, odd, not a multiple of any chunk, over a million elements), each collective
// runs in place and out of place, and asynchronous operations are waited in another order than issued.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "dist_test_util.h"
#include "tessera/core/dtype.h"

namespace tessera {
namespace {

using test::Backend;

double value(int rank, int64_t i) { return (rank + 1) * static_cast<double>(1 << (i % 5)); }

// Host values -> a Buffer of `dtype` on the communicator's device, and back.
Buffer upload(const std::vector<double>& v, DType dtype, Context& ctx) {
  const size_t es = dtype_size(dtype);
  std::vector<unsigned char> raw(v.size() * es);
  if (dtype == DType::F64) {
    std::memcpy(raw.data(), v.data(), raw.size());
  } else if (dtype == DType::I32) {
    for (size_t i = 0; i < v.size(); ++i) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(raw.data() + i * 4, &x, 4);
    }
  } else if (dtype == DType::U8) {
    for (size_t i = 0; i < v.size(); ++i) raw[i] = static_cast<unsigned char>(v[i]);
  } else {
    const std::vector<float> f(v.begin(), v.end());
    convert_from_f32(f.data(), f.size(), dtype, raw.data());
  }
  Buffer b(std::max<size_t>(raw.size(), 1), ctx.device(), "a test tensor");
  copy_bytes(b.data(), ctx.device(), raw.data(), Device::cpu(), raw.size(), ctx);
  ctx.synchronize();
  return b;
}

std::vector<double> download(const Tensor& t, Context& ctx) {
  const size_t n = static_cast<size_t>(t.numel()), es = dtype_size(t.dtype());
  std::vector<unsigned char> raw(n * es);
  copy_bytes(raw.data(), Device::cpu(), t.data(), t.device(), raw.size(), ctx);
  std::vector<double> out(n);
  if (t.dtype() == DType::F64) {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else if (t.dtype() == DType::I32) {
    for (size_t i = 0; i < n; ++i) {
      int32_t x;
      std::memcpy(&x, raw.data() + i * 4, 4);
      out[i] = x;
    }
  } else if (t.dtype() == DType::U8) {
    for (size_t i = 0; i < n; ++i) out[i] = raw[i];
  } else {
    std::vector<float> f(n);
    convert_to_f32(raw.data(), t.dtype(), n, f.data());
    out.assign(f.begin(), f.end());
  }
  return out;
}

// s / n as the backend computes it from the exact sum s: divided in f32 for f32 tensors (n = 3 is inexact), in
// f64 otherwise (16-bit averages are tested at n = 1 and 2 only, where they are exact).
double average(double s, int n, DType dtype) {
  if (dtype == DType::F32) return static_cast<double>(static_cast<float>(s) / static_cast<float>(n));
  return s / n;
}

Tensor whole(const Buffer& b, DType dtype, int64_t n) { return b.view(dtype, {n}); }

// The number of elements that differ, and the first of them, for one readable failure.
::testing::AssertionResult same(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ; first at " << first << ": got "
                                       << got[first] << ", want " << want[first];
}

class Collectives : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const std::string why = test::backend_unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
    c_ = test::make_comm(GetParam());
  }
  Communicator& comm() { return c_.comm(); }
  Context& ctx() { return *c_.ctx; }
  int N() { return comm().size(); }
  int rank() { return comm().rank(); }
  // The dtypes that add on this backend (MPI cannot add 16-bit floats).
  std::vector<DType> reducible() {
    if (GetParam() == Backend::Mpi) return {DType::F32, DType::F64, DType::I32};
    return {DType::F32, DType::F64, DType::I32, DType::BF16, DType::F16};
  }
  test::CommUnderTest c_;
};

const int64_t kSizes[] = {1, 7, 1000, (int64_t{1} << 20) + 3};

TEST_P(Collectives, AllReduceSumsAndAveragesEveryElement) {
  for (DType dt : reducible()) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        if (op == ReduceOp::Avg && dt == DType::I32) continue;
        std::vector<double> mine(n), want(n);
        for (int64_t i = 0; i < n; ++i) {
          mine[i] = value(rank(), i);
          want[i] = (N() * (N() + 1) / 2) * value(0, i) / (op == ReduceOp::Avg ? N() : 1);
        }
        Buffer b = upload(mine, dt, ctx());
        comm().all_reduce(whole(b, dt, n), op);
        EXPECT_TRUE(same(download(whole(b, dt, n), ctx()), want))
            << dtype_name(dt) << " n=" << n << (op == ReduceOp::Avg ? " avg" : " sum");
      }
    }
  }
}

TEST_P(Collectives, ReduceScatterGivesEachRankItsBlockInAndOutOfPlace) {
  for (DType dt : reducible()) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{333}, int64_t{65537}}) {
      for (bool in_place : {false, true}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
          if (op == ReduceOp::Avg && dt == DType::I32) continue;
          // Rank r's element j of the (N·n) input is value(r, j + 7 r): every rank and block differ.
          std::vector<double> in(N() * n), want(n);
          for (int64_t j = 0; j < N() * n; ++j) in[j] = value(rank(), j + 7 * rank());
          for (int64_t i = 0; i < n; ++i) {
            double s = 0;
            for (int r = 0; r < N(); ++r) s += value(r, rank() * n + i + 7 * r);
            want[i] = op == ReduceOp::Avg ? average(s, N(), dt) : s;
          }
          Buffer bin = upload(in, dt, ctx());
          Buffer bout = upload(std::vector<double>(n, -1), dt, ctx());
          const Tensor tin = whole(bin, dt, N() * n);
          const Tensor tout = in_place ? tin.slice1d(rank() * n, n) : whole(bout, dt, n);
          comm().reduce_scatter(tin, tout, op);
          EXPECT_TRUE(same(download(tout, ctx()), want))
              << dtype_name(dt) << " n=" << n << (in_place ? " in place" : "")
              << (op == ReduceOp::Avg ? " avg" : " sum");
        }
      }
    }
  }
}

TEST_P(Collectives, AllGatherPutsEveryRankInItsSlotInAndOutOfPlace) {
  for (DType dt : {DType::F32, DType::U8, DType::F64}) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{333}, int64_t{65537}}) {
      for (bool in_place : {false, true}) {
        auto v = [&](int r, int64_t i) { return dt == DType::U8 ? (r * 31 + i) % 256 : r * 1000.0 + i % 997; };
        std::vector<double> mine(n), want(N() * n), out(N() * n, -1);
        for (int64_t i = 0; i < n; ++i) mine[i] = v(rank(), i);
        for (int r = 0; r < N(); ++r)
          for (int64_t i = 0; i < n; ++i) want[r * n + i] = v(r, i);
        for (int64_t i = 0; i < n; ++i) out[rank() * n + i] = mine[i];  // in place: this rank's slot holds its input
        Buffer bin = upload(mine, dt, ctx()), bout = upload(out, dt, ctx());
        const Tensor tout = whole(bout, dt, N() * n);
        comm().all_gather(in_place ? tout.slice1d(rank() * n, n) : whole(bin, dt, n), tout);
        EXPECT_TRUE(same(download(tout, ctx()), want)) << dtype_name(dt) << " n=" << n << (in_place ? " in place" : "");
      }
    }
  }
}

TEST_P(Collectives, BroadcastCopiesTheRootEverywhere) {
  for (int root : {0, N() - 1}) {
    for (int64_t n : kSizes) {
      std::vector<double> mine(n), want(n);
      for (int64_t i = 0; i < n; ++i) {
        mine[i] = value(rank(), i) + rank();
        want[i] = value(root, i) + root;
      }
      Buffer b = upload(mine, DType::F32, ctx());
      comm().broadcast(whole(b, DType::F32, n), root);
      EXPECT_TRUE(same(download(whole(b, DType::F32, n), ctx()), want)) << "root " << root << " n=" << n;
    }
  }
}

TEST_P(Collectives, BarrierReturnsOnlyOnceTheLastRankEntered) {
  // CLOCK_MONOTONIC (steady_clock) is one clock for every process of a host, so times compare across ranks.
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  if (rank() == N() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double times[2];
  times[0] = now();  // entry
  comm().barrier();
  times[1] = now();  // exit
  std::vector<double> all(2 * N());
  c_.mpi->all_gather(Tensor(times, DType::F64, {2}), Tensor(all.data(), DType::F64, {2 * N()}));
  const double last_entry = all[2 * (N() - 1)];
  for (int r = 0; r < N(); ++r) EXPECT_GE(all[2 * r + 1], last_entry) << "rank " << r << " left the barrier early";
}

TEST_P(Collectives, AsyncOperationsCompleteWhateverTheWaitOrder) {
  constexpr int kOps = 3;
  const int64_t n = 100003;
  std::vector<Buffer> bufs;
  std::vector<CommHandle> handles;
  for (int k = 0; k < kOps; ++k) {
    std::vector<double> mine(n);
    for (int64_t i = 0; i < n; ++i) mine[i] = value(rank(), i + k);
    bufs.push_back(upload(mine, DType::F32, ctx()));
    handles.push_back(comm().all_reduce_async(whole(bufs.back(), DType::F32, n), ReduceOp::Sum));
  }
  // One is driven to completion with test(), the others waited newest first.
  while (!handles[1].test()) std::this_thread::yield();
  EXPECT_FALSE(handles[1].pending());
  handles[2].wait();
  handles[0].wait();
  handles[0].wait();  // idempotent
  for (int k = 0; k < kOps; ++k) {
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = (N() * (N() + 1) / 2) * value(0, i + k);
    EXPECT_TRUE(same(download(whole(bufs[k], DType::F32, n), ctx()), want)) << "operation " << k;
  }
  // A handle dropped without wait() completes in its destructor (the buffer is then safe to free).
  Buffer b = upload(std::vector<double>(17, 1.0), DType::F32, ctx());
  { CommHandle dropped = comm().all_reduce_async(whole(b, DType::F32, 17), ReduceOp::Sum); }
  EXPECT_TRUE(same(download(whole(b, DType::F32, 17), ctx()), std::vector<double>(17, N())));
}

TEST_P(Collectives, CountsWhatItIssues) {
  Buffer b = upload(std::vector<double>(10, 1.0), DType::F32, ctx());
  const CommStats before = comm().stats();
  comm().all_reduce(whole(b, DType::F32, 10), ReduceOp::Sum);
  comm().broadcast(whole(b, DType::F32, 10), 0);
  EXPECT_EQ(comm().stats().ops - before.ops, 2);
  EXPECT_EQ(comm().stats().bytes - before.bytes, 80);
}

TEST_P(Collectives, RefusesWhatItCannotDoBeforeCommunicating) {
  Buffer b = upload(std::vector<double>(8, 1.0), DType::I32, ctx());
  EXPECT_NE(test::error_of([&] { comm().all_reduce(whole(b, DType::I32, 8), ReduceOp::Avg); }).find("average"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              comm().reduce_scatter(whole(b, DType::I32, 8), whole(b, DType::I32, 3), ReduceOp::Sum);
            }).find("reduce_scatter: in holds 8 elements"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { comm().broadcast(whole(b, DType::I32, 8), N()); }).find("root"), std::string::npos);
  if (GetParam() == Backend::Mpi) {
    Buffer h = upload(std::vector<double>(8, 1.0), DType::BF16, ctx());
    EXPECT_NE(test::error_of([&] {
                comm().all_reduce(whole(h, DType::BF16, 8), ReduceOp::Sum);
              }).find("MPI cannot add BF16"),
              std::string::npos);
  } else {
    std::vector<float> host(8, 1.0f);
    EXPECT_NE(test::error_of([&] {
                comm().all_reduce(Tensor(host.data(), DType::F32, {8}), ReduceOp::Sum);
              }).find("is on cpu"),
              std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives, ::testing::Values(Backend::Mpi, Backend::Nccl), test::backend_name);

// A collective that the other ranks never join fails on the rank that waits, within the timeout, naming the
// operation and the rank, instead of hanging. (MPI only: after a timeout the NCCL communicator is aborted, which
// the CLI's fault tests cover.)
TEST(MpiCommunicator, ACollectiveNobodyJoinsTimesOutNamingItAndTheRank) {
  MpiCommunicator comm(test::world(), /*timeout_s=*/1.0);
  const int N = comm.size();
  // Rank 0's abandoned operation keeps its buffer: the others join late so that MPI can finish it.
  static std::vector<float> data(1000, 1.0f);
  if (comm.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string err =
        test::error_of([&] { comm.all_reduce(Tensor(data.data(), DType::F32, {1000}), ReduceOp::Sum); });
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(err.find("all_reduce of 0.004 MB (F32)"), std::string::npos) << err;
    EXPECT_NE(err.find("rank 0 of " + std::to_string(N)), std::string::npos) << err;
    EXPECT_NE(err.find("--comm-timeout 1 s"), std::string::npos) << err;
    EXPECT_GE(waited, 1.0);
    EXPECT_LT(waited, 30.0);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  MpiCommunicator sync(test::world(), test::kTestTimeout);
  sync.barrier();  // rank 0 has timed out
  if (comm.rank() != 0) {
    std::vector<float> late(1000, 1.0f);
    comm.set_timeout(test::kTestTimeout);
    comm.all_reduce(Tensor(late.data(), DType::F32, {1000}), ReduceOp::Sum);
  } else {
    // Rank 0 drives MPI's progress (its abandoned request) until the others are through.
    sync.barrier();
    return;
  }
  sync.barrier();
}

TEST(MpiCommunicator, GatherToRootTakesUnevenCountsInRankOrder) {
  MpiCommunicator comm(test::world(), test::kTestTimeout);
  const int N = comm.size(), root = N - 1;
  std::vector<size_t> counts(N);
  for (int r = 0; r < N; ++r) counts[r] = r == 1 ? 0 : 3 * r + 5;  // rank 1 sends nothing
  std::vector<float> mine(counts[comm.rank()]);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(comm.rank() * 100 + i);
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<float> out(comm.rank() == root ? total : 0, -1.0f);
  comm.gather_to_root(mine.data(), counts, comm.rank() == root ? out.data() : nullptr, root);
  if (comm.rank() != root) return;
  size_t at = 0;
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < counts[r]; ++i, ++at) EXPECT_EQ(out[at], static_cast<float>(r * 100 + i)) << r << " " << i;
}

}  // namespace
}  // namespace tessera
