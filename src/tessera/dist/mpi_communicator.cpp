// The MPI backend (mpi_communicator.h describes it).
#include "tessera/dist/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "tessera/dist/mpi_check.h"

namespace tessera {

namespace {

// MPI counts are int: longer element-wise collectives (all_reduce, broadcast) go in pieces of this many elements.
constexpr int64_t kMaxPiece = int64_t{1} << 30;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::U16:
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;  // moved as bits; never reduced (see reducible)
  }
  TS_THROW("internal: no MPI type for dtype ", static_cast<int>(t));
}

void check_reducible(DType t, const char* what) {
  TS_CHECK(t == DType::F32 || t == DType::F64 || t == DType::I32, what, ": MPI cannot add ", dtype_name(t),
           " tensors (F32, F64 and I32 reduce; the CPU path trains in f32)");
}

int checked_count(int64_t n, const char* what) {
  TS_CHECK(n <= INT_MAX, what, ": ", n, " elements per rank exceed MPI's int count");
  return static_cast<int>(n);
}

// x / N in place, after the sum completed (Avg).
void divide(const Tensor& x, int n) {
  const int64_t count = x.numel();
  if (x.dtype() == DType::F32) {
    float* p = x.as<float>();
    for (int64_t i = 0; i < count; ++i) p[i] /= static_cast<float>(n);
  } else {
    double* p = x.as<double>();
    for (int64_t i = 0; i < count; ++i) p[i] /= n;
  }
}

// Requests in flight, with what to do once all of them completed (divide for Avg, move a result into place).
class MpiOp final : public PendingOp {
 public:
  MpiOp(std::string what, int rank, int size, double timeout_s)
      : what_(std::move(what)), rank_(rank), size_(size), timeout_s_(timeout_s) {}

  std::vector<MPI_Request> requests;
  std::function<void()> finish;

  bool test() override {
    if (done_) return true;
    int flag = 0;
    TS_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE));
    if (!flag) return false;
    done_ = true;
    if (finish) finish();
    return true;
  }

  // Polls: spin (yielding) for the first iterations, where small collectives finish, then sleep between polls so
  // that a rank waiting on a slow peer leaves the cores to it (CI runs 4 ranks on 2 cores).
  void wait() override {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (int polls = 0; !test(); ++polls) {
      if (timeout_s_ > 0 && std::chrono::duration<double>(clock::now() - start).count() > timeout_s_)
        throw_comm_timeout(what_, rank_, size_, timeout_s_);
      if (polls < 1000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::string what_;
  int rank_, size_;
  double timeout_s_;
  bool done_ = false;
};

}  // namespace

struct MpiCommunicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
};

MpiCommunicator::MpiCommunicator(const MpiWorld& world, double timeout_s) : impl_(std::make_unique<Impl>()) {
  timeout_s_ = timeout_s;
  TS_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->comm));
  // Failed calls return their code (TS_CHECK_MPI turns it into an Error) instead of aborting inside MPI.
  TS_CHECK_MPI(MPI_Comm_set_errhandler(impl_->comm, MPI_ERRORS_RETURN));
  TS_CHECK_MPI(MPI_Comm_rank(impl_->comm, &rank_));
  TS_CHECK_MPI(MPI_Comm_size(impl_->comm, &size_));
  TS_CHECK(rank_ == world.rank() && size_ == world.size(), "internal: MPI_Comm_dup changed the rank");
}

MpiCommunicator::~MpiCommunicator() {
  if (impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
}

CommHandle MpiCommunicator::all_reduce_async(const Tensor& x, ReduceOp op) {
  check_all_reduce(x, op);
  const std::string what = describe_collective("all_reduce", x);
  check_reducible(x.dtype(), what.c_str());
  auto pending = std::make_unique<MpiOp>(what, rank_, size_, timeout_s_);
  const MPI_Datatype type = mpi_type(x.dtype());
  const size_t esize = dtype_size(x.dtype());
  for (int64_t off = 0; off < x.numel(); off += kMaxPiece) {
    const int n = static_cast<int>(std::min(kMaxPiece, x.numel() - off));
    MPI_Request r;
    TS_CHECK_MPI(
        MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(x.data()) + off * esize, n, type, MPI_SUM, impl_->comm, &r));
    pending->requests.push_back(r);
  }
  if (op == ReduceOp::Avg && size_ > 1) pending->finish = [x, n = size_] { divide(x, n); };
  return CommHandle(std::move(pending));
}

CommHandle MpiCommunicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_reduce_scatter(in, out, op);
  const std::string what = describe_collective("reduce_scatter", in);
  check_reducible(in.dtype(), what.c_str());
  const int n = checked_count(out.numel(), what.c_str());
  const size_t bytes = out.nbytes();
  auto pending = std::make_unique<MpiOp>(what, rank_, size_, timeout_s_);
  const bool in_place = out.data() == static_cast<char*>(in.data()) + rank_ * bytes;
  TS_CHECK(in_place || out.data() >= static_cast<char*>(in.data()) + in.nbytes() ||
               static_cast<char*>(out.data()) + bytes <= in.data(),
           what, ": out overlaps in without being this rank's slice of it");
  MPI_Request r;
  if (in_place) {
    // MPI's in-place form takes the input from the receive buffer (all of in) and leaves the result at its start:
    // move it to this rank's slice afterwards (the slices do not overlap for rank > 0).
    TS_CHECK_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, in.data(), n, mpi_type(in.dtype()), MPI_SUM, impl_->comm, &r));
    pending->finish = [in, out, bytes, rank = rank_, op, size = size_] {
      if (rank > 0) std::memcpy(out.data(), in.data(), bytes);
      if (op == ReduceOp::Avg && size > 1) divide(out, size);
    };
  } else {
    TS_CHECK_MPI(MPI_Ireduce_scatter_block(in.data(), out.data(), n, mpi_type(in.dtype()), MPI_SUM, impl_->comm, &r));
    if (op == ReduceOp::Avg && size_ > 1) pending->finish = [out, size = size_] { divide(out, size); };
  }
  pending->requests.push_back(r);
  return CommHandle(std::move(pending));
}

CommHandle MpiCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_all_gather(in, out);
  const std::string what = describe_collective("all_gather", out);
  const int n = checked_count(in.numel(), what.c_str());
  const bool in_place = in.data() == static_cast<char*>(out.data()) + rank_ * in.nbytes();
  auto pending = std::make_unique<MpiOp>(what, rank_, size_, timeout_s_);
  MPI_Request r;
  // In place, MPI takes this rank's contribution from its own slice of the receive buffer, as NCCL does.
  TS_CHECK_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data(), n, mpi_type(in.dtype()), out.data(), n,
                              mpi_type(out.dtype()), impl_->comm, &r));
  pending->requests.push_back(r);
  return CommHandle(std::move(pending));
}

CommHandle MpiCommunicator::broadcast_async(const Tensor& x, int root) {
  check_broadcast(x, root);
  auto pending = std::make_unique<MpiOp>(describe_collective("broadcast", x), rank_, size_, timeout_s_);
  const size_t esize = dtype_size(x.dtype());
  for (int64_t off = 0; off < x.numel(); off += kMaxPiece) {
    const int n = static_cast<int>(std::min(kMaxPiece, x.numel() - off));
    MPI_Request r;
    TS_CHECK_MPI(MPI_Ibcast(static_cast<char*>(x.data()) + off * esize, n, mpi_type(x.dtype()), root, impl_->comm, &r));
    pending->requests.push_back(r);
  }
  return CommHandle(std::move(pending));
}

CommHandle MpiCommunicator::barrier_async() {
  ++stats_.ops;
  auto pending = std::make_unique<MpiOp>("barrier", rank_, size_, timeout_s_);
  MPI_Request r;
  TS_CHECK_MPI(MPI_Ibarrier(impl_->comm, &r));
  pending->requests.push_back(r);
  return CommHandle(std::move(pending));
}

void MpiCommunicator::gather_to_root(const float* data, const std::vector<size_t>& counts, float* out, int root) {
  TS_CHECK(static_cast<int>(counts.size()) == size_, "gather_to_root: ", counts.size(), " counts for ", size_,
           " ranks");
  TS_CHECK(root >= 0 && root < size_, "gather_to_root: root ", root, " is not a rank of ", size_);
  ++stats_.ops;
  MpiOp pending("gather of the optimizer state to rank " + std::to_string(root), rank_, size_, timeout_s_);
  constexpr int kTag = 7;  // one tag: MPI keeps the pieces from one sender in order
  if (rank_ == root) {
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      for (size_t off = 0; off < counts[r]; off += kMaxPiece) {
        const int n = static_cast<int>(std::min<size_t>(kMaxPiece, counts[r] - off));
        if (r == root) {
          std::memcpy(out + at + off, data + off, n * sizeof(float));
          continue;
        }
        MPI_Request q;
        TS_CHECK_MPI(MPI_Irecv(out + at + off, n, MPI_FLOAT, r, kTag, impl_->comm, &q));
        pending.requests.push_back(q);
      }
      at += counts[r];
    }
  } else {
    for (size_t off = 0; off < counts[rank_]; off += kMaxPiece) {
      const int n = static_cast<int>(std::min<size_t>(kMaxPiece, counts[rank_] - off));
      MPI_Request q;
      TS_CHECK_MPI(MPI_Isend(data + off, n, MPI_FLOAT, root, kTag, impl_->comm, &q));
      pending.requests.push_back(q);
    }
  }
  pending.wait();
}

}  // namespace tessera
