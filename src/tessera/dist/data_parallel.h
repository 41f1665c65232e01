// tessera/dist/data_parallel.h — a data-parallel training run across the ranks that mpirun started: the
// train/ DataParallel seam implemented over MPI (CPU models) or NCCL (GPU models), with DDP in its four forms
// (ddp.h) or ZeRO-1 (zero.h).
//
// Two communicators: `control`, MPI on the host, carries the small agreements of the loop (the fingerprint check,
// the mean loss, stop and checkpoint requests, validation sums, checkpoint gathers) and bootstraps NCCL; the
// gradient communicator carries the gradients and parameters on the model's device (a second MPI communicator for
// a CPU model, NCCL for a GPU one), so that the two streams of collectives never interleave.
//
// Fault injection for the tests (TESSERA_DIST_FAULT=RANK:STEP:exit|hang): rank RANK, as it starts the backward
// of optimizer step STEP (1-based, counted by this object), either dies at once (SIGKILL: a crash) or stops
// making progress for good (a stalled rank), so that the tests can watch the others fail within the timeout.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "tessera/dist/communicator.h"
#include "tessera/dist/ddp.h"
#include "tessera/dist/mpi_communicator.h"
#include "tessera/dist/mpi_world.h"
#include "tessera/train/trainer.h"

namespace tessera {

struct DataParallelOptions {
  DdpMode ddp = DdpMode::Bucket;
  double bucket_mb = 25;   // bucket: about this many MB of gradients per all-reduce
  int zero = 0;            // 1: ZeRO-1 (the gradients are reduce-scattered by the optimizer; ddp is unused)
  double timeout_s = 300;  // --comm-timeout: the longest any collective may wait
  // --comm-sms (NCCL): the CTAs each collective may use (ncclConfig_t::maxCTAs), and, for the forms that overlap
  // the backward (overlap, bucket), the GEMMs of a synced backward plan for the GPU's SMs less these
  // (Context::set_gemm_sm_target, set in begin_backward and reset in end_backward).
  // 0 (the default): NCCL's own choice, and GEMMs on every SM; a cap measured worse scaling
  // (bench/results/2026-11-30-step-and-comm-2xh200.md), so it is off unless asked for.
  int comm_sms = 0;
};

class DataParallelRun final : public DataParallel {
 public:
  // A collective over every rank of `world`. ctx: this rank's device; on a GPU the gradient communicator is NCCL
  // (an error when tessera was built without it). world and ctx must outlive the run.
  DataParallelRun(const MpiWorld& world, Context& ctx, const DataParallelOptions& opt);
  ~DataParallelRun() override;

  int rank() const override { return control_.rank(); }
  int world_size() const override { return control_.size(); }
  void check_consistent(uint64_t fingerprint, const std::string& what) override;
  void attach(Model& model) override;
  std::unique_ptr<Optimizer> make_optimizer(Model& model, const AdamWConfig& cfg) override;
  void begin_backward(Model& model, bool sync) override;
  void end_backward(Model& model, bool sync) override;
  void sum_host(std::vector<double>& values) override;

  Communicator& control() { return control_; }
  Communicator& gradients() { return *grads_; }
  const DataParallelOptions& options() const { return opt_; }
  // The buckets of the attached model (bucket form), for reports and tests.
  const std::vector<GradRange>& buckets() const;

 private:
  DataParallelOptions opt_;
  MpiCommunicator control_;
  std::unique_ptr<Communicator> grads_;
  std::unique_ptr<GradSync> sync_;
  Model* model_ = nullptr;
  int64_t sync_steps_ = 0;  // backward passes with sync begun (the fault injection's step count)
  int fault_rank_ = -1;     // TESSERA_DIST_FAULT, parsed once
  int64_t fault_step_ = 0;
  bool fault_hang_ = false;
  int overlap_sm_target_ = 0;  // --comm-sms: the SMs the GEMMs plan for while collectives overlap; 0: all
};

// Runs `fn` on every rank and agrees on the outcome: when it throws an Error (or a std::filesystem error, worded as
// filesystem_error_message does, or std::bad_alloc, as "out of memory (<oom_hint>)", which is_out_of_memory
// recognises) on any rank, every rank throws a CollectiveError, carrying the message of the lowest failing rank
// there and quiet on the others. So a bad flag, a missing file, a path too long or a host allocation that fails
// ends the job with one line and MPI_Finalize instead of one line per rank and an abort. The hint names the
// command's own flags that size what was allocated.
void run_collectively(Communicator& control, const std::function<void()>& fn, std::string_view oom_hint = {});

// Throws a CollectiveError on every rank when the ranks' fingerprints differ ("the ranks disagree on <what>: rank
// 1 differs from rank 0; start every rank with the same <same>"), quiet on all but rank 0. For what must agree
// before the ranks issue collectives: ranks that disagree on their number or sizes failed inside MPI
// (MPI_ERR_IN_STATUS) or hung until the timeout.
void check_ranks_agree(Communicator& control, uint64_t fingerprint, const std::string& what, const std::string& same);
// The same for a key that must be equal on every rank (compared by a hash of it).
void check_ranks_agree(Communicator& control, const std::string& key, const std::string& what, const std::string& same);

}  // namespace tessera
