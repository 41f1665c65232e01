// tessera/dist/communicator.h — collectives over the ranks of a data-parallel run, on one device kind.
//
// N ranks each hold a tensor x_r of the same shape and dtype. With element i of rank r written x_r[i]:
//   all_reduce      x[i]  ← Σ_r x_r[i]                        (Sum)  or  (1/N) Σ_r x_r[i]  (Avg), on every rank
//   reduce_scatter  in: (N·n), out: (n);  out[i] ← Σ_r in_r[rank·n + i]   (or the average)
//   all_gather      in: (n),   out: (N·n); out[r·n + i] ← in_r[i]
//   broadcast       x[i]  ← x_root[i]
//   barrier         returns once every rank has entered it
// Every collective must be called by every rank in the same order with the same sizes (MPI's and NCCL's rule).
//
// Each operation is asynchronous: it returns a CommHandle, and the data may be read or written again only after
// handle.wait(). The sync forms are the async ones followed by wait(). wait() never blocks longer than the
// communicator's timeout: a peer that died or stalled, or a collective that the ranks issued in different
// orders, becomes an Error naming the operation, its size and this rank, instead of a hang. After such an error
// the communicator is unusable; the process is expected to end (the CLI aborts the whole job, MPI_Abort).
//
// Backends: MpiCommunicator (mpi_communicator.h, CPU tensors) and NcclCommunicator (nccl_communicator.h, GPU
// tensors on the context's device).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"

namespace tessera {

// An error that every rank raises at the same point, from values they all hold (a gathered check, a failure that
// the ranks agreed on): the job can end cleanly (MPI_Finalize) instead of aborting. One rank reports it; on the
// others it is quiet, and the CLI prints nothing for them.
class CollectiveError : public Error {
 public:
  CollectiveError(const char* file, int line, const std::string& msg, bool quiet)
      : Error(file, line, msg), quiet_(quiet) {}
  bool quiet() const { return quiet_; }

 private:
  bool quiet_;
};

enum class ReduceOp { Sum, Avg };

// One operation in flight, as a backend keeps it. test() never blocks; wait() blocks (bounded by the timeout)
// and throws Error on a timeout or a failed collective.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// The handle of an asynchronous collective: move-only, and empty (complete) when default-made.
class CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(std::unique_ptr<PendingOp> op) : op_(std::move(op)) {}
  CommHandle(CommHandle&&) noexcept = default;
  CommHandle& operator=(CommHandle&& o) noexcept;
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  // Waits for an operation still in flight, since its buffers may be freed next. While an exception unwinds the
  // stack the operation is abandoned instead (the process is about to end; waiting could take the whole timeout).
  ~CommHandle();

  // Blocks until the operation has completed (its result is in place); idempotent.
  void wait();
  // Without blocking: drives progress (MPI makes progress only inside its calls) and says whether it completed.
  bool test();
  bool pending() const { return op_ != nullptr; }

 private:
  void finish_or_abandon() noexcept;
  std::unique_ptr<PendingOp> op_;
};

// Counts of what a communicator issued: tests check that accumulation micro-steps communicate nothing.
struct CommStats {
  int64_t ops = 0;    // collectives issued
  int64_t bytes = 0;  // their payload (the tensor each rank passes; in for reduce_scatter, out for all_gather)
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where its tensors must live: the CPU (MPI) or the GPU of the context it was made for (NCCL).
  virtual Device device() const = 0;
  virtual std::string backend() const = 0;  // "mpi-cpu", "nccl-cuda"
  // Seconds that wait() may block before it fails; <= 0 waits without a bound.
  double timeout() const { return timeout_s_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }

  // x: contiguous, any shape. In place.
  virtual CommHandle all_reduce_async(const Tensor& x, ReduceOp op) = 0;
  // in: (N·n) contiguous; out: (n) contiguous. out may be in's own slice, in.slice1d(rank·n, n) (in place); in is
  // undefined afterwards apart from that slice.
  virtual CommHandle reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  // in: (n); out: (N·n). in may be out's own slice, out.slice1d(rank·n, n) (in place).
  virtual CommHandle all_gather_async(const Tensor& in, const Tensor& out) = 0;
  virtual CommHandle broadcast_async(const Tensor& x, int root) = 0;
  virtual CommHandle barrier_async() = 0;

  void all_reduce(const Tensor& x, ReduceOp op) { all_reduce_async(x, op).wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) { reduce_scatter_async(in, out, op).wait(); }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out).wait(); }
  void broadcast(const Tensor& x, int root) { broadcast_async(x, root).wait(); }
  void barrier() { barrier_async().wait(); }

  const CommStats& stats() const { return stats_; }

 protected:
  // Checks shared by the backends (device, contiguity, sizes, root); counts the operation.
  void check_all_reduce(const Tensor& x, ReduceOp op);
  void check_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op);
  void check_all_gather(const Tensor& in, const Tensor& out);
  void check_broadcast(const Tensor& x, int root);
  void count(const Tensor& t) {
    ++stats_.ops;
    stats_.bytes += static_cast<int64_t>(t.nbytes());
  }

  double timeout_s_ = 300;
  CommStats stats_;
};

// "all_reduce of 12.5 MB (f32)": how a timeout error names an operation.
std::string describe_collective(const char* op, const Tensor& t);
// The timeout error every backend throws: names the operation, this rank, the timeout and the likely causes.
[[noreturn]] void throw_comm_timeout(const std::string& what, int rank, int size, double timeout_s);
// True when tessera was built with NCCL (CUDA and NCCL found at configure time).
bool built_with_nccl();

}  // namespace tessera
