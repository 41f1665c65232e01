// tessera/cli/bench_flags.h — the flags a one-device bench command shares (bench kernels, optimizer, topk):
// --warmup, --iters, --out and --peer, and the context and dtype it then runs in.
#pragma once
#include <string>

#include "tessera/bench/harness.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"

namespace tessera::cli {

// Adds --warmup, --iters, --out and --peer, in that order; --peer runs bench/peers/<peer_script> (GPU only).
void add_bench_run_flags(Flags& a, const std::string& peer_script);

// --warmup (default 5, >= 0) and --iters (default 20, >= 1).
TimingOptions bench_timing(const Flags& a);
// --device, else the GPU when one is visible, else the CPU.
Context bench_context(const Flags& a);
// --dtype: f32 or bf16 (default bf16 on a GPU, f32 on the CPU, which computes in f32 only).
std::string bench_dtype(const Flags& a, const Context& ctx);

}  // namespace tessera::cli
