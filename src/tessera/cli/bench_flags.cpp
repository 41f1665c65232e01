#include "tessera/cli/bench_flags.h"

#include "tessera/core/error.h"

namespace tessera::cli {

void add_bench_run_flags(Flags& a, const std::string& peer_script) {
  a.add("warmup", "N", "untimed runs before timing (default 5)");
  a.add("iters", "N", "timed runs; the table shows their median (default 20)");
  a.add("out", "FILE", "also write the table as markdown to FILE");
  a.add_switch("peer", "run bench/peers/" + peer_script + " (PyTorch) and show its times beside tessera's (GPU only)");
}

TimingOptions bench_timing(const Flags& a) {
  const TimingOptions timing{.warmup = a.integer("warmup", 5), .iters = a.integer("iters", 20)};
  TS_CHECK(timing.warmup >= 0, "--warmup must be >= 0, got ", timing.warmup);
  TS_CHECK(timing.iters >= 1, "--iters must be >= 1, got ", timing.iters);
  return timing;
}

Context bench_context(const Flags& a) {
  return a.has("device") ? Context::from_name(a.str("device")) : Context::best_available();
}

std::string bench_dtype(const Flags& a, const Context& ctx) {
  const std::string dtype_name = a.str("dtype", ctx.is_cuda() ? "bf16" : "f32");
  TS_CHECK(dtype_name == "f32" || dtype_name == "bf16", "--dtype must be f32 or bf16, got ", dtype_name);
  TS_CHECK(ctx.is_cuda() || dtype_name == "f32", "--dtype ", dtype_name,
           ": the CPU reference computes in f32 (use --dtype f32, or --device cuda)");
  return dtype_name;
}

}  // namespace tessera::cli
