#include "tessera/dist/communicator.h"

#include <cstdio>
#include <exception>

#include "tessera/core/error.h"

namespace tessera {

CommHandle& CommHandle::operator=(CommHandle&& o) noexcept {
  if (this != &o) {
    finish_or_abandon();
    op_ = std::move(o.op_);
  }
  return *this;
}

CommHandle::~CommHandle() { finish_or_abandon(); }

void CommHandle::finish_or_abandon() noexcept {
  if (!op_) return;
  if (std::uncaught_exceptions() > 0) {
    // The buffers stay referenced by the backend; the process is on its way out (the CLI aborts the job).
    (void)op_.release();
    return;
  }
  try {
    op_->wait();
  } catch (const std::exception& e) {
    // A handle dropped without wait() whose operation then failed: nothing can carry the error out of a
    // destructor, and continuing would leave the ranks out of step.
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    std::terminate();
  }
  op_.reset();
}

// A failed operation is abandoned, not destroyed: the backend may still reference its buffers and requests, and
// the process is about to end.
void CommHandle::wait() {
  if (!op_) return;
  try {
    op_->wait();
  } catch (...) {
    (void)op_.release();
    throw;
  }
  op_.reset();
}

bool CommHandle::test() {
  if (!op_) return true;
  bool done = false;
  try {
    done = op_->test();
  } catch (...) {
    (void)op_.release();
    throw;
  }
  if (done) op_.reset();
  return done;
}

namespace {
void check_tensor(const Tensor& t, Device device, const char* op, const char* name) {
  TS_CHECK(t.defined(), op, ": ", name, " is undefined");
  TS_CHECK(t.device() == device, op, ": ", name, " is on ", t.device().str(), " but the communicator works on ",
           device.str());
  TS_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got a strided ", t.shape_str());
}
}  // namespace

namespace {
// Integers add on every backend, but their average is not an integer.
void check_average(const Tensor& t, ReduceOp op, const char* what) {
  TS_CHECK(op == ReduceOp::Sum || (t.dtype() != DType::I32 && t.dtype() != DType::U8 && t.dtype() != DType::U16), what,
           ": an average of ", dtype_name(t.dtype()), " values is not an ", dtype_name(t.dtype()));
}
}  // namespace

void Communicator::check_all_reduce(const Tensor& x, ReduceOp op) {
  check_tensor(x, device(), "all_reduce", "x");
  check_average(x, op, "all_reduce");
  count(x);
}

void Communicator::check_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_tensor(in, device(), "reduce_scatter", "in");
  check_tensor(out, device(), "reduce_scatter", "out");
  TS_CHECK(in.dtype() == out.dtype(), "reduce_scatter: in is ", dtype_name(in.dtype()), ", out ",
           dtype_name(out.dtype()));
  TS_CHECK(in.numel() == out.numel() * size(), "reduce_scatter: in holds ", in.numel(), " elements, not ", size(),
           " ranks x ", out.numel());
  check_average(in, op, "reduce_scatter");
  count(in);
}

void Communicator::check_all_gather(const Tensor& in, const Tensor& out) {
  check_tensor(in, device(), "all_gather", "in");
  check_tensor(out, device(), "all_gather", "out");
  TS_CHECK(in.dtype() == out.dtype(), "all_gather: in is ", dtype_name(in.dtype()), ", out ", dtype_name(out.dtype()));
  TS_CHECK(out.numel() == in.numel() * size(), "all_gather: out holds ", out.numel(), " elements, not ", size(),
           " ranks x ", in.numel());
  count(out);
}

void Communicator::check_broadcast(const Tensor& x, int root) {
  check_tensor(x, device(), "broadcast", "x");
  TS_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of ", size());
  count(x);
}

std::string describe_collective(const char* op, const Tensor& t) {
  char buf[128];
  if (!t.defined()) return op;
  std::snprintf(buf, sizeof buf, "%s of %.3g MB (%s)", op, static_cast<double>(t.nbytes()) / 1e6,
                std::string(dtype_name(t.dtype())).c_str());
  return buf;
}

void throw_comm_timeout(const std::string& what, int rank, int size, double timeout_s) {
  TS_THROW("rank ", rank, " of ", size, ": ", what, " did not complete within --comm-timeout ", timeout_s,
           " s: another rank died, stalled, or issued a different collective");
}

#ifndef TESSERA_WITH_NCCL
bool built_with_nccl() { return false; }  // nccl_communicator.cpp defines it otherwise
#endif

}  // namespace tessera
