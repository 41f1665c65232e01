#include "tessera/dist/mpi_world.h"

#include <cstdlib>

#include "tessera/core/error.h"
#include "tessera/dist/mpi_check.h"

namespace tessera {

bool MpiWorld::launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return true;
  }
  return false;
}

MpiWorld::MpiWorld() {
  int initialized = 0;
  TS_CHECK_MPI(MPI_Initialized(&initialized));
  TS_CHECK(!initialized, "internal: MPI is already initialised in this process (one MpiWorld per process)");
  int provided = 0;
  TS_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  // Errors on MPI_COMM_WORLD (the local-rank split below) come back as codes, not as MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  TS_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  TS_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MPI_Comm local = MPI_COMM_NULL;
  TS_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  TS_CHECK_MPI(MPI_Comm_rank(local, &local_rank_));
  TS_CHECK_MPI(MPI_Comm_size(local, &local_size_));
  MPI_Comm_free(&local);
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

int MpiWorld::gpu(int gpu_count) const {
  TS_CHECK(gpu_count > 0 && local_size_ <= gpu_count, local_size_, " ranks on this host share its ", gpu_count,
           " GPU(s), but each rank needs a GPU of its own: start at most ", gpu_count,
           " ranks per host, or run on the CPU");
  return local_rank_;
}

void MpiWorld::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] true if it ever did
}

}  // namespace tessera
