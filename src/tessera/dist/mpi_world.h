// tessera/dist/mpi_world.h — the MPI runtime of one process, as an RAII object: MPI_Init_thread in the constructor,
// MPI_Finalize in the destructor. mpirun (or mpiexec, srun with PMI) starts N processes; each holds one MpiWorld.
//
// A process that no MPI launcher started never initialises MPI (launched_by_mpi() is false): `tessera train` on
// its own stays a plain single process, with no MPI runtime behind it.
#pragma once

namespace tessera {

class MpiWorld {
 public:
  // True when an MPI launcher started this process: it set the environment of OpenMPI (OMPI_COMM_WORLD_SIZE),
  // of PMI (PMI_SIZE: MPICH, Intel MPI) or of PMIx (PMIX_RANK).
  static bool launched_by_mpi();

  // Initialises MPI with MPI_THREAD_FUNNELED (only the main thread calls MPI; the CPU kernels' OpenMP threads
  // never do). Throws Error when MPI is already initialised.
  MpiWorld();
  // MPI_Finalize, unless abort() ran. Finalize waits for the other ranks: a rank that fails alone aborts instead.
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes on this host, and their count (MPI_COMM_TYPE_SHARED): a GPU rank takes device
  // local_rank (gpu() below).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // The GPU of this rank among the host's gpu_count: local_rank. More ranks on the host than GPUs is an error
  // (NCCL refuses two ranks on one GPU, late and from every rank): said up front, in one line.
  int gpu(int gpu_count) const;

  // Ends every process of the job (MPI_Abort on MPI_COMM_WORLD) with exit code `code`.
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace tessera
