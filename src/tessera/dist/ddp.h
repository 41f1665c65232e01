// tessera/dist/ddp.h — data-parallel gradient averaging in four forms (--ddp), over any Communicator.
//
// After backward on N ranks, each holding the gradient g_r of its own slice of the global batch, every rank needs
// g = (1/N) Σ_r g_r: the gradient of the mean loss over the whole global batch (each rank's loss is the mean over
// the same number of tokens). The four forms compute the same g and differ in when and in how many pieces:
//   naive    one blocking all-reduce per parameter tensor, after backward;
//   flat     one all-reduce over the whole flat gradient buffer, after backward (it is contiguous: no copy);
//   overlap  each parameter's all-reduce starts, asynchronously, as soon as backward reports its gradient final
//            (Model::set_grad_ready_hook: per layer, in reverse order), and the step waits for all of them;
//   bucket   the buffer is cut into buckets of about bucket_mb MB in reverse layer order (contiguous ranges of the
//            flat buffer at segment starts, so a bucket needs no copy); each bucket's all-reduce starts as soon
//            as its last gradient is final.
// Gradient accumulation communicates only on the last micro-step of an optimizer step (sync = true): the sum
// of the micro-steps' gradients is linear, so one reduction of the sum is the reduction of each.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "tessera/dist/communicator.h"
#include "tessera/models/model.h"
#include "tessera/nn/param_buffer.h"

namespace tessera {

enum class DdpMode { Naive, Flat, Overlap, Bucket };

// "naive", "flat", "overlap", "bucket"; anything else is an error that lists them.
DdpMode ddp_mode_from_name(const std::string& name);
const char* ddp_mode_name(DdpMode mode);

// [begin, end) elements of the flat buffers.
struct GradRange {
  size_t begin = 0, end = 0;
};

// The buckets of a parameter buffer: walking its segments from the last down, a bucket closes at the start of the
// segment that brings it to bucket_bytes of gradients or more (a segment larger than that is a bucket alone). The
// ranges descend and cover [0, params.size()) once, padding included (zero, so reducing it changes nothing).
std::vector<GradRange> plan_buckets(const ParamBuffer& params, size_t bucket_bytes);

class GradSync {
 public:
  // comm: on the model's device. The communicator, the buffer and the model must outlive the GradSync.
  GradSync(Communicator& comm, const ParamBuffer& params, DdpMode mode, double bucket_mb);

  // Around model.backward(): with sync, begin installs the model's grad-ready hook (overlap, bucket), and end
  // leaves the averaged gradients in params.grad() (ordered before later work on the model's stream). Without
  // sync (an accumulation micro-step that is not the last) neither communicates.
  void begin_backward(Model& model, bool sync);
  void end_backward(Model& model, bool sync);

  DdpMode mode() const { return mode_; }
  const std::vector<GradRange>& buckets() const { return buckets_; }

 private:
  void on_grad_ready(size_t begin, size_t end);
  void start(size_t begin, size_t end);

  Communicator* comm_;
  const ParamBuffer* params_;
  DdpMode mode_;
  std::vector<GradRange> buckets_;
  std::vector<size_t> order_;  // segment indices by descending offset (overlap)
  std::vector<CommHandle> pending_;
  size_t frontier_ = 0;  // gradients at [frontier_, size) are final in this backward
  size_t next_ = 0;      // next bucket (bucket) or next entry of order_ (overlap) to start
};

}  // namespace tessera
