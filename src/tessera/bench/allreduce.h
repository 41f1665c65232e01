// tessera/bench/allreduce.h — the rows of `tessera bench allreduce`: all-reduce (sum) over the ranks that mpirun
// started, through a Communicator, at each of a list of sizes.
//
// Each timed run: a host barrier over MPI (every rank starts together), then one all-reduce of `bytes` of the
// dtype. MPI (CPU): the host's steady clock around the blocking collective. NCCL (GPU): a cudaEvent on the compute
// stream before the collective is issued and one on the communicator's stream after it, so the figure is the
// device time from issue to completion, as torch.distributed's peer (bench/peers/allreduce.py) measures with events
// around dist.all_reduce. A run lasts until its slowest rank is done, so the time of a run is the largest of the
// ranks' (all-gathered); the table gives the median and the mean of those.
//   algbw = bytes / time;   busbw = algbw · 2(n − 1)/n   (the bytes each rank moves in a ring all-reduce, as
//   nccl-tests defines it), in GB/s of 1e9 bytes.
// After timing, one more all-reduce of known values (rank r holds r + 1) is checked: Σ = n(n + 1)/2.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/dist/communicator.h"

namespace tessera {

struct AllreduceRow {
  size_t bytes = 0;
  double median_ms = 0, mean_ms = 0;
  double algbw() const { return static_cast<double>(bytes) / (median_ms * 1e-3) / 1e9; }
  double busbw(int world) const { return algbw() * 2.0 * (world - 1) / world; }
};

// comm: the collective under test, on ctx's device; control: MPI on the host (barriers, gathering the times).
std::vector<AllreduceRow> bench_allreduce(Communicator& comm, Communicator& control, Context& ctx,
                                          const std::vector<size_t>& sizes, DType dtype, const TimingOptions& timing);

// "1MB,10MB,100MB,1GB" -> bytes (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024; a bare number is bytes).
std::vector<size_t> parse_sizes(const std::string& list);
// 1000000 -> "1 MB", 1048576 -> "1 MiB", 1500 -> "1500 B".
std::string size_name(size_t bytes);

// ---- CUDA side (allreduce_cuda.cu; built with TESSERA_WITH_CUDA). ----
// Milliseconds between two events on `after` (the communicator's stream) recorded before and after launch().
double time_launch_cuda(Context& ctx, Stream after, const std::function<CommHandle()>& launch);

}  // namespace tessera
