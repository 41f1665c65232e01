#include "tessera/cli/common.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <new>
#include <regex>

#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/memory.h"
#include "tessera/infer/bleu.h"
#include "tessera/infer/engine.h"
#include "tessera/train/data.h"

namespace tessera::cli {

namespace {

std::string dashed(std::string s) {
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

}  // namespace

std::vector<std::string> model_flag_names() {
  std::vector<std::string> names{"preset"};
  for (const auto& field : model_config_fields()) names.push_back(dashed(field));
  return names;
}

void add_model_flags(Flags& f) {
  f.add("preset", "NAME",
        "model preset: tiny, gpt2-124m, cs336-small|medium|large|xl|2.7b, llama-gqa-small (default tiny)");
  for (const auto& field : model_config_fields()) f.add(dashed(field), "V", "override the preset's " + field);
}

ModelConfig model_from_flags(const Flags& f) {
  ModelConfig cfg = model_preset(f.str("preset", "tiny"));
  try {
    for (const auto& field : model_config_fields()) {
      if (f.has(dashed(field))) model_config_set(cfg, field, f.str(dashed(field)));
    }
    cfg.validate();
  } catch (const Error& e) {
    // A field given as a flag is named as the flag: the field a message is about ("config: emb_scale must be ..."
    // for --emb-scale nan would read as if a config file were wrong, where --lr nan says "--lr ..."), and any other
    // field it quotes with its value (`--preset gpt2-124m --n-heads 5`: "... not divisible by --n-heads 5", not
    // "by n_heads 5"). Fields from the preset keep their names; words and quoted values that happen to spell a
    // field ("got 'tied'", "sinusoidal positions need") are left alone. A message that names no flag stays as it is.
    const std::string msg = e.what(), config = "config: ";
    std::string out = msg;
    for (const auto& field : model_config_fields()) {
      if (!f.has(dashed(field))) continue;
      if (out.starts_with(config + field + " ")) out = "--" + dashed(field) + out.substr(config.size() + field.size());
      const std::regex quoted("(^|[ (\\[])" + field + "(?= -?[0-9])");
      out = std::regex_replace(out, quoted, "$1--" + dashed(field));
    }
    if (out == msg) throw;
    if (out.starts_with(config)) out.erase(0, config.size());
    throw Error(e.file(), e.line(), out);
  }
  // Unused by other positions, so a --rope-theta given to them (even 0, which rope refuses) trained silently.
  TS_CHECK(!f.has("rope-theta") || cfg.positions == PositionKind::Rope,
           "--rope-theta applies to rotary positions "
           "(--positions rope); this model's positions are ",
           position_kind_name(cfg.positions));
  return cfg;
}

bool holds_run(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  return fs::exists(dir / "metrics.jsonl") || fs::exists(dir / "checkpoint") || fs::exists(dir / "checkpoint.old") ||
         fs::exists(dir / "best");
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e12) std::snprintf(buf, sizeof buf, "%.3fT", n / 1e12);  // not "215780.500B"
  else if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.3fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::vector<int32_t> encode_prompt(const std::string& prompt, int vocab) {
  std::vector<int32_t> tokens;
  for (uint16_t t : byte_encode(prompt)) {
    TS_CHECK(t < vocab, "the prompt holds byte ", t, ", outside the model's vocab ", vocab);
    tokens.push_back(t);
  }
  return tokens;
}

const char* stop_word(int sig) {
  return sig == SIGTERM   ? "terminated"
         : sig == SIGHUP  ? "hung up"
         : sig == SIGPIPE ? "stopped: output closed"
                          : "interrupted";
}

void generate_streamed(Model& model, const std::vector<int32_t>& prompt, int max_new, const SamplerParams& p) {
  // A write that fails (stdout on a full disk, or closed) stops the generation there: the text is lost, and the rest
  // would be too. main() checks what other commands print, once they return.
  const auto put = [](const std::string& text) {  // may hold any byte, NUL included
    const bool ok = std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0;
    const int e = errno;
    if (!ok) throw OutputLost(__FILE__, __LINE__, std::string("cannot write standard output: ") + std::strerror(e));
  };
  sampler_check(p);  // before anything is printed
  TS_CHECK(!prompt.empty(), "generate: the prompt is empty");
  put(byte_decode(prompt));
  try {
    const auto on_token = [&](int32_t t) { put(byte_decode({t})); };
    // The KV-cache engine (infer/engine.h), with the model's weights in place; a model it does not run (sinusoidal
    // positions) takes the full-recompute generate(), which gives the same tokens.
    if (Engine::unsupported(model.config()).empty()) {
      Engine engine(model, {.batch = 1});
      engine_generate(engine, prompt, max_new, p, on_token);
    } else {
      generate(model, prompt, max_new, p, on_token);
    }
  } catch (...) {
    // The text so far ends its line; the error follows on stderr. Unchecked: the error may be this very stream's.
    std::fputc('\n', stdout);
    throw;
  }
  put("\n");
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

void check_output_path(const std::string& flag, const std::string& path) {
  TS_CHECK(!path.empty(), "--", flag, " needs a file name");
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  TS_CHECK(std::filesystem::is_directory(parent) && ::access(parent.c_str(), W_OK) == 0, "--", flag, " ", path,
           ": directory ", parent.string(), " does not exist or is not writable",
           dangling_link_note(std::filesystem::path(path).parent_path().string()));
  TS_CHECK(!std::filesystem::is_directory(path), "--", flag, " ", path, " is a directory; give a file name");
  check_file_writable(path, "--" + flag);  // before the work whose result it would hold
}

void print_bench_markdown(const std::string& md, const std::string& out) {
  const size_t body = md.find('\n');
  std::fputs(body == std::string::npos ? md.c_str() : md.c_str() + body + 2, stdout);
  if (!out.empty()) {
    write_file_atomic(out, md);
    std::fflush(stdout);
    std::fprintf(stderr, "wrote %s\n", out.c_str());
  }
}

void rethrow_with_memory_hint(std::string_view hint) {
  if (hint.empty()) throw;
  try {
    throw;
  } catch (const Error& e) {
    if (!is_out_of_memory(e.what())) throw;
    TS_THROW(e.what(), " (", hint, ")");
  } catch (const std::bad_alloc&) {
    TS_THROW("out of memory (", hint, ")");
  }
}

PrepareProgress::PrepareProgress(size_t text_bytes, bool enabled, bool rate)
    : on_(enabled && text_bytes >= kMinBytes), rate_(rate),
      total_mib_(static_cast<int64_t>((text_bytes + (size_t{1} << 20) - 1) >> 20)),
      bar_(total_mib_, 0, on_, {.unit = "MiB", .eta = true}) {}

std::function<void(size_t, size_t)> PrepareProgress::callback() {
  if (!on_) return nullptr;
  return [this](size_t done, size_t total) {
    const int64_t mib = done >= total ? total_mib_ : static_cast<int64_t>(done >> 20);
    if (mib == shown_) return;  // a line per MiB at most (off a terminal: per 5%)
    shown_ = mib;
    std::string fields = mib == total_mib_ ? "shards written" : "writing shards";
    if (rate_) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      char rate[32];
      std::snprintf(rate, sizeof rate, " | %.1f MB/s", s > 0 ? static_cast<double>(done) / s / 1e6 : 0.0);
      fields += rate;
    }
    bar_.update(mib, fields);
    if (mib == total_mib_) bar_.finish();
  };
}

// The lines of a text file, as Python iterates a file opened with newline="\n": cut at each '\n', the last line
// kept whether or not a '\n' ends it. Each must be valid UTF-8 without a NUL byte.
std::vector<std::string> read_text_lines(const std::string& flag, const std::string& path) {
  const std::string what = "--" + flag;
  const std::string text = read_file_text(path, what.c_str(), nullptr, /*stop_at_nul=*/true);
  std::vector<std::string> lines;
  for (size_t i = 0; i < text.size();) {
    size_t j = text.find('\n', i);
    if (j == std::string::npos) j = text.size();
    lines.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t nul = lines[i].find('\0');
    TS_CHECK(nul == std::string::npos, what, " ", path, " line ", i + 1, " holds a NUL byte (byte ", nul + 1,
             "): not text");
    const size_t bad = bleu::invalid_utf8_at(lines[i]);
    TS_CHECK(bad == 0, what, " ", path, " line ", i + 1, " is not valid UTF-8 (byte ", bad, ")");
  }
  return lines;
}

InferenceDevice read_inference_device(const Flags& a) {
  const std::string device = a.str("device", "auto");
  TS_CHECK(device == "cpu" || device == "cuda" || device == "auto", "--device must be cpu, cuda or auto, got '", device,
           "'");
  InferenceDevice d;
  d.gpu = device == "cuda" || (device == "auto" && probe_gpu().available);
  TS_CHECK(!d.gpu || probe_gpu().available,
           "--device cuda: ", built_with_cuda() ? "no GPU is visible" : "this tessera was built without CUDA");
  const std::string prec = a.str("precision", d.gpu ? "bf16" : "f32");
  d.dtype = prec == "f32" ? DType::F32 : prec == "bf16" ? DType::BF16 : prec == "f16" ? DType::F16 : DType::U8;
  TS_CHECK(d.dtype != DType::U8, "--precision: unknown precision '", prec, "' (expected f32, bf16 or f16)");
  TS_CHECK(d.gpu || d.dtype == DType::F32, "--precision ", prec, " runs on the GPU; the CPU computes in f32",
           device == "auto" ? " (and no GPU is visible)" : "");
  return d;
}

}  // namespace tessera::cli
