#include "tessera/bench/decode.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "tessera/bench/model.h"
#include "tessera/bench/topk.h"
#include "tessera/core/buffer.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/infer/beam_generate.h"
#include "tessera/infer/beam_search.h"
#include "tessera/infer/engine.h"
#include "tessera/models/model.h"
#include "tessera/train/checkpoint.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

bool wants(const DecodeBenchConfig& c, const std::string& row) {
  return std::find(c.rows.begin(), c.rows.end(), row) != c.rows.end();
}

std::string fmt_num(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The --precision value of generate for `dtype`.
std::string precision_flag(DType dtype) { return dtype == DType::BF16 ? "bf16" : dtype == DType::F16 ? "f16" : "f32"; }

// `n` prompts of `len` ids uniform in [0, vocab), from a fixed seed.
std::vector<std::vector<int32_t>> random_prompts(int n, int len, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<std::vector<int32_t>> p(static_cast<size_t>(n), std::vector<int32_t>(static_cast<size_t>(len)));
  for (auto& row : p)
    for (int32_t& t : row) t = id(rng);
  return p;
}

// The model of `cfg` in the compute dtype on ctx, without master weights or gradients, weights for timing.
std::unique_ptr<Model> inference_model(const ModelConfig& cfg, DType dtype, Context& ctx) {
  auto m = make_model(cfg, ctx, dtype, MasterWeights::Off);
  m->set_grad_memory(GradMemory::Planned);
  bench_init_weights(*m);
  return m;
}

// Median wall ms of fn over timing.iters runs after timing.warmup, each between two synchronizes.
Timing wall_timing(Context& ctx, const TimingOptions& timing, const std::function<void()>& fn) {
  for (int i = 0; i < timing.warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < timing.iters; ++i) {
    ctx.synchronize();
    const auto t0 = Clock::now();
    fn();
    ctx.synchronize();
    ms.push_back(ms_since(t0));
  }
  return timing_summary(std::move(ms));
}

// The decode step of a greedy engine just prefilled: kDecodeWarmupSteps untimed, then `steps` timed.
Timing decode_step_timing(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int steps, BenchHarness& h) {
  e.prefill(prompts);
  e.greedy_tokens();
  return h.time([&] { e.decode(/*greedy=*/true); }, {.warmup = kDecodeWarmupSteps, .iters = steps});
}

// Prefill, the first token from its logits, then new_tokens - 1 greedy steps, each read to the host.
void greedy_generate(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int new_tokens) {
  e.prefill(prompts);
  e.greedy_tokens();
  for (int i = 1; i < new_tokens; ++i) {
    e.decode(/*greedy=*/true);
    e.read_tokens();
  }
}

// The greedy row for `batch` sequences (1: greedy; more: batch).
void greedy_rows(const DecodeBenchConfig& c, Model& model, int batch, BenchHarness& h, DecodeBenchResult& r) {
  Context& ctx = h.context();
  const std::string row = batch == 1 ? "greedy" : "batch";
  Engine e(model, {.batch = batch, .max_prompt = c.prompt, .pdl = c.pdl});
  const auto prompts = random_prompts(batch, c.prompt, c.model.vocab, 1000 + static_cast<uint64_t>(batch));
  const Timing step = decode_step_timing(e, prompts, c.new_tokens, h);
  const Timing gen = wall_timing(ctx, c.timing, [&] { greedy_generate(e, prompts, c.new_tokens); });
  const std::string what = c.model.preset + ", batch " + std::to_string(batch) + ", greedy, " +
                           std::to_string(c.new_tokens) + " new tokens: ";
  const std::string unit = batch == 1 ? "ms/token" : "ms/step";
  const std::pair<std::string, std::string> hf_static{"HF static", decode_peer_key("static", batch, 1)},
      hf_eager{"HF eager", decode_peer_key("eager", batch, 1)};
  r.lines.push_back({.row = row,
                     .measure = what + "decode step (" + (e.graph_replays() > 0 ? "graph replay" : "eager") + ")",
                     .value = step.median_ms,
                     .unit = unit,
                     .peer_factor = 1,
                     .peers = {hf_static}});
  r.lines.push_back({.row = row,
                     .measure = what + "generate wall / steps (prefill included)",
                     .value = gen.median_ms / c.new_tokens,
                     .unit = unit,
                     .peer_factor = 1,
                     .peers = {hf_static, hf_eager}});
  if (batch > 1)
    r.lines.push_back({.row = row,
                       .measure = what + "generate wall / tokens of all sequences",
                       .value = gen.median_ms / c.new_tokens / batch,
                       .unit = "ms/token",
                       .peer_factor = 1.0 / batch,
                       .peers = {hf_static, hf_eager}});
}

void beams_row(const DecodeBenchConfig& c, Model& model, Context& ctx, DecodeBenchResult& r) {
  Engine e(model, {.batch = 1, .beams = c.beams, .max_prompt = c.prompt, .pdl = c.pdl});
  const auto prompt = random_prompts(1, c.prompt, c.model.vocab, 77)[0];
  // No EOS: every hypothesis runs the new_tokens steps, as the peer's min_new_tokens = max_new_tokens makes HF's.
  const BeamSearchOptions o{.beams = c.beams, .max_new_tokens = c.new_tokens, .eos_id = -1};
  const Timing gen = wall_timing(ctx, c.timing, [&] { beam_generate(e, {prompt}, o); });
  r.lines.push_back({.row = "beams",
                     .measure = c.model.preset + ", " + std::to_string(c.beams) + " beams, " +
                                std::to_string(c.new_tokens) + " steps: beam_generate wall / steps (prefill included)",
                     .value = gen.median_ms / c.new_tokens,
                     .unit = "ms/step",
                     .peer_factor = 1,
                     .peers = {{"HF eager", decode_peer_key("eager", 1, c.beams)},
                               {"HF static", decode_peer_key("static", 1, c.beams)}}});
}

void prefill_row(const DecodeBenchConfig& c, Model& model, Context& ctx, DecodeBenchResult& r) {
  const int T = c.prefill_tokens;
  double engine_ms = 0;
  {
    Engine e(model, {.batch = 1, .max_prompt = T, .max_seq = T, .pdl = c.pdl});
    const auto prompt = random_prompts(1, T, c.model.vocab, 5);
    engine_ms = wall_timing(ctx, c.timing, [&] { e.prefill(prompt); }).median_ms;
  }
  ModelBenchConfig bc{.batch = 1,
                      .seq = T,
                      .dtype = c.dtype,
                      .fwd = true,
                      .fwd_bwd = false,
                      .step = false,
                      .warmup = std::max(1, c.timing.warmup),
                      .steps = c.timing.iters};
  const ModelBenchRow fwd = bench_model(c.model, bc, ctx, 0);
  TS_CHECK(!fwd.oom, "bench decode: the training forward of (1, ", T, ") does not fit: ", fwd.oom_reason);
  const std::string what = c.model.preset + ", 1 x " + std::to_string(T) + " tokens: ";
  r.lines.push_back({.row = "prefill",
                     .measure = what + "engine prefill",
                     .value = engine_ms,
                     .unit = "ms",
                     .peer_factor = 1,
                     .peers = {{"HF eager forward", decode_peer_prefill_key(T)}}});
  r.lines.push_back(
      {.row = "prefill",
       .measure = what + "training forward (bench model fwd" + (fwd.cuda_graph ? ", graph replay" : "") + ")",
       .value = fwd.fwd->t.median_ms,
       .unit = "ms",
       .peer_factor = 1,
       .peers = {}});
  r.notes.push_back(
      "prefill / training forward of the same shape: " + fmt_num("%.2f", engine_ms / fwd.fwd->t.median_ms) +
      " (the training forward also computes every "
      "position's logits and the loss)");
}

void topk_row(const DecodeBenchConfig& c, BenchHarness& h, DecodeBenchResult& r) {
  const BeamTopkParams p{.B = c.topk_batch, .K = c.beams, .V = c.model.vocab, .k = 2 * c.beams};
  const TopkBench t = bench_beam_topk(p, c.dtype == DType::F32 ? DType::F32 : DType::BF16, h,
                                      {.warmup = 5, .iters = std::max(20, c.timing.iters)});
  r.lines.push_back({.row = "topk",
                     .measure = "beam_topk (" + std::to_string(p.B) + " x " + std::to_string(p.K) + ", " +
                                std::to_string(p.V) + "), k " + std::to_string(p.k),
                     .value = t.t.median_ms * 1e3,
                     .unit = "µs",
                     .peer_factor = 1e3,
                     .peers = {{"torch.topk", decode_peer_topk_key(p.B, p.K * p.V, p.k)}}});
  r.notes.push_back("top-k candidates per row after the retrieve (min / median / max): " +
                    topk_candidate_summary(t.candidates) + " of " + std::to_string(p.V));
}

// Seconds from the start of `cmd` until its stdout holds more than `echo` bytes (the echoed prompt); throws with
// stderr's last line when it exits non-zero.
double seconds_to_first_token(const std::string& cmd, size_t echo, const fs::path& err_file) {
  const auto t0 = Clock::now();
  std::FILE* p = ::popen((cmd + " 2>'" + err_file.string() + "' </dev/null").c_str(), "r");
  TS_CHECK(p != nullptr, "bench decode: cannot start ", cmd);
  size_t got = 0;
  double first = -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) {
    got += n;
    if (first < 0 && got > echo) first = ms_since(t0) / 1e3;
  }
  const int status = ::pclose(p);
  // A first token that prints nothing (an EOS id of the model's) ends the process: its exit is the time.
  if (first < 0 && status == 0) first = ms_since(t0) / 1e3;
  if (status != 0) {
    std::string err = fs::exists(err_file) ? read_file_text(err_file.string()) : "";
    while (!err.empty() && err.back() == '\n') err.pop_back();
    err = err.substr(err.find_last_of('\n') == std::string::npos ? 0 : err.find_last_of('\n') + 1);
    TS_THROW("bench decode: first-token: `tessera generate` failed (status ", status, ")",
             err.empty() ? "" : ": " + err);
  }
  return first;
}

void first_token_row(const DecodeBenchConfig& c, Context& ctx, DecodeBenchResult& r) {
  TS_CHECK(!c.binary.empty(), "internal: bench decode's first-token row needs the tessera binary");
  const fs::path dir = fs::temp_directory_path() / ("tessera_bench_decode_" + std::to_string(::getpid()));
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  fs::create_directories(dir);
  {
    auto m = make_model(c.model);  // f32 on the CPU: what a training run saves
    bench_init_weights(*m);
    save_checkpoint((dir / "ckpt").string(), *m, nullptr);
  }
  const std::string prompt = "The ";
  const bool gpu = ctx.is_cuda();
  const std::string cmd = "'" + c.binary + "' generate --checkpoint '" + (dir / "ckpt").string() + "' --prompt '" +
                          prompt + "' --max-new-tokens 1 --temperature 0 --device " + (gpu ? "cuda" : "cpu") +
                          " --precision " + precision_flag(c.dtype);
  seconds_to_first_token(cmd, prompt.size(), dir / "err.txt");  // warms the page cache, as the peer's run is warm
  std::vector<double> s;
  for (int i = 0; i < c.timing.iters; ++i) s.push_back(seconds_to_first_token(cmd, prompt.size(), dir / "err.txt"));
  const double median_s = timing_summary(std::move(s)).median_ms;  // of seconds
  r.lines.push_back({.row = "first-token",
                     .measure = "tessera generate (child process) on a " + c.model.preset +
                                " checkpoint: start to first token, load included",
                     .value = median_s,
                     .unit = "s",
                     .peer_factor = 1e-3,
                     .peers = {{"from_pretrained + first token", "first token"}}});
}

// The large model's decode step and its bandwidth.
void bandwidth_row(const DecodeBenchConfig& c, BenchHarness& h, DecodeBenchResult& r) {
  Context& ctx = h.context();
  auto model = inference_model(c.large, c.dtype, ctx);
  Engine e(*model, {.batch = 1, .max_prompt = c.prompt, .pdl = c.pdl});
  const Timing step = decode_step_timing(e, random_prompts(1, c.prompt, c.large.vocab, 9), c.new_tokens, h);
  const double bytes = decode_weight_bytes(*model);
  const double gbs = bytes / (step.median_ms * 1e-3) / 1e9;
  const double n = static_cast<double>(c.large.num_params());
  const std::string what = c.large.preset + " (" + (n >= 1e9 ? fmt_num("%.2fB", n / 1e9) : fmt_num("%.1fM", n / 1e6)) +
                           "), batch 1: ";
  r.lines.push_back({.row = "bandwidth",
                     .measure = what + "decode step",
                     .value = step.median_ms,
                     .unit = "ms/token",
                     .peer_factor = 1,
                     .peers = {}});
  r.lines.push_back({.row = "bandwidth",
                     .measure = what + "weight bytes / step time",
                     .value = gbs,
                     .unit = "GB/s",
                     .peer_factor = 1,
                     .peers = {}});
  if (r.copy_gbs) {
    r.lines.push_back({.row = "bandwidth",
                       .measure = what + "that bandwidth / the copy's",
                       .value = 100 * gbs / *r.copy_gbs,
                       .unit = "%",
                       .peer_factor = 1,
                       .peers = {}});
    r.notes.push_back("bandwidth floor of " + c.large.preset + ": " + fmt_num("%.3f", bytes / 1e9) +
                      " GB of weights / " + fmt_num("%.0f", *r.copy_gbs) +
                      " GB/s = " + fmt_num("%.4f", bytes / (*r.copy_gbs * 1e9) * 1e3) + " ms/token");
  }
}

}  // namespace

double decode_weight_bytes(const Model& model) {
  const ModelConfig& cfg = model.config();
  double n = 0;
  for (const ParamSegment& seg : model.params().segments()) {
    const bool table = seg.name == "wpe" || (seg.name == "wte" && !cfg.tied);
    n += table ? cfg.d_model : static_cast<double>(seg.numel);
  }
  return n * static_cast<double>(dtype_size(model.dtype()));
}

const std::vector<std::string>& decode_row_names() {
  static const std::vector<std::string> names = {"greedy", "batch",     "beams",      "prefill",
                                                 "topk",   "bandwidth", "first-token"};
  return names;
}

std::string decode_bench_check(const DecodeBenchConfig& c) {
  for (const auto& row : c.rows)
    if (std::find(decode_row_names().begin(), decode_row_names().end(), row) == decode_row_names().end())
      return "--rows: unknown row '" + row + "'";
  if (c.prompt < 2) return "--prompt must be at least 2 tokens, got " + std::to_string(c.prompt);
  if (c.new_tokens < 1) return "--new-tokens must be at least 1, got " + std::to_string(c.new_tokens);
  if (c.timing.iters < 1) return "--iters must be at least 1, got " + std::to_string(c.timing.iters);
  if (c.timing.warmup < 0) return "--warmup must be >= 0, got " + std::to_string(c.timing.warmup);
  for (const ModelConfig* m : {&c.model, &c.large}) {
    if (m == &c.large && !wants(c, "bandwidth")) continue;
    const std::string why = Engine::unsupported(*m);
    if (!why.empty()) return m->preset + ": " + why;
    // The decode-step timing takes kDecodeWarmupSteps more steps than the generate.
    const int need = c.prompt + kDecodeWarmupSteps + c.new_tokens;
    if (need > m->max_seq)
      return "--prompt " + std::to_string(c.prompt) + " + --new-tokens " + std::to_string(c.new_tokens) + " + " +
             std::to_string(kDecodeWarmupSteps) + " warm-up steps = " + std::to_string(need) +
             " positions: " + m->preset + " has " + std::to_string(m->max_seq) + " (lower --new-tokens to " +
             std::to_string(std::max(0, m->max_seq - c.prompt - kDecodeWarmupSteps)) + " or less)";
  }
  if (wants(c, "beams") && c.beams > c.model.vocab) return "the beams row: more beams than the vocab";
  if (c.prefill_tokens < 1 || c.prefill_tokens > c.model.max_seq)
    return "the prefill row: " + std::to_string(c.prefill_tokens) + " tokens; " + c.model.preset + " takes 1 to " +
           std::to_string(c.model.max_seq);
  return "";
}

DecodeBenchResult bench_decode(const DecodeBenchConfig& c, Context& ctx) {
  const std::string why = decode_bench_check(c);
  TS_CHECK(why.empty(), "bench decode: ", why);
  BenchHarness h(ctx);
  DecodeBenchResult r;
  if (ctx.is_cuda()) r.copy_gbs = h.copy_bandwidth_gbs(size_t{1} << 30, {.warmup = 2, .iters = 10});
  // Whether `row` was asked for; tells on_row as it starts.
  auto start = [&](const std::string& row) {
    if (!wants(c, row)) return false;
    if (c.on_row) c.on_row(row);
    return true;
  };
  const bool model_rows = wants(c, "greedy") || wants(c, "batch") || wants(c, "beams") || wants(c, "prefill");
  if (model_rows) {
    auto model = inference_model(c.model, c.dtype, ctx);
    if (r.copy_gbs) {
      const double bytes = decode_weight_bytes(*model);
      r.notes.push_back("bandwidth floor of " + c.model.preset + ": " + fmt_num("%.3f", bytes / 1e9) +
                        " GB of weights / " + fmt_num("%.0f", *r.copy_gbs) +
                        " GB/s = " + fmt_num("%.4f", bytes / (*r.copy_gbs * 1e9) * 1e3) + " ms/token");
    }
    if (start("greedy")) greedy_rows(c, *model, 1, h, r);
    if (start("batch")) greedy_rows(c, *model, c.batch, h, r);
    if (start("beams")) beams_row(c, *model, ctx, r);
    if (start("prefill")) prefill_row(c, *model, ctx, r);
  }
  if (start("topk")) topk_row(c, h, r);
  if (start("bandwidth")) bandwidth_row(c, h, r);
  if (start("first-token")) first_token_row(c, ctx, r);
  return r;
}

std::string decode_peer_key(const std::string& mode, int batch, int beams) {
  return "generate " + mode + " b" + std::to_string(batch) + " k" + std::to_string(beams);
}

std::string decode_peer_prefill_key(int tokens) { return "prefill " + std::to_string(tokens); }

std::string decode_peer_topk_key(int rows, int cols, int k) {
  return "topk " + std::to_string(rows) + " x " + std::to_string(cols) + " k " + std::to_string(k);
}

bool decode_peer_take(const nlohmann::json& j, DecodePeerFigures& f) {
  if (!j.is_object() || !j.contains("what") || !j["what"].is_string()) return false;
  const std::string what = j["what"].get<std::string>();
  auto number = [&](const char* k) -> std::optional<double> {
    if (!j.contains(k) || !j[k].is_number()) return std::nullopt;
    return j[k].get<double>();
  };
  std::string key = what;
  if (what == "prefill" && number("tokens")) key = decode_peer_prefill_key(static_cast<int>(*number("tokens")));
  if (what == "topk" && number("rows") && number("cols") && number("k"))
    key = decode_peer_topk_key(static_cast<int>(*number("rows")), static_cast<int>(*number("cols")),
                               static_cast<int>(*number("k")));
  if (what == "generate") {
    if (!j.contains("mode") || !j["mode"].is_string() || !number("batch") || !number("beams")) {
      if (j.contains("error"))
        f.errors.push_back("generate " + j.value("model", std::string()) + ": " + j["error"].dump());
      return j.contains("error");
    }
    key = decode_peer_key(j["mode"].get<std::string>(), static_cast<int>(*number("batch")),
                          static_cast<int>(*number("beams")));
  }
  if (j.contains("error")) {
    f.errors.push_back(key + ": " + (j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump()));
    return true;
  }
  std::optional<double> ms;
  if (what == "copy") {
    f.copy_gbs = number("gbps");
    return f.copy_gbs.has_value();
  }
  if (what == "generate") ms = number("ms_per_token");
  else if (what == "prefill") ms = number("ms");
  else if (what == "topk" && number("us")) ms = *number("us") * 1e-3;
  else if (what == "first token" && number("s")) ms = *number("s") * 1e3;
  if (!ms) return false;
  f.ms[key] = *ms;
  return true;
}

std::string decode_bench_table(const DecodeBenchResult& r, const DecodePeerFigures& peer, bool with_peer) {
  std::string md = "| row | measure | tessera | unit |";
  md += with_peer ? " peer | peer's figure | peer / tessera |\n|---|---|---:|---|---|---:|---:|\n"
                  : "\n|---|---|---:|---|\n";
  auto num = [](double v) { return fmt_num(v >= 100 ? "%.1f" : v >= 1 ? "%.3f" : "%.4f", v); };
  for (const DecodeLine& l : r.lines) {
    const std::string head = "| " + l.row + " | " + l.measure + " | " + num(l.value) + " | " + l.unit + " |";
    if (!with_peer) {
      md += head + "\n";
      continue;
    }
    if (l.peers.empty()) md += head + " – | – | – |\n";
    for (const auto& [label, key] : l.peers) {
      const auto it = peer.ms.find(key);
      if (it == peer.ms.end()) {
        md += head + " " + label + " | – | – |\n";
        continue;
      }
      const double v = it->second * l.peer_factor;
      md += head + " " + label + " | " + num(v) + " | " + fmt_num("%.2f×", v / l.value) + " |\n";
    }
  }
  return md;
}

}  // namespace tessera
