// tessera bench allreduce: all-reduce time and bandwidth over the ranks that mpirun started (mpirun -np N tessera
// bench allreduce), on MPI over the CPU or NCCL over the GPUs, at each size of --sizes; with --peer, rank 0 then
// runs torch.distributed's all-reduce at the same sizes (bench/peers/allreduce.py under torchrun, one process a
// rank on this host) and the table sets the two side by side. Rank 0 prints the table (the columns of the CS336
// assignment's: target, world size, size, median ms, mean ms, algbw; and busbw) and writes it with --out.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/bench/allreduce.h"
#include "tessera/bench/peer.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/memory.h"
#include "tessera/core/units.h"
#include "tessera/dist/communicator.h"
#include "tessera/dist/data_parallel.h"
#include "tessera/dist/mpi_communicator.h"
#include "tessera/dist/mpi_world.h"
#include "tessera_git_commit.h"  // TESSERA_GIT_COMMIT

#ifdef TESSERA_WITH_NCCL
#include "tessera/dist/nccl_communicator.h"
#endif

#ifndef TESSERA_PEERS_DIR
#define TESSERA_PEERS_DIR "bench/peers"
#endif

namespace tessera::cli {

namespace {

// The advice when a size does not fit: this command's own size flag.
constexpr const char* kSizesHint = "try smaller --sizes";

// The peer's median and mean ms per size in bytes, or a one-line reason why there is none.
struct Peer {
  std::map<size_t, std::pair<double, double>> ms;
  std::string note;
  std::string nccl;  // the NCCL version torch loaded (its figures depend on it as much as on torch)
};

Peer run_peer(int world, const std::string& sizes, const std::string& dtype, const TimingOptions& t) {
  Peer p;
  p.note =
      run_peer_script("-m torch.distributed.run --standalone --nproc_per_node " + std::to_string(world) +
                          " '" TESSERA_PEERS_DIR "/allreduce.py' --which allreduce --sizes " + sizes + " --dtype " +
                          dtype + " --warmup " + std::to_string(t.warmup) + " --iters " + std::to_string(t.iters),
                      "allreduce.py", [&](const nlohmann::json& j) {
                        if (j.contains("nccl")) p.nccl = j["nccl"].get<std::string>();
                        if (!j.contains("bytes") || !j.contains("median_ms") || !j.contains("mean_ms")) return false;
                        p.ms[j["bytes"].get<size_t>()] = {j["median_ms"].get<double>(), j["mean_ms"].get<double>()};
                        return true;
                      });
  return p;
}

std::unique_ptr<Flags> allreduce_flags() {
  auto flags = std::make_unique<Flags>(
      "bench allreduce",
      "Times all-reduce (sum) over the ranks that mpirun started: mpirun -np N tessera bench allreduce.");
  Flags& a = *flags;
  a.add("backend", "mpi-cpu|nccl-cuda",
        "MPI on CPU buffers, or NCCL on GPU buffers (default: nccl-cuda when a GPU is "
        "visible and tessera has NCCL, else mpi-cpu)");
  a.add("sizes", "LIST",
        "comma-separated sizes per rank, KB/MB/GB = 1e3/1e6/1e9 bytes, KiB/MiB/GiB = 2^10/20/30 "
        "(default 1MB,10MB,100MB,1GB)");
  a.add("dtype", "f32|bf16", "element type (default f32; bf16 needs nccl-cuda: MPI cannot add bf16)");
  a.add("warmup", "N", "untimed runs before timing, per size (default 5)");
  a.add("iters", "N", "timed runs per size; the table shows their median and mean (default 20)");
  a.add("comm-timeout", "S", "seconds a collective may wait before the run fails (default 300)");
  a.add("out", "FILE", "also write the table as markdown to FILE (rank 0)");
  a.add_switch("peer",
               "then run bench/peers/allreduce.py under torchrun (same sizes, one process a rank on this host) "
               "and show torch.distributed's figures beside tessera's");
  return flags;
}

int bench_allreduce_ranks(int argc, char** argv, const MpiWorld& world, MpiCommunicator& control) {
  const bool lead = world.rank() == 0;
  const std::unique_ptr<Flags> flags = allreduce_flags();
  Flags& a = *flags;
  TimingOptions timing;
  std::string backend, dtype_s, sizes_s, out;
  std::vector<size_t> sizes;
  double timeout = 300;
  bool help = false;
  run_collectively(
      control,
      [&] {
        help = !a.parse(argc, argv, 3, /*print_help=*/lead);
        if (help) return;
        const GpuInfo gpu = probe_gpu();
        backend = a.str("backend", gpu.available && built_with_nccl() ? "nccl-cuda" : "mpi-cpu");
        TS_CHECK(backend == "mpi-cpu" || backend == "nccl-cuda", "--backend must be mpi-cpu or nccl-cuda, got ",
                 backend);
        TS_CHECK(backend == "mpi-cpu" || built_with_nccl(), "--backend nccl-cuda: this tessera was built without NCCL");
        TS_CHECK(backend == "mpi-cpu" || gpu.available, "--backend nccl-cuda: no GPU is visible");
        dtype_s = a.str("dtype", "f32");
        TS_CHECK(dtype_s == "f32" || dtype_s == "bf16", "--dtype must be f32 or bf16, got ", dtype_s);
        TS_CHECK(dtype_s == "f32" || backend == "nccl-cuda",
                 "--dtype bf16 needs --backend nccl-cuda (MPI cannot add bf16)");
        sizes_s = a.str("sizes", "1MB,10MB,100MB,1GB");
        sizes = parse_sizes(sizes_s);
        const size_t es = dtype_s == "bf16" ? 2 : 4;
        for (const size_t bytes : sizes)
          TS_CHECK(bytes >= es && bytes % es == 0, "--sizes: ", size_name(bytes), " is not a whole number of ", dtype_s,
                   " elements (", es, " bytes)");
        // A size that cannot fit is refused here, by every rank at once in one line, rather than by an allocation
        // that fails on each rank mid-run. MPI: each rank on this host holds one buffer of it in this host's memory,
        // and Open MPI's non-blocking in-place all-reduce scratch of up to twice its size beside it (as measured under
        // ulimit -v: about three times the size a rank in all); NCCL: one on each rank's
        // GPU. The result is checked without a host copy (check_result), so nothing else grows with the size.
        const size_t largest = *std::max_element(sizes.begin(), sizes.end());
        if (backend == "mpi-cpu") {
          const size_t ranks_here = static_cast<size_t>(world.local_size());
          constexpr size_t kMpiCopies = 3;  // the buffer and MPI's scratch
          const std::string where = ranks_here == 1
                                        ? std::string("on the one rank on this host")
                                        : "on each of the " + std::to_string(ranks_here) + " ranks on this host";
          const std::string what = "a " + size_name(largest) + " buffer and MPI's scratch (3 x the size) " + where;
          const size_t per_rank = largest > SIZE_MAX / kMpiCopies ? SIZE_MAX : largest * kMpiCopies;
          check_host_memory(per_rank > SIZE_MAX / ranks_here ? SIZE_MAX : per_rank * ranks_here, what.c_str(),
                            kSizesHint);
        } else {
          TS_CHECK(largest <= gpu.memory_bytes, "out of GPU memory: a ", size_name(largest),
                   " buffer is more than the ", human_bytes(static_cast<double>(gpu.memory_bytes)), " of ", gpu.name,
                   " (", kSizesHint, ")");
        }
        timing = {.warmup = a.integer("warmup", 5), .iters = a.integer("iters", 20)};
        TS_CHECK(timing.warmup >= 0, "--warmup must be >= 0, got ", timing.warmup);
        TS_CHECK(timing.iters >= 1, "--iters must be >= 1, got ", timing.iters);
        timeout = a.number("comm-timeout", timeout);
        TS_CHECK(timeout > 0, "--comm-timeout must be positive, got ", a.str("comm-timeout"));
        out = a.str("out");
        if (a.has("out") && lead) check_output_path("out", out);
      },
      kSizesHint);
  if (help) return 0;
  // Every rank must time the same collectives: ranks given different --sizes failed inside MPI (MPI_ERR_IN_STATUS)
  // instead of being refused. --out and --comm-timeout are each rank's own.
  std::string key = backend + " " + dtype_s + " " + std::to_string(timing.warmup) + " " + std::to_string(timing.iters) +
                    (a.has("peer") ? " peer" : "");
  for (const size_t bytes : sizes) key.append(" ").append(std::to_string(bytes));  // GCC 12 -Wrestrict on " " + s
  // The backend's default follows whether the rank sees a GPU: ranks given the same flags can differ in it.
  check_ranks_agree(control, key, "the benchmark's flags",
                    a.has("backend")
                        ? "flags"
                        : "flags, and give --backend "
                          "(its default is nccl-cuda on a rank that sees a GPU, mpi-cpu on one that does not)");
  control.set_timeout(timeout);
  const DType dtype = dtype_s == "bf16" ? DType::BF16 : DType::F32;
  const int N = world.size();
  const std::string ranks = std::to_string(N) + (N == 1 ? " rank" : " ranks");  // mpirun -np 1 runs too

  std::string device = "cpu";
  std::vector<AllreduceRow> rows;
  {
    std::unique_ptr<Context> ctx;
    std::unique_ptr<Communicator> comm;
    if (backend == "nccl-cuda") {
#ifdef TESSERA_WITH_NCCL
      ctx = std::make_unique<Context>(Device::cuda(world.gpu(probe_gpu().count)));
      comm = std::make_unique<NcclCommunicator>(control, *ctx, timeout);
      device = ctx->gpu().name;
      device.append(", NCCL ").append(NcclCommunicator::library_version());
#endif
    } else {
      ctx = std::make_unique<Context>(Device::cpu());
      comm = std::make_unique<MpiCommunicator>(world, timeout);
    }
    if (lead) {
      std::printf("tessera bench allreduce: %s, %s (%s), %s, %d warm-up + %s per size\n", backend.c_str(),
                  ranks.c_str(), device.c_str(), dtype_s.c_str(), timing.warmup,
                  counted(timing.iters, "timed run").c_str());
      std::fflush(stdout);
    }
    rows = bench_allreduce(*comm, control, *ctx, sizes, dtype, timing);
  }  // the buffers and the communicator go before the peer runs on the same devices

  Peer peer;
  if (a.has("peer")) {
    if (lead) {
      if (backend != "nccl-cuda")
        peer.note = "peer skipped: the torch.distributed peer runs NCCL on GPUs (--backend nccl-cuda)";
      else peer = run_peer(N, sizes_s, dtype_s, timing);
    }
    // The other ranks wait for the peer, which may take minutes: a barrier with a longer bound than a collective's.
    control.set_timeout(std::max(timeout, 3600.0));
    control.barrier();
    control.set_timeout(timeout);
  }
  if (!lead) return 0;

  const bool with_peer = !peer.ms.empty();
  std::string md = "# tessera bench allreduce\n\n";
  md += "- date: " + utc_now() + "\n- commit: " + std::string(TESSERA_GIT_COMMIT) + "\n- backend: " + backend + ", " +
        ranks + ", device " + device + ", " + dtype_s + "\n- " + std::to_string(timing.warmup) + " warm-up + " +
        counted(timing.iters, "timed run") + " per size; a run's time is its slowest rank's (" +
        (backend == "nccl-cuda" ? "cudaEvents from issue to completion" : "host clock") +
        "); algbw = size / time, busbw = algbw x 2(n-1)/n, GB/s = 1e9 bytes/s\n";
  if (!peer.note.empty()) md += "- " + peer.note + "\n";
  if (!peer.nccl.empty()) md.append("- the peer (torch.distributed) loaded NCCL ").append(peer.nccl).append("\n");
  md += "\n| target | world size | size | median ms | mean ms | algbw GB/s | busbw GB/s |";
  md += with_peer ? " torch median ms | torch busbw GB/s | tessera / torch busbw |" : "";
  md += "\n|---|---:|---:|---:|---:|---:|---:|";
  md += with_peer ? "---:|---:|---:|" : "";
  md += "\n";
  for (const AllreduceRow& r : rows) {
    md += "| tessera " + backend + " | " + std::to_string(N) + " | " + size_name(r.bytes) + " | " +
          fmt("%.4f", r.median_ms) + " | " + fmt("%.4f", r.mean_ms) + " | " + fmt("%.2f", r.algbw()) + " | " +
          fmt("%.2f", r.busbw(N)) + " |";
    if (with_peer) {
      const auto it = peer.ms.find(r.bytes);
      if (it == peer.ms.end()) {
        md += " – | – | – |";
      } else {
        const AllreduceRow t{.bytes = r.bytes, .median_ms = it->second.first, .mean_ms = it->second.second};
        md += " " + fmt("%.4f", t.median_ms) + " | " + fmt("%.2f", t.busbw(N)) + " | " +
              fmt("%.1f%%", 100.0 * r.busbw(N) / t.busbw(N)) + " |";
      }
    }
    md += "\n";
  }
  print_bench_markdown(md, out);
  return 0;
}

}  // namespace

int cmd_bench_allreduce(int argc, char** argv) {
  // --help works without mpirun, as every command's does.
  for (int i = 3; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      return allreduce_flags()->parse(argc, argv, 3) ? 2 : 0;
    }
  TS_CHECK(MpiWorld::launched_by_mpi(),
           "bench allreduce: start the ranks with mpirun: mpirun -np N tessera bench "
           "allreduce (one rank a GPU for nccl-cuda)");
  MpiWorld world;
  try {
    MpiCommunicator control(world);
    return bench_allreduce_ranks(argc, argv, world, control);
  } catch (const CollectiveError& e) {
    if (!e.quiet()) std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // An allocation that failed after the checks (memory taken meanwhile, or a GPU's free memory short of its
    // total): the hint is this command's.
    std::string msg = dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory" : e.what();
    if (is_out_of_memory(msg)) msg.append(" (").append(kSizesHint).append(")");
    std::fprintf(stderr, "tessera: error: %s%s\n",
                 msg.starts_with("rank ") ? "" : ("rank " + std::to_string(world.rank()) + ": ").c_str(), msg.c_str());
    world.abort(2);
  }
}

}  // namespace tessera::cli
