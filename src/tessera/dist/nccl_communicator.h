// tessera/dist/nccl_communicator.h — the Communicator over NCCL, on GPU tensors (built when CUDA and NCCL are found).
//
// Bootstrap: rank 0 makes the NCCL unique id and broadcasts it over an MPI communicator; every rank then joins on
// its Context's GPU (each rank its own GPU: NCCL refuses two ranks on one device).
// Streams: the collectives run on a stream of the communicator's own, so that they overlap the compute stream
// (the Context's). Each operation records an event on the compute stream and makes its stream wait for it (the
// tensor is ready), and records a second event after the collective; wait() makes the compute stream wait for
// that one, so later kernels see the result, and the host polls it against the timeout, so that a dead or
// stalled peer becomes an Error rather than a hang (the communicator is aborted, ncclCommAbort).
// The communicator is blocking (a non-blocking one costs more per call): the join runs on a helper thread
// watched against the same timeout, and makes every connection (NCCL_RUNTIME_CONNECT=0), so no later call blocks
// the host on a peer that is gone.
// Sum is ncclSum, Avg ncclAvg. f32, f64, bf16, f16, i32 and u8 reduce; u16 only moves.
#pragma once
#include <memory>

#include "tessera/core/context.h"
#include "tessera/dist/communicator.h"

namespace tessera {

class NcclCommunicator final : public Communicator {
 public:
  // A collective over every rank of `bootstrap` (a CPU communicator, MPI). ctx (a CUDA Context) must outlive
  // the communicator, and the communicator every handle it returned.
  // max_ctas > 0 caps the CTAs (SMs) each collective may use (ncclConfig_t::maxCTAs); 0: NCCL's choice.
  NcclCommunicator(Communicator& bootstrap, Context& ctx, double timeout_s = 300, int max_ctas = 0);
  // ncclCommFinalize + ncclCommDestroy, or ncclCommAbort after a failure; the stream and events are released.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override;
  std::string backend() const override { return "nccl-cuda"; }
  // The NCCL library loaded at run time, "2.27.3" (benchmarks print it: peers may load another one).
  static std::string library_version();

  CommHandle all_reduce_async(const Tensor& x, ReduceOp op) override;
  CommHandle reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  CommHandle all_gather_async(const Tensor& in, const Tensor& out) override;
  CommHandle broadcast_async(const Tensor& x, int root) override;
  CommHandle barrier_async() override;

  // The stream the collectives run on.
  Stream stream() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace tessera
