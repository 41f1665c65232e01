// tessera/dist/mpi_communicator.h — the Communicator over MPI, on CPU tensors.
//
// Each MpiCommunicator is a duplicate of MPI_COMM_WORLD (MPI_Comm_dup), so the collectives of two of them never
// match each other's: a run keeps one for its gradients and one for the host values of its control plane.
// Collectives are MPI's non-blocking ones (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast,
// MPI_Ibarrier). wait() polls MPI_Testall against the timeout, which is also what drives progress: MPI advances
// a non-blocking collective only inside MPI calls, so CommHandle::test() during backward keeps it moving.
// Sum maps to MPI_SUM; Avg is MPI_SUM followed by x / N on this rank when the operation completes (MPI has no
// average). f32, f64 and i32 reduce; bf16/f16 (which MPI cannot add) and the other dtypes only move.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "tessera/dist/communicator.h"
#include "tessera/dist/mpi_world.h"

namespace tessera {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const MpiWorld& world, double timeout_s = 300);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "mpi-cpu"; }

  CommHandle all_reduce_async(const Tensor& x, ReduceOp op) override;
  CommHandle reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  CommHandle all_gather_async(const Tensor& in, const Tensor& out) override;
  CommHandle broadcast_async(const Tensor& x, int root) override;
  CommHandle barrier_async() override;

  // Beyond the interface, for checkpoints of a sharded optimizer: rank r sends counts[r] floats from `data`;
  // `root` receives them all into `out` (Σ counts of them, in rank order); out is unused on other ranks. Sizes may
  // exceed MPI's int counts (sent in pieces), and the receive is bounded by the timeout.
  void gather_to_root(const float* data, const std::vector<size_t>& counts, float* out, int root);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace tessera
