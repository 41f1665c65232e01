// The rows of `tessera bench seq2seq` (bench/seq2seq.h): the encoder-decoder's training step, beam translation
// through the inference engine, and the layer-batched cross-attention K/V projection against per-layer calls.
#include "tessera/bench/seq2seq.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/infer/seq2seq_engine.h"
#include "tessera/models/encoder_decoder.h"
#include "tessera/ops/cross_kv/cross_kv.h"
#include "tessera/train/optimizer.h"

namespace tessera {

const std::vector<std::string>& seq2seq_row_names() {
  static const std::vector<std::string> names = {"train", "translate", "cross-kv"};
  return names;
}

std::string seq2seq_bench_check(const Seq2SeqBenchConfig& c) {
  const int S = c.model.max_seq;
  auto n = [](int v) { return std::to_string(v); };
  if (c.src_len < 1 || c.src_len > S) return "--src-len " + n(c.src_len) + " is outside [1, " + n(S) + "]";
  if (c.tgt_len < 1 || c.tgt_len > S) return "--tgt-len " + n(c.tgt_len) + " is outside [1, " + n(S) + "]";
  for (int t : c.train_tokens)
    if (t < c.tgt_len || t % c.tgt_len != 0)
      return "--train-tokens " + n(t) + " is not a positive multiple of --tgt-len " + n(c.tgt_len);
  if (c.sentences < 1) return "--sentences must be at least 1, got " + n(c.sentences);
  for (int b : c.translate_batches)
    if (b < 1) return "--batches must be at least 1, got " + n(b);
  if (c.beams < 1 || c.beams > 32) return "--beams must be in [1, 32], got " + n(c.beams);
  if (c.new_tokens < 1 || c.new_tokens > S) return "--new-tokens " + n(c.new_tokens) + " is outside [1, " + n(S) + "]";
  if (c.cross_kv_tokens < 1) return "--cross-kv-tokens must be at least 1, got " + n(c.cross_kv_tokens);
  return "";
}

std::string seq2seq_peer_key(const std::string& row, const std::string& mode, int n, const std::string& unit) {
  return row + " " + mode + " " + std::to_string(n) + " " + unit;
}

namespace {

// n random ids in [3, V): no pad, BOS or EOS of the presets (0, 1, 2) inside a sentence.
std::vector<int32_t> random_ids(size_t n, int V, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(3, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

void train_row(const Seq2SeqBenchConfig& c, Context& ctx, Seq2SeqBenchResult& r) {
  BenchHarness h(ctx);
  std::mt19937_64 rng(1);
  const int Ts = c.src_len, Tt = c.tgt_len;
  for (const int tokens : c.train_tokens) {
    const int B = tokens / Tt;
    const size_t before = ctx.device_memory_used();
    std::vector<int32_t> src = random_ids(size_t(B) * Ts, c.model.source_vocab(), rng);
    std::vector<int32_t> tgt_out = random_ids(size_t(B) * Tt, c.model.vocab, rng), tgt_in(tgt_out.size());
    for (int b = 0; b < B; ++b) {  // teacher forcing: the decoder reads start, y_0, .., y_{Tt-2}
      tgt_in[size_t(b) * Tt] = c.model.decoder_start_id;
      for (int t = 1; t < Tt; ++t) tgt_in[size_t(b) * Tt + t] = tgt_out[size_t(b) * Tt + t - 1];
    }
    const std::vector<int32_t> src_lens(B, Ts), tgt_lens(B, Tt);
    const Seq2SeqBatch batch{.B = B,
                             .Ts = Ts,
                             .Tt = Tt,
                             .src = src.data(),
                             .src_lens = src_lens.data(),
                             .tgt_in = tgt_in.data(),
                             .tgt_out = tgt_out.data(),
                             .tgt_lens = tgt_lens.data()};
    Timing t;
    double added = 0;
    {
      EncoderDecoder m(c.model, ctx, c.dtype);
      m.init_weights(1);
      m.reserve(B, Ts, Tt);
      AdamW opt(m.params(), AdamWConfig{}, ctx);
      RngState rs{1, 0};
      t = h.time(
          [&] {
            m.zero_grad();
            m.forward(batch, {.training = true, .label_smoothing = c.label_smoothing, .rng = &rs});
            m.backward();
            opt.step(m.params(), 1e-4f);
          },
          c.timing);
      added = static_cast<double>(ctx.device_memory_used()) - static_cast<double>(before);
    }
    const std::string shape = std::to_string(B) + " x (" + std::to_string(Ts) + " + " + std::to_string(Tt) + ")";
    auto peers = [&](const std::string& unit) {
      return std::vector<std::pair<std::string, std::string>>{{"HF BART eager",
                                                               seq2seq_peer_key("train", "eager", tokens, unit)},
                                                              {"HF BART torch.compile",
                                                               seq2seq_peer_key("train", "compile", tokens, unit)}};
    };
    r.lines.push_back({"train", "step, " + shape, t.median_ms, "ms", false, peers("ms")});
    r.lines.push_back(
        {"train", "target tokens/s, " + shape, tokens / (t.median_ms / 1e3), "tok/s", true, peers("tok/s")});
    if (ctx.is_cuda())
      r.lines.push_back({"train", "device memory, " + shape, added / (1 << 20), "MiB", false, peers("MiB")});
  }
  r.notes.push_back("train: sentences of " + std::to_string(Ts) + " source + " + std::to_string(Tt) +
                    " target tokens, no padding; zero_grad + forward (label smoothing " +
                    std::to_string(c.label_smoothing).substr(0, 3) +
                    ", the preset's dropout) + backward + AdamW; median of " + std::to_string(c.timing.iters) +
                    " steps after " + std::to_string(c.timing.warmup) +
                    (ctx.is_cuda() ? "; memory: the driver's count after the steps less before the model (the "
                                     "peer's: torch.cuda.max_memory_allocated)"
                                   : ""));
}

void translate_row(const Seq2SeqBenchConfig& c, Context& ctx, Seq2SeqBenchResult& r) {
  EncoderDecoder m(c.model, ctx, c.dtype);
  m.init_weights(1);
  std::mt19937_64 rng(2);
  std::vector<std::vector<int32_t>> sources(c.sentences);
  for (auto& s : sources) s = random_ids(c.src_len, c.model.source_vocab(), rng);
  BeamSearchOptions o;
  o.beams = c.beams;
  o.max_new_tokens = c.new_tokens;
  o.eos_id = -1;  // random weights: no hypothesis ends early, every one runs new_tokens steps
  o.pad_id = c.model.pad_id;
  for (const int b : c.translate_batches) {
    Seq2SeqEngine e(m, {.batch = b, .beams = c.beams, .max_src = c.src_len, .max_tgt = c.new_tokens});
    auto run_batch = [&](size_t at) {
      const size_t end = std::min(sources.size(), at + size_t(b));
      const std::vector<std::vector<int32_t>> part(sources.begin() + at, sources.begin() + end);
      (void)seq2seq_beam(e, part, o);
    };
    run_batch(0);  // untimed: the first batch's lazy allocations and library plans
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t at = 0; at < sources.size(); at += size_t(b)) run_batch(at);
    ctx.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto peers = [&](const std::string& unit) {
      return std::vector<std::pair<std::string, std::string>>{{"HF generate eager",
                                                               seq2seq_peer_key("translate", "eager", b, unit)},
                                                              {"HF generate static cache",
                                                               seq2seq_peer_key("translate", "static", b, unit)}};
    };
    const std::string what = "beam " + std::to_string(c.beams) + ", batch " + std::to_string(b);
    r.lines.push_back({"translate", "sentences/s, " + what, c.sentences / (ms / 1e3), "sent/s", true, peers("sent/s")});
    r.lines.push_back({"translate", "per sentence, " + what, ms / c.sentences, "ms", false, peers("ms")});
  }
  r.notes.push_back("translate: " + std::to_string(c.sentences) + " random sources of " + std::to_string(c.src_len) +
                    " tokens, random weights, no EOS: every hypothesis runs " + std::to_string(c.new_tokens) +
                    " steps (the peer: min_new_tokens = max_new_tokens); wall time of every batch after one untimed");
}

// Device buffers of the cross-kv row, filled with small ordinary numbers (the timing does not depend on them).
struct KvBuffers {
  std::vector<std::unique_ptr<Buffer>> owned;
  Tensor make(int64_t n, DType dt, Context& ctx) {
    owned.push_back(std::make_unique<Buffer>(size_t(n) * dtype_size(dt), ctx.device()));
    std::vector<unsigned char> bytes(size_t(n) * dtype_size(dt));
    for (int64_t i = 0; i < n; ++i) {
      const float v = 0.01f * static_cast<float>((i * 7919) % 201 - 100);
      if (dt == DType::F32) std::memcpy(&bytes[i * 4], &v, 4);
      else if (dt == DType::F64) {
        const double d = v;
        std::memcpy(&bytes[i * 8], &d, 8);
      } else {
        const uint16_t hv = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(&bytes[i * 2], &hv, 2);
      }
    }
    copy_bytes(owned.back()->data(), ctx.device(), bytes.data(), Device::cpu(), bytes.size(), ctx);
    return owned.back()->view(dt, {n});
  }
};

void cross_kv_row(const Seq2SeqBenchConfig& c, Context& ctx, Seq2SeqBenchResult& r) {
  const int C = c.model.d_model, L = c.model.dec_layers, KV = c.model.kv_heads() * c.model.head_dim();
  const int Nk = c.cross_kv_tokens;
  const int64_t S = int64_t{Nk} * KV, W = 2 * int64_t{L} * KV;
  const DType dt = c.dtype;
  KvBuffers kb;
  const Tensor m = kb.make(int64_t{Nk} * C, dt, ctx), w = kb.make(W * C, dt, ctx), bias = kb.make(W, dt, ctx);
  const Tensor kv = kb.make(2 * L * S, dt, ctx), proj = kb.make(Nk * W, dt, ctx);
  const Tensor d_w = kb.make(W * C, dt, ctx), d_bias = kb.make(W, dt, ctx), d_m = kb.make(int64_t{Nk} * C, dt, ctx);
  const Tensor d_kv = kb.make(2 * L * S, dt, ctx), d_proj = kb.make(Nk * W, dt, ctx);
  // Exact f32 GEMMs for an f32 run, as the model's own projection runs them (ignored for 16-bit).
  const CrossKvParams all{.Nk = Nk, .C = C, .L = L, .KV = KV, .allow_tf32 = false};
  // Layer l alone: the same op with L = 1 on its rows of W and b, writing its two slices of kv (stride S).
  const CrossKvParams one{.Nk = Nk, .C = C, .L = 1, .KV = KV, .slice_stride = S, .allow_tf32 = false};
  auto w_l = [&](const Tensor& t, int l) { return t.slice1d(2 * int64_t{l} * KV * C, 2 * int64_t{KV} * C); };
  auto b_l = [&](const Tensor& t, int l) { return t.slice1d(2 * int64_t{l} * KV, 2 * int64_t{KV}); };
  auto kv_l = [&](const Tensor& t, int l) { return t.slice1d(2 * int64_t{l} * S, 2 * S); };
  const Tensor proj1 = proj.slice1d(0, int64_t{Nk} * 2 * KV), d_proj1 = d_proj.slice1d(0, int64_t{Nk} * 2 * KV);
  BenchHarness h(ctx);
  const Timing fa = h.time([&] { cross_kv_forward(all, kv, proj, m, w, bias, ctx); }, c.timing);
  const Timing fs = h.time(
      [&] {
        for (int l = 0; l < L; ++l) cross_kv_forward(one, kv_l(kv, l), proj1, m, w_l(w, l), b_l(bias, l), ctx);
      },
      c.timing);
  const Timing ba = h.time([&] { cross_kv_backward(all, d_w, d_bias, d_m, d_proj, d_kv, m, w, false, ctx); }, c.timing);
  const Timing bs = h.time(
      [&] {
        for (int l = 0; l < L; ++l)
          cross_kv_backward(one, w_l(d_w, l), b_l(d_bias, l), d_m, d_proj1, kv_l(d_kv, l), m, w_l(w, l), l > 0, ctx);
      },
      c.timing);
  const std::string shape = std::to_string(Nk) + " tokens, C " + std::to_string(C) + ", L " + std::to_string(L);
  r.lines.push_back({"cross-kv", "forward, one GEMM over " + shape, fa.median_ms, "ms", false, {}});
  r.lines.push_back({"cross-kv", "forward, L separate GEMMs", fs.median_ms, "ms", false, {}});
  r.lines.push_back({"cross-kv", "forward, separate / batched", fs.median_ms / fa.median_ms, "×", true, {}});
  r.lines.push_back({"cross-kv", "backward, one GEMM over " + shape, ba.median_ms, "ms", false, {}});
  r.lines.push_back({"cross-kv", "backward, L separate GEMMs", bs.median_ms, "ms", false, {}});
  r.lines.push_back({"cross-kv", "backward, separate / batched", bs.median_ms / ba.median_ms, "×", true, {}});
  r.notes.push_back("cross-kv: ops/cross_kv with all " + std::to_string(L) +
                    " layers in one call against the same op once per layer (L = 1, its rows of W); backward: "
                    "d_memory summed over the layers, d_W, d_b; median of " +
                    std::to_string(c.timing.iters) + " after " + std::to_string(c.timing.warmup));
}

}  // namespace

Seq2SeqBenchResult bench_seq2seq(const Seq2SeqBenchConfig& c, Context& ctx) {
  Seq2SeqBenchResult r;
  for (const std::string& row : c.rows) {
    if (c.on_row) c.on_row(row);
    if (row == "train") train_row(c, ctx, r);
    else if (row == "translate") translate_row(c, ctx, r);
    else if (row == "cross-kv") cross_kv_row(c, ctx, r);
  }
  return r;
}

bool seq2seq_peer_take(const nlohmann::json& j, Seq2SeqPeerFigures& f) {
  if (!j.is_object() || !j.contains("what")) return false;
  const std::string what = j.value("what", "");
  if (what == "versions") {
    f.versions = j.value("text", "");
    return false;
  }
  if (what != "train" && what != "translate") return false;
  const std::string mode = j.value("mode", "");
  const int n = j.value("n", 0);
  if (j.contains("unsupported")) {
    f.unsupported[what + " " + mode] = j.value("unsupported", "");
    return true;
  }
  if (j.contains("error")) {
    f.errors.push_back(what + " " + mode + " " + std::to_string(n) + ": " + j.value("error", ""));
    return true;
  }
  bool any = false;
  for (const char* unit : {"ms", "tok/s", "MiB", "sent/s"})
    if (j.contains(unit) && j.at(unit).is_number()) {
      f.values[seq2seq_peer_key(what, mode, n, unit)] = j.at(unit).get<double>();
      any = true;
    }
  return any;
}

std::string seq2seq_bench_table(const Seq2SeqBenchResult& r, const Seq2SeqPeerFigures& peer, bool with_peer) {
  std::string md = "| row | measure | tessera | unit |";
  md += with_peer ? " peer | peer's figure | ratio (> 1: tessera ahead) |\n|---|---|---:|---|---|---:|---:|\n"
                  : "\n|---|---|---:|---|\n";
  auto num = [](double v) {
    char b[48];
    std::snprintf(b, sizeof b, v >= 100 ? "%.1f" : v >= 1 ? "%.3f" : "%.4f", v);
    return std::string(b);
  };
  for (const Seq2SeqLine& l : r.lines) {
    const std::string head = "| " + l.row + " | " + l.measure + " | " + num(l.value) + " | " + l.unit + " |";
    if (!with_peer) {
      md += head + "\n";
      continue;
    }
    if (l.peers.empty()) md += head + " – | – | – |\n";
    for (const auto& [label, key] : l.peers) {
      const auto it = peer.values.find(key);
      if (it == peer.values.end() || it->second <= 0 || l.value <= 0) {
        md += head + " " + label + " | – | – |\n";
        continue;
      }
      const double ratio = l.higher_better ? l.value / it->second : it->second / l.value;
      md += head + " " + label + " | " + num(it->second) + " | " + num(ratio) + "× |\n";
    }
  }
  return md;
}

}  // namespace tessera
