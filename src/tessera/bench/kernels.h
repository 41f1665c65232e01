// tessera/bench/kernels.h — the rows of `tessera bench kernels` and `tessera bench optimizer`.
//
// Each kernel runs through its Tensor-level entry (ops/<family>/<op>.h) on Buffers filled once with random
// values (host-generated, copied to the device once). A row's bytes count every input read once and every output
// written once (an accumulated output is read and written); each bench function states its formula. GB/s is
// 1e9 bytes/s over the median time.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/core/dtype.h"

namespace tessera {

// small: tiny shapes (a CPU run takes seconds); full: issue 6's shapes (N = 16384 rows of C = 768, d_ff = 3072,
// V = 50257; AdamW over gpt2-124m); large (kernels only): full's widths over 4x the rows, N = 65536. At full's
// sizes the (N, C) kernels move 50-100 MB, and even a copy of that many bytes stays below the 1 GiB copy's rate
// (it pays the launch, ramp and drain that a 1 GiB copy hides); at large's 200-400 MB a copy comes
// close to the 1 GiB rate, so "% of copy" there is close to the kernel's own bandwidth.
// The cross-entropy rows are not run at large: at full their logits already move 3-5 GB, and at large the random
// fill of 3.3G logits on the host would take longer than the rest of the table.
enum class BenchSize { Small, Full, Large };

// The kernel families of `bench kernels`, in table order: a row's kernel name starts with its family's name.
inline constexpr const char* kKernelFamilies[] = {"embedding", "layernorm", "residual",
                                                  "gelu",      "swiglu",    "cross-entropy"};

struct BenchConfig {
  BenchSize size = BenchSize::Small;
  DType dtype = DType::F32;  // compute dtype of the floats (statistics stay f32)
  TimingOptions timing;
  std::vector<std::string> only;  // bench kernels: the families to run (names of kKernelFamilies); empty: all
  // Called with a row's kernel name as its timing starts (the progress bar's line); may be empty.
  std::function<void(const std::string&)> on_row;
  bool wants(const std::string& family) const;
};

// The number of rows bench_kernels (which == "kernels") or bench_optimizer returns for cfg: the progress bar's total.
int bench_row_count(const std::string& which, const BenchConfig& cfg);

// "embedding,layernorm" -> {"embedding", "layernorm"}; throws Error naming the families on an unknown or empty name.
std::vector<std::string> parse_kernel_families(const std::string& list);

struct BenchRow {
  std::string kernel;  // "layernorm fwd", ...; the PyTorch peer prints the same names
  std::string shape;   // "(16384, 768)"
  double bytes = 0;    // bytes moved by one run
  Timing timing;
  double gbs() const { return bytes / (timing.median_ms * 1e-3) / 1e9; }
};

// embedding fwd/bwd (also without a position table, and on Zipf ids), layernorm fwd/bwd, residual fwd/bwd, gelu
// fwd/bwd, swiglu fwd/bwd, cross-entropy fwd+bwd (the families in cfg.only, or all).
std::vector<BenchRow> bench_kernels(const BenchConfig& cfg, BenchHarness& h);
// adamw step over the flat buffers of gpt2-124m (full) or tiny (small), built by Model on the harness's context.
std::vector<BenchRow> bench_optimizer(const BenchConfig& cfg, BenchHarness& h);

}  // namespace tessera
