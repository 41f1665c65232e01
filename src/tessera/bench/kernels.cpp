#include "tessera/bench/kernels.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_set>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/models/config.h"
#include "tessera/models/model.h"
#include "tessera/ops/activation/activation.h"
#include "tessera/ops/embedding/embedding.h"
#include "tessera/ops/loss/cross_entropy.h"
#include "tessera/ops/norm/norm.h"
#include "tessera/ops/residual/residual.h"
#include "tessera/train/optimizer.h"

namespace tessera {

namespace {

// The benchmark's shapes (the project's shape letters: N = B*T rows, C width, F = d_ff, V vocab).
struct Shapes {
  int B, T, C, F, V;
  int N() const { return B * T; }
};

Shapes bench_shapes(BenchSize size) {
  if (size == BenchSize::Full) return {.B = 16, .T = 1024, .C = 768, .F = 3072, .V = 50257};
  if (size == BenchSize::Large) return {.B = 64, .T = 1024, .C = 768, .F = 3072, .V = 50257};
  return {.B = 4, .T = 16, .C = 64, .F = 256, .V = 512};
}

// splitmix64: fast enough to fill 124M gradients on the host; the values only need to be non-zero and varied.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)

 private:
  uint64_t s_;
};

// Writes n uniform values in [-scale, scale) of `dtype` to `dst` (device or host memory of ctx's device).
void fill_random(void* dst, int64_t n, DType dtype, float scale, Rng& rng, Context& ctx) {
  const size_t es = dtype_size(dtype);
  std::vector<unsigned char> host(static_cast<size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    const float v = scale * rng.uniform();
    unsigned char* p = host.data() + static_cast<size_t>(i) * es;
    if (dtype == DType::F32) std::memcpy(p, &v, 4);
    else if (dtype == DType::BF16) {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
    } else if (dtype == DType::F16) {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
    } else TS_THROW("bench: random fill of ", dtype_name(dtype), " is not supported");
  }
  copy_bytes(dst, ctx.device(), host.data(), Device::cpu(), host.size(), ctx);
  ctx.synchronize();  // the host vector dies on return
}

// A random (rows, cols) tensor of `dtype` on ctx's device, owning its Buffer.
struct RandomTensor {
  Buffer buf;
  Tensor t;
};

RandomTensor random_tensor(int64_t rows, int64_t cols, DType dtype, Rng& rng, Context& ctx, const char* what) {
  RandomTensor r{.buf = Buffer(static_cast<size_t>(rows * cols) * dtype_size(dtype), ctx.device(), what), .t = {}};
  r.t = rows == 1 ? r.buf.view(dtype, {cols}) : r.buf.view(dtype, {rows, cols});
  fill_random(r.t.data(), rows * cols, dtype, /*scale=*/1.0f, rng, ctx);
  return r;
}

// n random ids in [0, V) as i32 on ctx's device; *distinct gets the number of different ids.
// Token ids on the device, and how many distinct ones there are.
RandomTensor upload_ids(const std::vector<int32_t>& host, Context& ctx, int64_t* distinct) {
  if (distinct) *distinct = static_cast<int64_t>(std::unordered_set<int32_t>(host.begin(), host.end()).size());
  RandomTensor r{.buf = Buffer(host.size() * 4, ctx.device(), "benchmark token ids"), .t = {}};
  r.t = r.buf.view(DType::I32, {static_cast<int64_t>(host.size())});
  copy_bytes(r.t.data(), ctx.device(), host.data(), Device::cpu(), host.size() * 4, ctx);
  ctx.synchronize();
  return r;
}

RandomTensor random_ids(int64_t n, int V, Rng& rng, Context& ctx, int64_t* distinct) {
  std::vector<int32_t> host(static_cast<size_t>(n));
  for (auto& id : host) id = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(V));
  return upload_ids(host, ctx, distinct);
}

// Token ids drawn from a Zipf law, P(rank k) ∝ 1/k over V ranks, rank k being id k - 1: text's shape (a few ids
// fill much of a batch), where the uniform ids above touch each row about once. The embedding backward sums each
// id's rows: on text its long runs are the cost, many times that of uniform ids.
RandomTensor zipf_ids(int64_t n, int V, Rng& rng, Context& ctx, int64_t* distinct) {
  std::vector<double> cdf(static_cast<size_t>(V));
  double total = 0;
  for (int k = 0; k < V; ++k) cdf[k] = total += 1.0 / (k + 1);
  std::vector<int32_t> host(static_cast<size_t>(n));
  for (auto& id : host) {
    const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * total;
    id = static_cast<int32_t>(std::min<ptrdiff_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), V - 1));
  }
  return upload_ids(host, ctx, distinct);
}

std::string shape2(int64_t a, int64_t b) {
  std::string s = "(";  // appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "(" + to_string
  s += std::to_string(a);
  s += ", ";
  s += std::to_string(b);
  return s + ")";
}

// Statistics (mean, rstd, lse, losses) are f32 whatever the compute dtype.
constexpr double kStatBytes = 4;
constexpr double kIdBytes = 4;

}  // namespace

bool BenchConfig::wants(const std::string& family) const {
  return only.empty() || std::find(only.begin(), only.end(), family) != only.end();
}

std::vector<std::string> parse_kernel_families(const std::string& list) {
  std::string known;
  for (const char* f : kKernelFamilies) known += (known.empty() ? "" : ", ") + std::string(f);
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    TS_CHECK(std::find(std::begin(kKernelFamilies), std::end(kKernelFamilies), name) != std::end(kKernelFamilies),
             "--only: unknown kernel family '", name, "' (expected a comma list of ", known, ")");
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    if (comma == list.size()) break;
    at = comma + 1;
  }
  return out;
}

int bench_row_count(const std::string& which, const BenchConfig& cfg) {
  if (which != "kernels") return 2;  // adamw step, adamw step+clip
  int n = 0;
  for (const char* f : kKernelFamilies) {
    const std::string family = f;
    if (!cfg.wants(family) || (family == "cross-entropy" && cfg.size == BenchSize::Large)) continue;
    n += family == "embedding" ? 4 : 2;  // embedding: fwd, bwd, bwd without wpe and on Zipf ids; the others 2
  }
  return n;
}

std::vector<BenchRow> bench_kernels(const BenchConfig& cfg, BenchHarness& h) {
  Context& ctx = h.context();
  const Shapes s = bench_shapes(cfg.size);
  const DType dt = cfg.dtype;
  const double es = static_cast<double>(dtype_size(dt));
  const double N = s.N(), C = s.C, F = s.F, V = s.V, T = s.T;
  Rng rng(/*seed=*/20261130);
  std::vector<BenchRow> rows;
  auto run = [&](std::string kernel, std::string shape, double bytes, const std::function<void()>& fn) {
    if (cfg.on_row) cfg.on_row(kernel);
    rows.push_back(
        {.kernel = std::move(kernel), .shape = std::move(shape), .bytes = bytes, .timing = h.time(fn, cfg.timing)});
  };

  if (cfg.wants("embedding")) {  // embedding: tokens (N) i32, wte (V, C), wpe (T, C), out (N, C)
    const EmbeddingParams p{.B = s.B, .T = s.T, .C = s.C, .V = s.V, .max_seq = s.T};
    int64_t distinct = 0;
    const RandomTensor tokens = random_ids(s.N(), s.V, rng, ctx, &distinct);
    const RandomTensor wte = random_tensor(s.V, s.C, dt, rng, ctx, "benchmark wte");
    const RandomTensor wpe = random_tensor(s.T, s.C, dt, rng, ctx, "benchmark wpe");
    const RandomTensor out = random_tensor(s.N(), s.C, dt, rng, ctx, "benchmark embedding out");
    const std::string shape = "B*T=" + std::to_string(s.N()) + " C=" + std::to_string(s.C) +
                              " V=" + std::to_string(s.V);
    // fwd: token ids (4N) + the N gathered rows of wte (N·C) + wpe (T·C) read, out (N·C) written.
    run("embedding fwd", shape, kIdBytes * N + es * (N * C + T * C + N * C),
        [&] { embedding_forward(p, out.t, tokens.t, wte.t, wpe.t, ctx); });
    // bwd: d_out (N·C) and the ids (4N) read; d_wte's rows of the `distinct` ids touched and d_wpe (T·C) are
    // accumulated (read + write). The sort's scratch traffic is not counted.
    const RandomTensor d_wte = random_tensor(s.V, s.C, dt, rng, ctx, "benchmark d_wte");
    const RandomTensor d_wpe = random_tensor(s.T, s.C, dt, rng, ctx, "benchmark d_wpe");
    run("embedding bwd", shape, kIdBytes * N + es * (N * C + 2.0 * static_cast<double>(distinct) * C + 2 * T * C),
        [&] { embedding_backward(p, d_wte.t, d_wpe.t, out.t, tokens.t, ctx); });
    // Without a learned position table (rope or sinusoidal models): d_wte alone, so d_out is read once. With wpe,
    // the deterministic backward reads d_out twice (by token for d_wte, by position for d_wpe), which the byte count
    // above does not count; this row has no such second read.
    run("embedding bwd (no positions)", shape, kIdBytes * N + es * (N * C + 2.0 * static_cast<double>(distinct) * C),
        [&] { embedding_backward(p, d_wte.t, Tensor(), out.t, tokens.t, ctx); });
    int64_t zipf_distinct = 0;
    const RandomTensor zipf = zipf_ids(s.N(), s.V, rng, ctx, &zipf_distinct);
    run("embedding bwd (zipf ids)", shape + " distinct=" + std::to_string(zipf_distinct),
        kIdBytes * N + es * (N * C + 2.0 * static_cast<double>(zipf_distinct) * C + 2 * T * C),
        [&] { embedding_backward(p, d_wte.t, d_wpe.t, out.t, zipf.t, ctx); });
  }
  // layernorm: x, out, d_x, d_out (N, C); w, b, d_w, d_b (C); mean, rstd (N) f32; residual: the same x, out, d_x
  if (cfg.wants("layernorm") || cfg.wants("residual")) {
    const NormParams p{.N = s.N(), .C = s.C};
    const RandomTensor x = random_tensor(s.N(), s.C, dt, rng, ctx, "benchmark x");
    const RandomTensor out = random_tensor(s.N(), s.C, dt, rng, ctx, "benchmark out");
    const RandomTensor w = random_tensor(1, s.C, dt, rng, ctx, "benchmark w");
    const RandomTensor b = random_tensor(1, s.C, dt, rng, ctx, "benchmark b");
    const RandomTensor mean = random_tensor(1, s.N(), DType::F32, rng, ctx, "benchmark mean");
    const RandomTensor rstd = random_tensor(1, s.N(), DType::F32, rng, ctx, "benchmark rstd");
    const std::string shape = shape2(s.N(), s.C);
    // fwd: x (N·C), w, b (2C) read; out (N·C), mean, rstd (2N f32) written.
    if (cfg.wants("layernorm"))
      run("layernorm fwd", shape, es * (2 * N * C + 2 * C) + kStatBytes * 2 * N,
          [&] { layernorm_forward(p, out.t, mean.t, rstd.t, x.t, w.t, b.t, ctx); });
    const RandomTensor d_x = random_tensor(s.N(), s.C, dt, rng, ctx, "benchmark d_x");
    const RandomTensor d_w = random_tensor(1, s.C, dt, rng, ctx, "benchmark d_w");
    const RandomTensor d_b = random_tensor(1, s.C, dt, rng, ctx, "benchmark d_b");
    // bwd: d_out, x (2·N·C), w (C), mean, rstd (2N f32) read; d_x (N·C) and d_w, d_b (2C) accumulated (r + w).
    if (cfg.wants("layernorm"))
      run("layernorm bwd", shape, es * (2 * N * C + C + 2 * N * C + 4 * C) + kStatBytes * 2 * N,
          [&] { layernorm_backward(p, d_x.t, d_w.t, d_b.t, out.t, x.t, w.t, mean.t, rstd.t, ctx); });
    // residual: out = residual + (x + bias), no dropout; (N, C) with bias (C).
    const ResidualParams rp{.N = s.N(), .C = s.C};
    // fwd: residual, x (2·N·C) and bias (C) read; out (N·C) written.
    if (cfg.wants("residual")) {
      run("residual fwd", shape, es * (3 * N * C + C), [&] { residual_forward(rp, out.t, x.t, d_x.t, b.t, ctx); });
      // bwd: d_out (N·C) read, d_x (N·C) written, d_bias (C) accumulated (r + w).
      run("residual bwd", shape, es * (2 * N * C + 2 * C), [&] { residual_backward(rp, d_x.t, d_b.t, out.t, ctx); });
    }
  }
  if (cfg.wants("gelu")) {  // gelu: in, out, d_in, d_out (N, F); bias, d_bias (F)
    const ActivationParams p{.N = s.N(), .d_ff = s.F, .kind = Activation::Gelu};
    const RandomTensor in = random_tensor(s.N(), s.F, dt, rng, ctx, "benchmark gelu in");
    const RandomTensor out = random_tensor(s.N(), s.F, dt, rng, ctx, "benchmark gelu out");
    const RandomTensor bias = random_tensor(1, s.F, dt, rng, ctx, "benchmark gelu bias");
    const RandomTensor d_in = random_tensor(s.N(), s.F, dt, rng, ctx, "benchmark gelu d_in");
    const RandomTensor d_bias = random_tensor(1, s.F, dt, rng, ctx, "benchmark gelu d_bias");
    const std::string shape = shape2(s.N(), s.F);
    // fwd: in (N·F) and bias (F) read; out (N·F) written.
    run("gelu fwd", shape, es * (2 * N * F + F), [&] { activation_forward(p, out.t, in.t, bias.t, ctx); });
    // bwd: d_out, in (2·N·F) and bias (F) read; d_in (N·F) written; d_bias (F) accumulated (r + w).
    run("gelu bwd", shape, es * (3 * N * F + 3 * F),
        [&] { activation_backward(p, d_in.t, d_bias.t, out.t, in.t, bias.t, ctx); });
  }
  // swiglu, as the Llama-style presets run it (no bias): in, d_in (N, 2F) rows [gate | up]; out, d_out (N, F)
  if (cfg.wants("swiglu")) {
    const ActivationParams p{.N = s.N(), .d_ff = s.F, .kind = Activation::Swiglu};
    const RandomTensor in = random_tensor(s.N(), 2 * s.F, dt, rng, ctx, "benchmark swiglu in");
    const RandomTensor out = random_tensor(s.N(), s.F, dt, rng, ctx, "benchmark swiglu out");
    const RandomTensor d_in = random_tensor(s.N(), 2 * s.F, dt, rng, ctx, "benchmark swiglu d_in");
    const std::string shape = shape2(s.N(), 2 * s.F) + " -> " + shape2(s.N(), s.F);
    // fwd: in (2·N·F) read; out (N·F) written.
    run("swiglu fwd", shape, es * 3 * N * F, [&] { activation_forward(p, out.t, in.t, Tensor(), ctx); });
    // bwd: d_out (N·F) and in (2·N·F) read; d_in (2·N·F) written.
    run("swiglu bwd", shape, es * 5 * N * F,
        [&] { activation_backward(p, d_in.t, Tensor(), out.t, in.t, Tensor(), ctx); });
  }
  // cross-entropy with label smoothing 0.1 (not at large: kernels.h): logits (N, V), targets (N) i32, losses, lse
  // (N) f32
  if (cfg.size != BenchSize::Large && cfg.wants("cross-entropy")) {
    const CrossEntropyParams p{.N = s.N(), .V = s.V, .label_smoothing = 0.1f};
    const RandomTensor logits = random_tensor(s.N(), s.V, dt, rng, ctx, "benchmark logits");
    const RandomTensor targets = random_ids(s.N(), s.V, rng, ctx, nullptr);
    const RandomTensor losses = random_tensor(1, s.N(), DType::F32, rng, ctx, "benchmark losses");
    const RandomTensor lse = random_tensor(1, s.N(), DType::F32, rng, ctx, "benchmark lse");
    // The model's case: d_logits overwrites the logits in place (no memory beyond the logits). The next run then
    // reads gradients in [-1, 1] as logits, which costs the same.
    // fwd: logits (N·V), targets (4N) read, losses and lse (2 × 4N) written; bwd: logits (N·V), lse, targets
    // (2 × 4N) read, d_logits (N·V) written. Total 3·N·V·es + 20·N.
    run("cross-entropy fwd+bwd", "N=" + std::to_string(s.N()) + " V=" + std::to_string(s.V), 3 * es * N * V + 20 * N,
        [&] {
          cross_entropy_forward(p, losses.t, lse.t, logits.t, targets.t, ctx);
          cross_entropy_backward(p, logits.t, logits.t, lse.t, targets.t, /*d_loss=*/1.0 / N, Tensor(), ctx);
        });
    // The same work by the fused op, as a training step runs it: the count kernel reads the targets (4N), then one
    // read of the logits (N·V) and targets (4N), losses and lse written (2 × 4N), the gradient written over the
    // logits (N·V). Total 2·N·V·es + 16·N. The torch peer is the same F.cross_entropy forward + backward.
    Buffer count(sizeof(int32_t), ctx.device(), "benchmark count");
    const Tensor count_t = count.view(DType::I32, {1});
    run("cross-entropy fused fwd+bwd", "N=" + std::to_string(s.N()) + " V=" + std::to_string(s.V),
        2 * es * N * V + 16 * N,
        [&] { cross_entropy_forward_backward(p, losses.t, lse.t, logits.t, targets.t, /*d_loss=*/1.0, count_t, ctx); });
  }
  return rows;
}

std::vector<BenchRow> bench_optimizer(const BenchConfig& cfg, BenchHarness& h) {
  Context& ctx = h.context();
  TS_CHECK(cfg.size != BenchSize::Large, "bench optimizer: --size large applies to bench kernels only");
  const std::string preset = cfg.size == BenchSize::Full ? "gpt2-124m" : "tiny";
  const std::unique_ptr<Model> owned = make_model(model_preset(preset), ctx, cfg.dtype);
  Model& model = *owned;
  ParamBuffer& params = model.params();
  Rng rng(/*seed=*/124439808);
  const int64_t n = static_cast<int64_t>(params.size());
  fill_random(params.grad().data(), n, cfg.dtype, /*scale=*/1e-2f, rng, ctx);
  const double es = static_cast<double>(dtype_size(cfg.dtype)), nn = static_cast<double>(n);
  // Per element of the flat buffer (padding included, as the kernel walks it): with f32 master weights, master
  // r + w (8), m r + w (8), v r + w (8), grad read (es), 16-bit param write (es); without a master (f32), the
  // params are read and written in place: 8 + 8 + 8 + es. Clipping adds one more read of the gradients (es).
  const double bytes = params.has_master() ? nn * (24 + 2 * es) : nn * (24 + es);
  const std::string shape = preset + ": " + std::to_string(params.num_params()) + " params";
  std::vector<BenchRow> rows;
  if (cfg.on_row) cfg.on_row("adamw step");
  {
    // No clipping and no norm, as torch.optim.AdamW(fused=True) does on its own: the peer's figure compares with
    // this row (one launch).
    AdamW opt(params, {.grad_clip = 0.0f, .track_grad_norm = false}, ctx);
    rows.push_back({.kernel = "adamw step",
                    .shape = shape,
                    .bytes = bytes,
                    .timing = h.time([&] { opt.step(params, /*lr=*/1e-4f); }, cfg.timing)});
  }
  {
    // The trainer's step: the global-norm launch, then the update with the clip applied in registers.
    AdamW opt(params, {.grad_clip = 1.0f}, ctx);
    if (cfg.on_row) cfg.on_row("adamw step+clip");
    rows.push_back({.kernel = "adamw step+clip",
                    .shape = shape,
                    .bytes = bytes + nn * es,
                    .timing = h.time([&] { opt.step(params, /*lr=*/1e-4f); }, cfg.timing)});
  }
  return rows;
}

}  // namespace tessera
