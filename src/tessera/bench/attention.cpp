#include "tessera/bench/attention.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/ops/attention/attention.h"
#include "tessera/ops/attention/attention_naive.h"

namespace tessera {

namespace {

// splitmix64 uniform values in [-1, 1): inputs only need to be varied, not from any distribution in particular.
void fill_uniform(void* dst, int64_t n, DType dtype, uint64_t seed, Context& ctx) {
  const size_t es = dtype_size(dtype);
  std::vector<unsigned char> host(static_cast<size_t>(n) * es);
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    const float v = static_cast<float>((z ^ (z >> 31)) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    unsigned char* p = host.data() + static_cast<size_t>(i) * es;
    if (dtype == DType::F32) std::memcpy(p, &v, 4);
    else if (dtype == DType::BF16) {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
    } else if (dtype == DType::F16) {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
    } else TS_THROW("bench attention: random fill of ", dtype_name(dtype), " is not supported");
  }
  copy_bytes(dst, ctx.device(), host.data(), Device::cpu(), host.size(), ctx);
  ctx.synchronize();
}

// The tensors of one attention call, allocated on ctx's device, inputs random.
struct AttentionBuffers {
  Buffer qkv, out, lse, d_out, d_qkv;
  AttentionBuffers(const AttentionParams& p, DType dt, Context& ctx) {
    const int64_t N = static_cast<int64_t>(p.B) * p.T, C = static_cast<int64_t>(p.H) * p.Dh;
    const size_t es = dtype_size(dt);
    const int64_t W = attention_qkv_width(p);  // 3C without grouped heads
    qkv = Buffer(static_cast<size_t>(N * W) * es, ctx.device(), "benchmark qkv");
    out = Buffer(static_cast<size_t>(N * C) * es, ctx.device(), "benchmark attention out");
    lse = Buffer(static_cast<size_t>(N * p.H) * 4, ctx.device(), "benchmark lse");
    d_out = Buffer(static_cast<size_t>(N * C) * es, ctx.device(), "benchmark d_out");
    fill_uniform(qkv.data(), N * W, dt, 1, ctx);
    fill_uniform(d_out.data(), N * C, dt, 2, ctx);
  }
  void alloc_grad(const AttentionParams& p, DType dt, Context& ctx) {
    const int64_t N = static_cast<int64_t>(p.B) * p.T;
    d_qkv = Buffer(static_cast<size_t>(N * attention_qkv_width(p)) * dtype_size(dt), ctx.device(), "benchmark d_qkv");
  }
  int64_t n(const Buffer& b, DType dt) const { return static_cast<int64_t>(b.bytes() / dtype_size(dt)); }
  Tensor t(const Buffer& b, DType dt) const { return b.view(dt, {n(b, dt)}); }
  size_t input_bytes() const { return qkv.bytes() + out.bytes() + lse.bytes() + d_out.bytes(); }
};

// True when `e` is an allocation failure (the sweep marks the row OOM and goes on); anything else is rethrown.
bool is_oom(const Error& e) { return std::string(e.what()).find("out of GPU memory") != std::string::npos; }

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

AttentionSweeps attention_sweeps(bool small) {
  AttentionSweeps s;
  if (small) {
    s.mem_batch = 2;
    s.mem_d = {16, 32};
    s.mem_T = {16, 64};
    s.flops_tokens = 256;
    s.flops_width = 128;
    s.flops_Dh = {32, 64};
    s.flops_T = {64, 128};
  } else {
    s.mem_d = {16, 32, 64, 128};
    s.mem_T = {256, 1024, 4096, 8192, 16384};
    s.flops_Dh = {64, 128};
    s.flops_T = {1024, 4096, 16384};
  }
  return s;
}

AttentionSweeps attention_sweeps(const AttentionBenchConfig& cfg) {
  AttentionSweeps s = attention_sweeps(cfg.small);
  if (!cfg.head_dims.empty()) s.flops_Dh = cfg.head_dims;
  return s;
}

std::vector<AttentionMemoryRow> bench_attention_memory(const AttentionBenchConfig& cfg, BenchHarness& h) {
  Context& ctx = h.context();
  const AttentionSweeps sw = attention_sweeps(cfg);
  const DType dt = cfg.dtype;
  std::vector<AttentionMemoryRow> rows;
  for (int d : sw.mem_d)
    for (int T : sw.mem_T) {
      const AttentionParams p{.B = sw.mem_batch, .T = T, .H = 1, .Dh = d, .causal = false};
      for (const char* impl : {"tessera naive", "tessera flash"}) {
        AttentionMemoryRow r;
        r.impl = impl;
        r.B = p.B;
        r.T = T;
        r.d = d;
        const bool naive = impl[8] == 'n';
        if (cfg.on_row) cfg.on_row(r.impl + " d " + std::to_string(d) + " T " + std::to_string(T));
        try {
          AttentionBuffers b(p, dt, ctx);
          const Tensor qkv = b.t(b.qkv, dt), out = b.t(b.out, dt), lse = b.t(b.lse, DType::F32),
                       d_out = b.t(b.d_out, dt);
          AttentionNaiveSaved saved;
          if (naive) {
            r.fwd = h.time([&] { attention_naive_forward(p, out, lse, qkv, saved, ctx); }, cfg.timing);
            r.mib_before_bwd = static_cast<double>(b.input_bytes() + saved.bytes()) / kMiB;
            b.alloc_grad(p, dt, ctx);
            const Tensor d_qkv = b.t(b.d_qkv, dt);
            r.bwd = h.time([&] { attention_naive_backward(p, d_qkv, d_out, saved, ctx); }, cfg.timing);
            r.mib_during_bwd = r.mib_before_bwd +
                               static_cast<double>(b.d_qkv.bytes() + attention_naive_backward_bytes(p, dt)) / kMiB;
          } else {
            r.fwd = h.time([&] { attention_forward(p, out, lse, qkv, ctx); }, cfg.timing);
            r.mib_before_bwd = static_cast<double>(b.input_bytes()) / kMiB;
            b.alloc_grad(p, dt, ctx);
            const Tensor d_qkv = b.t(b.d_qkv, dt);
            r.bwd = h.time([&] { attention_backward(p, d_qkv, d_out, qkv, out, lse, ctx); }, cfg.timing);
            // + D = rowsum(dO ∘ O), B·H·T f32 in the context's scratch (GPU only).
            const double d_bytes = ctx.is_cuda() ? 4.0 * p.B * p.H * p.T : 0.0;
            r.mib_during_bwd = r.mib_before_bwd + (static_cast<double>(b.d_qkv.bytes()) + d_bytes) / kMiB;
          }
        } catch (const Error& e) {
          if (!is_oom(e)) throw;
          r.oom = true;
        }
        rows.push_back(r);
      }
    }
  return rows;
}

std::vector<AttentionFlopsRow> bench_attention_flops(const AttentionBenchConfig& cfg, BenchHarness& h) {
  Context& ctx = h.context();
  const AttentionSweeps sw = attention_sweeps(cfg);
  const DType dt = cfg.dtype;
  std::vector<AttentionFlopsRow> rows;
  for (int Dh : sw.flops_Dh)
    for (int T : sw.flops_T) {
      const int H = sw.flops_width / Dh;
      if (H % cfg.gqa != 0) continue;
      const AttentionParams p{.B = sw.flops_tokens / T,
                              .T = T,
                              .H = H,
                              .Dh = Dh,
                              .causal = true,
                              .dropout = cfg.attn_dropout,
                              .seed = 1,
                              .stream = 0,
                              .n_kv_heads = cfg.gqa > 1 ? H / cfg.gqa : 0};
      AttentionFlopsRow r;
      r.impl = cfg.gqa > 1 ? "tessera flash (GQA " + std::to_string(cfg.gqa) + ")" : "tessera flash";
      r.B = p.B;
      r.T = T;
      r.H = p.H;
      r.Dh = Dh;
      r.flops_fwd = 4.0 * p.B * p.H * static_cast<double>(T) * T * Dh / 2.0;
      if (cfg.on_row) cfg.on_row(r.impl + " causal Dh " + std::to_string(Dh) + " T " + std::to_string(T));
      try {
        AttentionBuffers b(p, dt, ctx);
        b.alloc_grad(p, dt, ctx);
        const Tensor qkv = b.t(b.qkv, dt), out = b.t(b.out, dt), lse = b.t(b.lse, DType::F32), d_out = b.t(b.d_out, dt),
                     d_qkv = b.t(b.d_qkv, dt);
        r.fwd = h.time([&] { attention_forward(p, out, lse, qkv, ctx); }, cfg.timing);
        r.fwd_bwd = h.time(
            [&] {
              attention_forward(p, out, lse, qkv, ctx);
              attention_backward(p, d_qkv, d_out, qkv, out, lse, ctx);
            },
            cfg.timing);
      } catch (const Error& e) {
        if (!is_oom(e)) throw;
        r.oom = true;
      }
      rows.push_back(r);
    }
  return rows;
}

}  // namespace tessera
