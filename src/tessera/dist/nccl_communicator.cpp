// The NCCL backend (compiled only when CUDA and NCCL were found; nccl_communicator.h describes it).
#include "tessera/dist/nccl_communicator.h"

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/cuda_check.h"
#include "tessera/dist/nccl_check.h"

namespace tessera {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::U16: return ncclFloat16;  // moved as bits; never reduced (check_reducible)
    case DType::I32: return ncclInt32;
    case DType::U8: return ncclUint8;
  }
  TS_THROW("internal: no NCCL type for dtype ", static_cast<int>(t));
}

void check_reducible(DType t, const std::string& what) {
  TS_CHECK(t != DType::U16, what, ": NCCL cannot add u16 tensors");
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Between polls: yield for the first ones (a collective of a few MB finishes in tens of microseconds), then sleep.
void pause(int polls) {
  if (polls < 1000) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(20));
}

}  // namespace

bool built_with_nccl() { return true; }

struct NcclCommunicator::Impl {
  Context* ctx = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events, free_events;  // every event made, and those not in use
  Buffer barrier_word;                           // one f32 on the device, all-reduced by barrier()
  bool broken = false;                           // aborted after a failure: no more collectives
  int rank = 0, size = 1;
  const double* timeout_s = nullptr;  // the communicator's (it may change after construction)

  // Also when the constructor fails half-way: whatever was made is released. After a failure the communicator was
  // aborted (comm is null) and the stream is not waited for: its kernels may wait on a peer that is gone.
  ~Impl() {
    if (comm) {
      // A blocking communicator's finalize waits for every collective issued, however long: wait for its stream
      // first, bounded by the timeout like every other wait, and abort instead when it does not drain (a rank
      // unwinding from an error with a collective in flight whose peer is gone).
      bool drained = false;
      const auto start = Clock::now();
      for (int polls = 0;; ++polls) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) drained = true;
        if (e != cudaErrorNotReady || (*timeout_s > 0 && seconds_since(start) > *timeout_s)) break;
        pause(polls);
      }
      if (!drained) {
        std::fprintf(stderr, "tessera: warning: rank %d: NCCL work still pending at exit; aborting the communicator\n",
                     rank);
        abort();
      } else {
        try {
          settle(ncclCommFinalize(comm), "finalizing the NCCL communicator");
        } catch (const std::exception& e) {
          std::fprintf(stderr, "tessera: warning: %s\n", e.what());
        }
      }
      if (comm) ncclCommDestroy(comm);
    }
    if (stream) {
      if (!broken) cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }

  cudaEvent_t take_event() {
    if (free_events.empty()) {
      cudaEvent_t e = nullptr;
      TS_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events.push_back(e);
      return e;
    }
    cudaEvent_t e = free_events.back();
    free_events.pop_back();
    return e;
  }
  void give_event(cudaEvent_t e) { free_events.push_back(e); }

  // Ends the communicator after a failure, so that no kernel of it spins on a peer that is gone (ncclCommAbort
  // also frees it).
  void abort() noexcept {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
    broken = true;
  }

  // Throws when NCCL reported an asynchronous error (a peer's connection failed, an internal error).
  void check_async(const std::string& what) {
    TS_CHECK(comm, "rank ", rank, ": ", what, ": the NCCL communicator was aborted after a failure");
    ncclResult_t state = ncclSuccess;
    TS_CHECK_NCCL(ncclCommGetAsyncError(comm, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string msg = std::string(ncclGetErrorString(state)) + " (" + ncclGetLastError(comm) + ")";
      abort();
      TS_THROW("rank ", rank, " of ", size, ": ", what, " failed in NCCL: ", msg);
    }
  }

  // Turns a call's result into an Error (aborting the communicator). The communicator is blocking, so calls return
  // ncclSuccess or an error; ncclInProgress, which only a non-blocking communicator returns, is still polled
  // against the timeout should NCCL ever report it.
  void settle(ncclResult_t result, const std::string& what) {
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string msg = std::string(ncclGetErrorString(result)) + " (" + ncclGetLastError(comm) + ")";
      abort();
      TS_THROW("rank ", rank, " of ", size, ": ", what, " failed in NCCL: ", msg);
    }
    if (result == ncclSuccess) return;
    const auto start = Clock::now();
    for (int polls = 0;; ++polls) {
      ncclResult_t state = ncclInProgress;
      TS_CHECK_NCCL(ncclCommGetAsyncError(comm, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check_async(what);
      if (*timeout_s > 0 && seconds_since(start) > *timeout_s) {
        abort();
        throw_comm_timeout(what, rank, size, *timeout_s);
      }
      pause(polls);
    }
  }
};

namespace {

// One collective on the communicator's stream, between two events (see nccl_communicator.h).
class NcclOp final : public PendingOp {
 public:
  NcclOp(NcclCommunicator::Impl* impl, cudaEvent_t done, std::string what)
      : impl_(impl), done_(done), what_(std::move(what)) {}

  bool test() override {
    if (finished_) return true;
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) {
      impl_->check_async(what_);
      return false;
    }
    TS_CHECK_CUDA(e);
    // Kernels queued on the compute stream from now on see the result.
    TS_CHECK_CUDA(cudaStreamWaitEvent(impl_->ctx->stream(), done_, 0));
    impl_->give_event(done_);
    finished_ = true;
    return true;
  }

  void wait() override {
    TS_CHECK(!impl_->broken, "rank ", impl_->rank, ": ", what_, ": the NCCL communicator was aborted after a failure");
    const auto start = Clock::now();
    for (int polls = 0; !test(); ++polls) {
      if (*impl_->timeout_s > 0 && seconds_since(start) > *impl_->timeout_s) {
        impl_->abort();
        throw_comm_timeout(what_, impl_->rank, impl_->size, *impl_->timeout_s);
      }
      pause(polls);
    }
  }

 private:
  NcclCommunicator::Impl* impl_;
  cudaEvent_t done_;
  std::string what_;
  bool finished_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, Context& ctx, double timeout_s, int max_ctas)
    : impl_(std::make_unique<Impl>()) {
  TS_CHECK(ctx.is_cuda(), "NCCL communicator: needs a CUDA context, got ", ctx.device().str());
  TS_CHECK(bootstrap.device().is_cpu(), "NCCL communicator: the bootstrap communicator must work on the CPU (MPI)");
  timeout_s_ = timeout_s;
  rank_ = bootstrap.rank();
  size_ = bootstrap.size();
  Impl& im = *impl_;
  im.ctx = &ctx;
  im.rank = rank_;
  im.size = size_;
  im.timeout_s = &timeout_s_;
  TS_CHECK_CUDA(cudaSetDevice(ctx.device().index));
  // A high-priority stream: the collectives of overlapped DDP should not queue behind the compute kernels.
  int least = 0, greatest = 0;
  TS_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TS_CHECK_CUDA(cudaStreamCreateWithPriority(&im.stream, cudaStreamNonBlocking, greatest));
  im.barrier_word = Buffer(sizeof(float), ctx.device(), "the NCCL barrier word");
  TS_CHECK_CUDA(cudaMemsetAsync(im.barrier_word.data(), 0, sizeof(float), im.stream));

  ncclUniqueId id{};
  if (rank_ == 0) TS_CHECK_NCCL(ncclGetUniqueId(&id));
  bootstrap.broadcast(Tensor(&id, DType::U8, {static_cast<int64_t>(sizeof id)}), /*root=*/0);
  // A blocking communicator: a non-blocking one costs more per collective call, which overlapped DDP pays once per
  // bucket. Its
  // collectives return once enqueued either way, so they are still watched against the timeout (NcclOp::wait). The
  // join itself blocks: it runs on a helper thread, watched here against the timeout; a join that never ends
  // (a peer gone between the id's broadcast and the join) leaves that thread to the process's exit, and one that
  // ends after the timeout aborts what it made. Every
  // connection is made during the join (NCCL_RUNTIME_CONNECT=0 unless the user set it), so that no later
  // collective blocks the host while connecting to a peer that may be gone.
  // Set for the join only, and unset after it (NCCL reads it once, at its first join), so that a child process
  // started later (bench allreduce's torch peer) inherits the user's environment.
  struct RuntimeConnectOff {
    bool set_here = std::getenv("NCCL_RUNTIME_CONNECT") == nullptr;
    RuntimeConnectOff() {
      if (set_here) setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    }
    ~RuntimeConnectOff() {
      if (set_here) unsetenv("NCCL_RUNTIME_CONNECT");
    }
  } runtime_connect_off;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  if (max_ctas > 0) config.maxCTAs = max_ctas;
  struct Join {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;  // the constructor gave up waiting: a join that completes later aborts its communicator
    ncclResult_t result = ncclSuccess;
    ncclComm_t comm = nullptr;
  };
  auto join = std::make_shared<Join>();
  std::thread([join, id, config, size = size_, rank = rank_, device = ctx.device().index]() mutable {
    cudaSetDevice(device);
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    const std::lock_guard<std::mutex> lock(join->m);
    if (join->abandoned) {
      if (comm) ncclCommAbort(comm);
      return;
    }
    join->result = r;
    join->comm = comm;
    join->done = true;
    join->cv.notify_all();
  }).detach();
  const std::string what = "joining the NCCL communicator on " + ctx.device().str();
  std::unique_lock<std::mutex> lock(join->m);
  if (timeout_s_ > 0) {
    if (!join->cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return join->done; })) {
      join->abandoned = true;
      throw_comm_timeout(what, rank_, size_, timeout_s_);
    }
  } else {
    join->cv.wait(lock, [&] { return join->done; });
  }
  im.comm = join->comm;
  im.settle(join->result, what);
}

NcclCommunicator::~NcclCommunicator() = default;  // Impl's destructor releases everything

std::string NcclCommunicator::library_version() {
  int v = 0;
  TS_CHECK_NCCL(ncclGetVersion(&v));
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  std::string s = std::to_string(v / 10000);
  s.append(".").append(std::to_string(v / 100 % 100)).append(".").append(std::to_string(v % 100));
  return s;
}

Device NcclCommunicator::device() const { return impl_->ctx->device(); }

Stream NcclCommunicator::stream() const { return impl_->stream; }

namespace {

// Orders the collective after the work already queued on the compute stream, runs `enqueue` on the
// communicator's stream, and returns the handle of its completion.
template <typename F>
CommHandle launch(NcclCommunicator::Impl& im, std::string what, F&& enqueue) {
  TS_CHECK(!im.broken, "rank ", im.rank, ": ", what, ": the NCCL communicator was aborted after a failure");
  cudaEvent_t ready = im.take_event();
  TS_CHECK_CUDA(cudaEventRecord(ready, im.ctx->stream()));
  TS_CHECK_CUDA(cudaStreamWaitEvent(im.stream, ready, 0));
  im.give_event(ready);  // the wait above holds the recorded state; the event may be recorded again
  im.settle(enqueue(), what);
  cudaEvent_t done = im.take_event();
  TS_CHECK_CUDA(cudaEventRecord(done, im.stream));
  return CommHandle(std::make_unique<NcclOp>(&im, done, std::move(what)));
}

}  // namespace

CommHandle NcclCommunicator::all_reduce_async(const Tensor& x, ReduceOp op) {
  check_all_reduce(x, op);
  std::string what = describe_collective("all_reduce", x);
  check_reducible(x.dtype(), what);
  Impl& im = *impl_;
  return launch(im, std::move(what), [&] {
    return ncclAllReduce(x.data(), x.data(), static_cast<size_t>(x.numel()), nccl_type(x.dtype()), nccl_op(op), im.comm,
                         im.stream);
  });
}

CommHandle NcclCommunicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_reduce_scatter(in, out, op);
  std::string what = describe_collective("reduce_scatter", in);
  check_reducible(in.dtype(), what);
  Impl& im = *impl_;
  // In place when out is in's slice at rank * n: NCCL's own in-place convention.
  return launch(im, std::move(what), [&] {
    return ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(out.numel()), nccl_type(in.dtype()),
                             nccl_op(op), im.comm, im.stream);
  });
}

CommHandle NcclCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_all_gather(in, out);
  Impl& im = *impl_;
  return launch(im, describe_collective("all_gather", out), [&] {
    return ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()), im.comm,
                         im.stream);
  });
}

CommHandle NcclCommunicator::broadcast_async(const Tensor& x, int root) {
  check_broadcast(x, root);
  Impl& im = *impl_;
  return launch(im, describe_collective("broadcast", x), [&] {
    return ncclBroadcast(x.data(), x.data(), static_cast<size_t>(x.numel()), nccl_type(x.dtype()), root, im.comm,
                         im.stream);
  });
}

CommHandle NcclCommunicator::barrier_async() {
  ++stats_.ops;
  Impl& im = *impl_;
  // NCCL has no barrier: an all-reduce of one word completes only once every rank has issued it.
  return launch(im, "barrier", [&] {
    return ncclAllReduce(im.barrier_word.data(), im.barrier_word.data(), 1, ncclFloat32, ncclSum, im.comm, im.stream);
  });
}

}  // namespace tessera
