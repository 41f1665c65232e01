#include "tessera/dist/data_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/dist/zero.h"
#include "tessera/train/optimizer.h"

#ifdef TESSERA_WITH_NCCL
#include "tessera/dist/nccl_communicator.h"
#endif

namespace tessera {

namespace {

struct Fault {
  int rank = -1;
  int64_t step = 0;
  bool hang = false;
};

// TESSERA_DIST_FAULT=RANK:STEP:exit|hang (see data_parallel.h); unset: no fault.
Fault read_fault() {
  Fault f;
  const char* spec = std::getenv("TESSERA_DIST_FAULT");
  if (!spec || !*spec) return f;
  char kind[16] = {};
  long long step = 0;
  TS_CHECK(std::sscanf(spec, "%d:%lld:%15s", &f.rank, &step, kind) == 3 &&
               (std::string(kind) == "exit" || std::string(kind) == "hang"),
           "TESSERA_DIST_FAULT must be RANK:STEP:exit|hang, got '", spec, "'");
  f.step = step;
  f.hang = std::string(kind) == "hang";
  return f;
}

// The form of the run's collectives: what its ranks must agree on beyond the training options. Ranks with
// different --ddp, --bucket-mb or --zero would issue different collectives and fail inside MPI ("MPI_ERR_IN_STATUS",
// after a run directory is made) or, for bucket against flat, train on as if they agreed. What the form does
// not use is left out (--ddp under ZeRO-1, --bucket-mb outside bucket). --comm-timeout is each rank's own wait, and
// --comm-sms each GPU's own share (NCCL aligns its channels across the ranks itself).
std::string collective_form(const DataParallelOptions& o) {
  std::string form = o.zero == 1 ? "zero-1" : ddp_mode_name(o.ddp);
  if (o.zero == 0 && o.ddp == DdpMode::Bucket) {
    char mb[32];
    std::snprintf(mb, sizeof mb, " %a MB", o.bucket_mb);  // exact: 0.01 and 0.010000001 differ
    form += mb;
  }
  return form;
}

}  // namespace

DataParallelRun::DataParallelRun(const MpiWorld& world, Context& ctx, const DataParallelOptions& opt)
    : opt_(opt), control_(world, opt.timeout_s) {
  TS_CHECK(opt.zero == 0 || opt.zero == 1, "--zero: only stage 1 is built (--zero 1), got ", opt.zero);
  TS_CHECK(opt.timeout_s > 0, "--comm-timeout must be positive, got ", opt.timeout_s);
  TS_CHECK(opt.bucket_mb > 0, "--bucket-mb must be positive, got ", opt.bucket_mb);
  const Fault fault = read_fault();  // a malformed spec fails at start, not at the step it names
  fault_rank_ = fault.rank;
  fault_step_ = fault.step;
  fault_hang_ = fault.hang;
  if (ctx.is_cuda()) {
#ifdef TESSERA_WITH_NCCL
    grads_ = std::make_unique<NcclCommunicator>(control_, ctx, opt.timeout_s, opt.comm_sms);
    // Only while the collectives overlap the backward (begin_backward to end_backward of a synced step).
    const bool overlaps = opt.zero == 0 && (opt.ddp == DdpMode::Overlap || opt.ddp == DdpMode::Bucket);
    if (overlaps && opt.comm_sms > 0 && world.size() > 1)
      overlap_sm_target_ = std::max(1, ctx.gpu().sm_count - opt.comm_sms);
#else
    TS_THROW("training on ", ctx.device().str(),
             " across ranks needs NCCL, and this tessera was built without it "
             "(NCCL's nccl.h and libnccl were not found at configure time); use --device cpu or rebuild with NCCL");
#endif
  } else {
    grads_ = std::make_unique<MpiCommunicator>(world, opt.timeout_s);
  }
}

DataParallelRun::~DataParallelRun() = default;

void DataParallelRun::check_consistent(uint64_t fingerprint, const std::string& what) {
  Fnv f{fingerprint};
  f.add(collective_form(opt_));
  check_ranks_agree(control_, f.h, what, "flags and data");
}

void check_ranks_agree(Communicator& control, const std::string& key, const std::string& what,
                       const std::string& same) {
  Fnv f;
  f.add(key);
  check_ranks_agree(control, f.h, what, same);
}

void check_ranks_agree(Communicator& control, uint64_t fingerprint, const std::string& what, const std::string& same) {
  const int n = control.size();
  std::vector<uint64_t> all(static_cast<size_t>(n));
  control.all_gather(Tensor(&fingerprint, DType::U8, {8}),
                     Tensor(all.data(), DType::U8, {static_cast<int64_t>(8 * n)}));
  std::string differ;
  int count = 0;
  for (int r = 1; r < n; ++r)
    if (all[r] != all[0]) differ += (count++ ? ", " : "") + std::to_string(r);
  if (count == 0) return;
  throw CollectiveError(__FILE__, __LINE__,
                        detail::concat("the ranks disagree on ", what, ": rank", count > 1 ? "s " : " ", differ,
                                       count > 1 ? " differ" : " differs",
                                       " from rank 0; start every rank with the same ", same),
                        /*quiet=*/control.rank() != 0);
}

void DataParallelRun::attach(Model& model) {
  ParamBuffer& params = model.params();
  TS_CHECK(params.device() == grads_->device(), "data parallel: the model is on ", params.device().str(),
           " but the gradient communicator works on ", grads_->device().str());
  // Rank 0's parameters everywhere (and its f32 master weights, which the optimizer updates).
  grads_->broadcast(params.data(), /*root=*/0);
  if (params.has_master()) grads_->broadcast(params.master(), /*root=*/0);
  model_ = &model;
  if (opt_.zero == 0) sync_ = std::make_unique<GradSync>(*grads_, params, opt_.ddp, opt_.bucket_mb);
}

std::unique_ptr<Optimizer> DataParallelRun::make_optimizer(Model& model, const AdamWConfig& cfg) {
  TS_CHECK(model_ == &model, "internal: make_optimizer before attach");
  if (opt_.zero == 1) return std::make_unique<ZeroAdamW>(model.params(), cfg, *grads_, control_, model.context());
  return std::make_unique<AdamW>(model.params(), cfg, model.context());
}

void DataParallelRun::begin_backward(Model& model, bool sync) {
  TS_CHECK(model_ == &model, "internal: begin_backward before attach");
  if (sync) {
    ++sync_steps_;
    if (fault_rank_ == rank() && fault_step_ == sync_steps_) {
      std::fprintf(stderr, "tessera: TESSERA_DIST_FAULT: rank %d %s at step %lld\n", rank(),
                   fault_hang_ ? "stalls" : "dies", static_cast<long long>(sync_steps_));
      std::fflush(stderr);
      if (!fault_hang_) std::raise(SIGKILL);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  if (sync && overlap_sm_target_ > 0) model.context().set_gemm_sm_target(overlap_sm_target_);
  if (sync_) sync_->begin_backward(model, sync);
}

void DataParallelRun::end_backward(Model& model, bool sync) {
  if (sync_) sync_->end_backward(model, sync);
  if (overlap_sm_target_ > 0) model.context().set_gemm_sm_target(0);
}

void DataParallelRun::sum_host(std::vector<double>& values) {
  // Gathered and summed in rank order on every rank, rather than all-reduced: every rank gets the same bits,
  // so decisions taken on the sums (a new best validation loss, a stop) agree everywhere.
  const int n = world_size();
  const int64_t k = static_cast<int64_t>(values.size());
  if (k == 0) return;
  std::vector<double> all(values.size() * n);
  control_.all_gather(Tensor(values.data(), DType::F64, {k}), Tensor(all.data(), DType::F64, {k * n}));
  for (int64_t i = 0; i < k; ++i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += all[r * k + i];
    values[i] = s;
  }
}

const std::vector<GradRange>& DataParallelRun::buckets() const {
  static const std::vector<GradRange> none;
  return sync_ ? sync_->buckets() : none;
}

void run_collectively(Communicator& control, const std::function<void()>& fn, std::string_view oom_hint) {
  std::string msg;
  int32_t failed = 0;
  try {
    fn();
  } catch (const Error& e) {
    failed = 1;
    msg = e.what();
  } catch (const std::filesystem::filesystem_error& e) {
    // A path from the flags that the file system refuses is bad input on every rank that meets it, as in one
    // process: agreed on like an Error, not a line from each rank and MPI_Abort.
    failed = 1;
    msg = filesystem_error_message(e);
  } catch (const std::bad_alloc&) {
    // Out of host memory in a phase every rank runs (under a ulimit -v, say): one line too, and an agreed end,
    // rather than a line from each rank and MPI_Abort. (A text file read whole says so itself, as an Error.)
    failed = 1;
    msg = "out of memory";
    if (!oom_hint.empty()) msg.append(" (").append(oom_hint).append(")");
  }
  const int n = control.size();
  std::vector<int32_t> all(static_cast<size_t>(n));
  control.all_gather(Tensor(&failed, DType::I32, {1}), Tensor(all.data(), DType::I32, {n}));
  for (int r = 0; r < n; ++r) {
    if (!all[r]) continue;
    const bool reporter = r == control.rank();
    throw CollectiveError(__FILE__, __LINE__, reporter ? msg : "rank " + std::to_string(r) + " failed",
                          /*quiet=*/!reporter);
  }
}

}  // namespace tessera
