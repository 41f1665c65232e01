// tessera/core/trace.h — named ranges for profilers: NVTX for nsys, and a Chrome trace for Perfetto.
//
// Two sinks, one call site. `nvtx_push(name)` / `nvtx_pop()` open and close an NVTX range when tessera is built
// with CUDA (nvtx3, header-only; a no-op otherwise and when no profiler is attached), so that `nsys profile`
// followed by `nsys stats --report nvtx_sum` gives a per-range table. A `Tracer`, when the caller makes one,
// also records each range as a slice on its Context:
//   - on a CUDA context the start and the end are CUDA events recorded on the context's stream, so a slice
//     spans the GPU work queued inside it, not the host's time to launch it;
//   - on the CPU context ops run synchronously, and a steady host clock times them.
// Times are resolved only when read (slices(), write_chrome_json()), which waits for the stream once; recording
// never synchronizes. Counters (a name, a value, at the current point of the stream) become Chrome "C" events,
// e.g. the activation memory the plan has live at each op.
//
// The Chrome trace: {"traceEvents": [...], "displayTimeUnit": "ms"}, one complete event ("ph": "X") per range
// with "ts" and "dur" in microseconds from the first mark, nesting given by containment on one track, and one
// "C" event per counter sample, and the step traced in "otherData". chrome://tracing and ui.perfetto.dev open it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/context.h"

namespace tessera {

void nvtx_push(const char* name);
void nvtx_pop();

class Tracer {
 public:
  explicit Tracer(Context& ctx);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Opens a range nested in the open ones, and closes the innermost. Only the slice is recorded here; NVTX is
  // the caller's (TraceScope and Model do both).
  void begin(const std::string& name);
  void end();
  int depth() const { return static_cast<int>(open_.size()); }
  // A counter sample at the current point: host time on the CPU, a CUDA event on the stream on a GPU.
  void counter(const std::string& name, double value);

  struct Slice {
    std::string name;
    int depth = 0;  // 0 for an outermost range
    double start_us = 0, dur_us = 0;
  };
  struct CounterSample {
    std::string name;
    double ts_us = 0, value = 0;
  };
  // Every closed range in the order it was opened, and every counter sample, with resolved times (µs from the
  // first mark). Waits for the context's stream. Throws if a range is still open.
  std::vector<Slice> slices() const;
  std::vector<CounterSample> counters() const;
  // The Chrome trace JSON of all of it, written atomically. step >= 0: the optimizer step traced, as the trace's
  // otherData.step (Chrome's metadata): a trace file did not say which step it held.
  void write_chrome_json(const std::string& path, int64_t step = -1) const;

 private:
  // A point in time: host microseconds on the CPU, or a recorded CUDA event.
  struct Mark {
    double host_us = 0;
    void* event = nullptr;
  };
  int mark();
  std::vector<double> resolve() const;  // every mark in µs from mark 0

  struct Range {
    std::string name;
    int depth, begin, end;
  };
  struct Count {
    std::string name;
    int at;
    double value;
  };
  Context* ctx_;
  std::vector<Mark> marks_;
  std::vector<Range> ranges_;
  std::vector<int> open_;  // indices into ranges_
  std::vector<Count> counts_;
};

// A range for the life of a scope: NVTX always (a no-op without CUDA), and a slice when `tracer` is not null.
class TraceScope {
 public:
  TraceScope(Tracer* tracer, const char* name) : tracer_(tracer) {
    nvtx_push(name);
    if (tracer_) tracer_->begin(name);
  }
  ~TraceScope() {
    if (tracer_) tracer_->end();
    nvtx_pop();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Tracer* tracer_;
};

}  // namespace tessera
