#include "tessera/core/trace.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {

// Device primitives: defined in trace_cuda.cu when the CUDA backend is built.
void* trace_event_record(const Context& ctx);
double trace_event_elapsed_us(void* from, void* to);  // waits for `to`
void trace_event_destroy(void* event) noexcept;

#ifndef TESSERA_WITH_CUDA
void nvtx_push(const char*) {}
void nvtx_pop() {}
void* trace_event_record(const Context&) { TS_THROW("this tessera was built without CUDA"); }
double trace_event_elapsed_us(void*, void*) { TS_THROW("this tessera was built without CUDA"); }
void trace_event_destroy(void*) noexcept {}
#endif

Tracer::Tracer(Context& ctx) : ctx_(&ctx) {}

Tracer::~Tracer() {
  for (const Mark& m : marks_)
    if (m.event) trace_event_destroy(m.event);
}

int Tracer::mark() {
  Mark m;
  if (ctx_->is_cuda()) {
    m.event = trace_event_record(*ctx_);
  } else {
    using namespace std::chrono;
    m.host_us = duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
  }
  marks_.push_back(m);
  return static_cast<int>(marks_.size() - 1);
}

void Tracer::begin(const std::string& name) {
  open_.push_back(static_cast<int>(ranges_.size()));
  ranges_.push_back({name, static_cast<int>(open_.size()) - 1, mark(), -1});
}

void Tracer::end() {
  TS_CHECK(!open_.empty(), "trace: end() without an open range");
  ranges_[open_.back()].end = mark();
  open_.pop_back();
}

void Tracer::counter(const std::string& name, double value) { counts_.push_back({name, mark(), value}); }

std::vector<double> Tracer::resolve() const {
  std::vector<double> t(marks_.size(), 0.0);
  for (size_t i = 1; i < marks_.size(); ++i) {
    t[i] = marks_[0].event ? trace_event_elapsed_us(marks_[0].event, marks_[i].event)
                           : marks_[i].host_us - marks_[0].host_us;
  }
  return t;
}

std::vector<Tracer::Slice> Tracer::slices() const {
  TS_CHECK(open_.empty(), "trace: ", open_.size(), " ranges still open (innermost: ", ranges_[open_.back()].name, ")");
  const std::vector<double> t = resolve();
  std::vector<Slice> out;
  out.reserve(ranges_.size());
  for (const Range& r : ranges_) out.push_back({r.name, r.depth, t[r.begin], t[r.end] - t[r.begin]});
  return out;
}

std::vector<Tracer::CounterSample> Tracer::counters() const {
  const std::vector<double> t = resolve();
  std::vector<CounterSample> out;
  for (const Count& c : counts_) out.push_back({c.name, t[c.at], c.value});
  return out;
}

void Tracer::write_chrome_json(const std::string& path, int64_t step) const {
  using json = nlohmann::json;
  json events = json::array();
  const char* track = ctx_->is_cuda() ? "GPU stream (CUDA events)" : "CPU (host clock)";
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", track}}}});
  for (const Slice& s : slices())
    events.push_back({{"name", s.name}, {"ph", "X"}, {"pid", 0}, {"tid", 0}, {"ts", s.start_us}, {"dur", s.dur_us}});
  for (const CounterSample& c : counters())
    events.push_back({{"name", c.name}, {"ph", "C"}, {"pid", 0}, {"ts", c.ts_us}, {"args", {{"value", c.value}}}});
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  if (step >= 0) doc["otherData"] = {{"step", step}};
  write_file_atomic(path, doc.dump() + "\n");
}

}  // namespace tessera
