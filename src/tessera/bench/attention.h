// tessera/bench/attention.h — the rows of `tessera bench attention`: the CS336 assignment's table (naive against
// flash attention: forward ms, backward ms, memory before and during the backward; out of memory marked and the
// sweep continued) and the TFLOP/s table (causal multi-head, B·T = 32k tokens, width 2048).
//
// "flash" is attention_forward / attention_backward as the model calls them (on a GPU in bf16 / f16 the
// tensor-core FlashAttention-2 kernels, in f32 the tiled kernels; on the CPU the reference); "naive" is
// attention_naive_* (S and P materialized in the compute dtype, GEMMs by the gemm op). Neither applies RoPE (the
// peers do not either): a Llama-style model's attention adds its rotation pass before the forward.
// Memory is the bytes of the buffers the row holds (tessera allocates with cudaMalloc and caches nothing, so this
// is what the device holds for the work, as torch.cuda.max_memory_allocated counts torch's): "before backward"
// = inputs, outputs and what the forward saved; "during backward" adds everything the backward allocates.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tessera/bench/harness.h"
#include "tessera/core/dtype.h"

namespace tessera {

struct AttentionBenchConfig {
  bool small = false;  // tiny shapes (a CPU run takes seconds) instead of the issue's
  DType dtype = DType::BF16;
  float attn_dropout = 0.0f;   // attention dropout in the TFLOP/s table (the CS336 table has none)
  std::vector<int> head_dims;  // the TFLOP/s table's head dims; empty: the sweep's (64, 128; 32, 64 small)
  int gqa = 1;                 // the TFLOP/s table's query heads per KV head (grouped-query attention; 1: MHA)
  TimingOptions timing;
  // Called as each row starts, with what it times ("tessera naive d 16 T 256"): the command's progress.
  std::function<void(const std::string& row)> on_row;
};

// One row of the CS336 table: single head, batch 8, no mask (the assignment's PyTorch-attention benchmark).
struct AttentionMemoryRow {
  std::string impl;  // "tessera naive", "tessera flash"
  int B = 0, T = 0, d = 0;
  bool oom = false;
  Timing fwd, bwd;
  double mib_before_bwd = 0, mib_during_bwd = 0;
};

// One row of the TFLOP/s table: causal, B·T tokens, H = width / Dh heads (rounded down: Dh 80 takes 25 heads),
// H / gqa KV heads (the packed call with grouped heads: qkv rows of (H + 2 H / gqa) Dh). A row whose H gqa does
// not divide is left out.
struct AttentionFlopsRow {
  std::string impl;  // "tessera flash", or "tessera flash (GQA G)"
  int B = 0, T = 0, H = 0, Dh = 0;
  bool oom = false;
  Timing fwd, fwd_bwd;
  double flops_fwd = 0;  // 4 B H T² Dh / 2 (causal); forward + backward counts 3.5x this (FlashAttention's rule)
  double tflops_fwd() const { return flops_fwd / (fwd.median_ms * 1e-3) / 1e12; }
  double tflops_fwd_bwd() const { return 3.5 * flops_fwd / (fwd_bwd.median_ms * 1e-3) / 1e12; }
};

// The sweeps (the issue's, or tiny ones with cfg.small).
struct AttentionSweeps {
  int mem_batch = 8;
  std::vector<int> mem_d, mem_T;
  int flops_tokens = 32768, flops_width = 2048;
  std::vector<int> flops_Dh, flops_T;
  // The rows of the two tables: naive and flash at each (d, T), flash at each (Dh, T) whose width / Dh heads
  // `gqa` divides.
  size_t rows(int gqa = 1) const {
    size_t flops_dims = 0;
    for (int Dh : flops_Dh) flops_dims += (flops_width / Dh) % gqa == 0;
    return 2 * mem_d.size() * mem_T.size() + flops_dims * flops_T.size();
  }
};
AttentionSweeps attention_sweeps(bool small);
// cfg's sweeps: attention_sweeps(cfg.small) with cfg.head_dims, when given, as the TFLOP/s table's head dims.
AttentionSweeps attention_sweeps(const AttentionBenchConfig& cfg);

std::vector<AttentionMemoryRow> bench_attention_memory(const AttentionBenchConfig& cfg, BenchHarness& h);
std::vector<AttentionFlopsRow> bench_attention_flops(const AttentionBenchConfig& cfg, BenchHarness& h);

}  // namespace tessera
