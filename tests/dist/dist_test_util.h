// Helpers of the MPI test binary (tessera_dist_tests, run by ctest through mpirun with 2 and 4 ranks): the MPI
// runtime of the process, the backends under test, and data shared by the ranks.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/buffer.h"
#include "tessera/core/context.h"
#include "tessera/dist/communicator.h"
#include "tessera/dist/mpi_communicator.h"
#include "tessera/dist/mpi_world.h"
#include "test_util.h"

#ifdef TESSERA_WITH_NCCL
#include "tessera/dist/nccl_communicator.h"
#endif

namespace tessera::test {

// The process's MPI runtime, made by dist_main.cpp before the tests run.
inline MpiWorld*& world_slot() {
  static MpiWorld* w = nullptr;
  return w;
}
inline MpiWorld& world() { return *world_slot(); }

// Seconds any collective of a test may wait: a test that leaves the ranks out of step fails instead of hanging.
constexpr double kTestTimeout = 120;

// The backends every collective and training test runs on. Nccl skips (GTEST_SKIP) where tessera was built
// without NCCL or this host has fewer GPUs than ranks (NCCL needs one GPU a rank); ctest runs it under the
// `cuda` label only.
enum class Backend { Mpi, Nccl };
inline std::string backend_name(const testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::Mpi ? "Mpi" : "Nccl";
}

// Why this backend cannot run here, or "" when it can.
inline std::string backend_unavailable(Backend b) {
  if (b == Backend::Mpi) return "";
  if (!built_with_nccl()) return "tessera was built without NCCL";
  const GpuInfo gpu = probe_gpu();
  if (!gpu.available) return "no GPU visible";
  if (world().local_size() > gpu.count)
    return std::to_string(world().local_size()) + " ranks on this host but only " + std::to_string(gpu.count) + " GPUs";
  return "";
}

// This rank's device for a backend: the CPU for MPI, GPU local_rank % count for NCCL.
inline Device backend_device(Backend b) {
  if (b == Backend::Mpi) return Device::cpu();
  return Device::cuda(world().local_rank() % probe_gpu().count);
}

// A communicator on the backend's device, and what it needs (a context; NCCL bootstraps over MPI).
struct CommUnderTest {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<MpiCommunicator> mpi;
  std::unique_ptr<Communicator> nccl;
  Communicator& comm() { return nccl ? *nccl : *mpi; }
};
inline CommUnderTest make_comm(Backend b) {
  CommUnderTest c;
  c.ctx = std::make_unique<Context>(backend_device(b));
  c.mpi = std::make_unique<MpiCommunicator>(world(), kTestTimeout);
#ifdef TESSERA_WITH_NCCL
  if (b == Backend::Nccl) c.nccl = std::make_unique<NcclCommunicator>(*c.mpi, *c.ctx, kTestTimeout);
#endif
  return c;
}

// A directory that every rank names the same: rank 0 makes it and broadcasts its path.
inline std::filesystem::path shared_dir(const std::string& name, Communicator& control) {
  std::vector<char> path(4096, '\0');
  if (control.rank() == 0) {
    const std::string d = temp_dir("dist_" + name).string();
    std::copy(d.begin(), d.end(), path.begin());
  }
  control.broadcast(Tensor(path.data(), DType::U8, {static_cast<int64_t>(path.size())}), 0);
  return std::filesystem::path(path.data());
}

// A test seed that every rank shares (rank 0's).
inline uint64_t shared_seed(Communicator& control) {
  uint64_t s = test_seed();
  control.broadcast(Tensor(&s, DType::U8, {8}), 0);
  return s;
}

}  // namespace tessera::test
