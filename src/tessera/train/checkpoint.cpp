#include "tessera/train/checkpoint.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"
#include "tessera/train/hf_import.h"
#include "tessera/train/safetensors.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool fault_injected(const char* point) {
  const char* env = std::getenv("TESSERA_FAULT_INJECT");
  if (!env) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find(std::string(",") + point + ",") != std::string::npos;
}

std::vector<ExportTensor> checkpoint_layout(const Model& model) { return model.hf_tensors(); }

namespace {
// Streams every exported tensor from the parameter buffer; only a transposed one passes through the writer's
// one temporary (checkpoint_save_host_bytes counts it).
void write_model_files(const std::string& dir, const Model& model) {
  SafetensorsWriter w;
  // A CPU f32 model is streamed from its own buffer; any other (a GPU or 16-bit model) is first copied to the
  // host as f32, from its master weights when it has them.
  const ParamBuffer& params = model.params();
  std::vector<float> host_copy;
  const bool direct = params.device().is_cpu() && params.dtype() == DType::F32;
  if (!direct) host_copy = params.read_f32(model.context());
  const float* base = direct ? params.host_data<float>() : host_copy.data();
  for (const ExportTensor& t : checkpoint_layout(model)) {
    const ParamSegment& seg = model.params().segments()[t.segment];
    const float* src = base + seg.offset + t.row_begin * t.cols;
    const bool vec = model.params().shape(t.segment).size() == 1;
    if (t.transpose) {
      w.add(t.name, DType::F32, {t.cols, t.rows}, [src, rows = t.rows, cols = t.cols](void* dst) {
        float* out = static_cast<float*>(dst);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = src[r * cols + c];
      });
    } else if (vec) {
      w.add(t.name, DType::F32, {t.rows}, src);
    } else {
      w.add(t.name, DType::F32, {t.rows, t.cols}, src);
    }
  }
  w.set_metadata("format", "pt");
  w.set_metadata("tessera_config", model_config_to_json(model.config()).dump());
  w.set_metadata("tessera_naming", checkpoint_naming_name(checkpoint_naming(model.config())));
  w.write(dir + "/model.safetensors");
  write_file_atomic(dir + "/config.json",
                    hf_config_json(model.config(), checkpoint_naming(model.config())).dump(2) + "\n");
}

// TESSERA_FAULT_INJECT=<point>[,<point>...] makes save_checkpoint die by SIGKILL at that point, as a crash or a
// power loss would, so tests can show that a checkpoint stays loadable at every step. `ckpt-no-exchange`
// makes it behave as on a file system without RENAME_EXCHANGE.
void fault_point(const char* point) {
  if (fault_injected(point)) ::raise(SIGKILL);
}

// renameat2(RENAME_EXCHANGE): swaps two existing paths in one step. Returns 0, or the errno.
int rename_exchange(const fs::path& a, const fs::path& b) {
  if (fault_injected("ckpt-no-exchange")) return EINVAL;
#ifndef RENAME_EXCHANGE
  constexpr unsigned RENAME_EXCHANGE = 1u << 1;
#endif
  const long rc = ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
  return rc == 0 ? 0 : errno;
}

void rename_or_throw(const fs::path& from, const fs::path& to, const fs::path& parent) {
  std::error_code ec;
  fs::rename(from, to, ec);
  TS_CHECK(!ec, "cannot move checkpoint ", from.string(), " to ", to.string(), ": ", ec.message());
  fsync_dir(parent.string());
}

std::string model_file(const std::string& path) {
  const std::string p = resolve_checkpoint_dir(path);
  if (fs::is_regular_file(p)) {
    // A file given where a checkpoint was meant (a text file, a config.json) is named as the wrong file, not
    // reported as a checkpoint's fault ("file is truncated", or a header length spelled by its text). A file is
    // none when it is too short for the 8-byte header length, or gives a length past its end with no '{' of a
    // header after it (as the safetensors load judges); a safetensors file's own faults are left to the load.
    std::error_code ec;
    const uintmax_t size = fs::file_size(p, ec);
    std::FILE* f = ec ? nullptr : std::fopen(p.c_str(), "rb");
    if (!f) return p;  // unreadable: the load says why
    unsigned char head[9] = {};
    const size_t got = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(head[i]) << (8 * i);
    const bool not_one = got < 8 || (n > size - 8 && !(got == 9 && head[8] == '{'));
    TS_CHECK(!not_one, path, " is not a checkpoint: it is a file of ", counted(size, "byte"),
             " that is not a "
             "safetensors file (a checkpoint is a directory that train writes, OUT/checkpoint or OUT/best, or the "
             "model.safetensors in one)");
    return p;
  }
  if (!fs::is_directory(p)) return p;
  // A directory that is no checkpoint (a run's data/, say) is said to be none, not "cannot read
  // DIR/model.safetensors".
  const fs::path file = fs::path(p) / "model.safetensors";
  TS_CHECK(fs::exists(file) || !fs::exists(p), path,
           " is not a checkpoint: it holds no model.safetensors (train "
           "writes its checkpoints to OUT/checkpoint and OUT/best)");
  return file.string();
}

ModelConfig config_from(const SafetensorsFile& st) {
  const auto& meta = st.metadata();
  const auto it = meta.find("tessera_config");
  TS_CHECK(it != meta.end(), "checkpoint ", st.path(),
           ": header has no tessera_config metadata, so the model's "
           "config is unknown (tessera loads the checkpoints that it wrote)");
  json j;
  try {
    j = json::parse(it->second);
  } catch (const json::exception&) {
    TS_THROW("checkpoint ", st.path(), ": tessera_config metadata is not valid JSON");
  }
  try {
    return model_config_from_json(j);
  } catch (const Error& e) {
    TS_THROW("checkpoint ", st.path(), ": ", e.what());
  }
}

// Copies every tensor from the mapped file into the parameter buffer; transposes are undone while copying.
// Every tensor of `layout` is in the file, and no other. Named, not counted: the first tensor the model needs that
// the file lacks, then the first it does not need.
void check_tensor_names(const SafetensorsFile& st, const std::vector<ExportTensor>& layout) {
  const std::string& file = st.path();
  std::set<std::string> expected;
  std::vector<std::string> missing;
  for (const ExportTensor& t : layout) {
    expected.insert(t.name);
    if (!st.has(t.name)) missing.push_back(t.name);
  }
  TS_CHECK(missing.empty(), "checkpoint ", file, ": missing tensor '", missing.front(), "'",
           missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : std::string(),
           "; the config in its metadata needs ", layout.size(), " tensors");
  for (const std::string& name : st.names())
    TS_CHECK(expected.count(name), "checkpoint ", file, ": tensor '", name, "' is not one of the model's ",
             layout.size(), " (a file for another config?)");
}

// The shape the file must give tensor t: (rows, cols), (cols, rows) stored transposed, or (rows) for a vector.
std::vector<int64_t> stored_shape(const ExportTensor& t, bool vec) {
  if (t.transpose) return {t.cols, t.rows};
  return vec ? std::vector<int64_t>{t.rows} : std::vector<int64_t>{t.rows, t.cols};
}

// Writes each of the model's tensors, as f32, at its place in `base` (a host array laid out as its parameters).
void fill_f32(const SafetensorsFile& st, const Model& model, float* base) {
  const auto layout = checkpoint_layout(model);
  check_tensor_names(st, layout);
  for (const ExportTensor& t : layout) {
    const ParamSegment& seg = model.params().segments()[t.segment];
    float* dst = base + seg.offset + t.row_begin * t.cols;
    const bool vec = model.params().shape(t.segment).size() == 1;
    if (t.transpose) st.read_f32_transposed(t.name, /*rows=*/t.cols, /*cols=*/t.rows, dst);
    else st.read_f32(t.name, stored_shape(t, vec), dst);
  }
}

void weights_from(const SafetensorsFile& st, Model& model) {
  // A CPU f32 model is filled in place; any other through one f32 host copy written back at the end.
  ParamBuffer& params = model.params();
  const bool direct = params.device().is_cpu() && params.dtype() == DType::F32;
  std::vector<float> host_copy;
  if (!direct) host_copy = params.read_f32(model.context());
  fill_f32(st, model, direct ? params.host_data<float>() : host_copy.data());
  if (!direct) params.write_f32(host_copy, model.context());
}
}  // namespace

std::string resolve_checkpoint_dir(const std::string& path) {
  if (fs::exists(path)) {
    // A run directory (train's --out) given where its checkpoint was meant: say where the checkpoints are.
    const fs::path run(path);
    if (fs::is_directory(run) && !fs::exists(run / "model.safetensors") &&
        (fs::is_regular_file(run / "checkpoint" / "model.safetensors") ||
         fs::is_regular_file(run / "checkpoint.old" / "model.safetensors"))) {
      const bool best = fs::is_regular_file(run / "best" / "model.safetensors");
      TS_THROW(path, " is a training run's directory, not a checkpoint: give ", (run / "checkpoint").string(),
               " (the last step)", best ? " or " + (run / "best").string() + " (the best validation loss)" : "");
    }
    return path;
  }
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const fs::path old = p.parent_path() / (p.filename().string() + ".old");
  if (fs::is_regular_file(old / "model.safetensors")) return old.string();
  return path;
}

size_t checkpoint_save_host_bytes(const ModelConfig& cfg) {
  // Only GPT-2's Conv1D weights are stored transposed, through one temporary as large as the largest of them:
  // qkv (3C, C), proj (C, C), fc (F_in, C), fc projection (C, F). Everything else streams from the parameters.
  if (checkpoint_naming(cfg) != CheckpointNaming::Gpt2) return 0;
  const size_t C = cfg.d_model, F = cfg.d_ff, F_in = cfg.d_ff_in();
  return std::max({3 * C * C, C * C, F_in * C, C * F}) * sizeof(float);
}

void write_train_state_files(const std::string& dir, const TrainState& state, int64_t n_params) {
  if (!state.tokenizer_json.empty())
    write_file_atomic((fs::path(dir) / "tokenizer.json").string(), state.tokenizer_json);
  SafetensorsWriter w;
  const int64_t n = n_params;
  TS_CHECK(static_cast<int64_t>(state.adam_m.size()) == n && static_cast<int64_t>(state.adam_v.size()) == n,
           "internal: optimizer state does not match the model");
  w.add("adam.m", DType::F32, {n}, state.adam_m.data());
  w.add("adam.v", DType::F32, {n}, state.adam_v.data());
  w.set_metadata("format", "pt");
  w.set_metadata("step", std::to_string(state.step));
  w.set_metadata("optimizer_step", std::to_string(state.optimizer_step < 0 ? state.step : state.optimizer_step));
  if (state.loss_scale > 0) {
    char scale[40];
    std::snprintf(scale, sizeof scale, "%.17g", state.loss_scale);
    w.set_metadata("loss_scale", scale);
    w.set_metadata("loss_scale_good_steps", std::to_string(state.loss_scale_good_steps));
  }
  w.set_metadata("rng_seed", std::to_string(state.rng.seed));
  w.set_metadata("rng_next_stream", std::to_string(state.rng.next_stream));
  w.set_metadata("data_pos", std::to_string(state.data_pos));
  w.set_metadata("metrics_from", std::to_string(state.metrics_from));
  w.set_metadata("options", state.options_json);
  if (std::isfinite(state.val_loss)) {
    char loss[40];
    std::snprintf(loss, sizeof loss, "%.17g", state.val_loss);
    w.set_metadata("val_loss", loss);
  }
  w.write((fs::path(dir) / "optimizer.safetensors").string());
}

void write_checkpoint_dir(const std::string& dir, const std::function<void(const std::string& tmp)>& write_files) {
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "ck/"
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  ensure_writable_dir(parent.string());
  const fs::path tmp = parent / (target.filename().string() + ".tmp");
  const fs::path old = parent / (target.filename().string() + ".old");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  TS_CHECK(!ec, "cannot create checkpoint directory ", tmp.string(), ": ", ec.message());
  try {  // a failed write (a full disk) leaves no half-written <dir>.tmp behind
    write_files(tmp.string());
    fsync_dir(tmp.string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fault_point("ckpt-after-write");

  // Put the finished directory in place so that at every moment a whole checkpoint sits at `target`, or (on
  // a file system without RENAME_EXCHANGE) at `old`, where the loaders look when `target` is missing.
  if (!fs::exists(target)) {
    // First save, or a crash left only <dir>.old: a plain rename, then the stale copy goes.
    rename_or_throw(tmp, target, parent);
    fs::remove_all(old, ec);
    return;
  }
  const int e = rename_exchange(tmp, target);
  if (e == 0) {
    fsync_dir(parent.string());
    fault_point("ckpt-after-exchange");
    fs::remove_all(tmp, ec);  // now the previous checkpoint
    fs::remove_all(old, ec);
    return;
  }
  TS_CHECK(e == EINVAL || e == ENOSYS || e == EOPNOTSUPP, "cannot move checkpoint into ", target.string(), ": ",
           std::strerror(e));
  // No RENAME_EXCHANGE here: two renames. Between them only <dir>.old holds a checkpoint.
  fs::remove_all(old, ec);
  rename_or_throw(target, old, parent);
  fault_point("ckpt-after-move-old");
  rename_or_throw(tmp, target, parent);
  fs::remove_all(old, ec);
}

void save_checkpoint(const std::string& dir, const Model& model, const TrainState* state) {
  write_checkpoint_dir(dir, [&](const std::string& tmp) {
    write_model_files(tmp, model);
    if (state) write_train_state_files(tmp, *state, static_cast<int64_t>(model.params().size()));
  });
}

namespace {
// A checkpoint opened once: tessera's own (the config in its model file's metadata) or a directory that Hugging
// Face's save_pretrained wrote (config.json beside a model file without tessera_config, or sharded).
struct OpenCheckpoint {
  std::optional<SafetensorsFile> st;
  std::optional<HfCheckpoint> hf;
  ModelConfig cfg;
};

// Whether the model file `st` of directory `dir` is one that Hugging Face wrote: config.json beside it, and none of
// the metadata tessera writes. A tessera checkpoint that lost its tessera_config keeps saying so, unless nothing
// is left to tell it from a save_pretrained directory (its whole metadata gone, a GPT-2 or Llama config.json).
bool is_hf_model_file(const SafetensorsFile& st, const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json";
  if (st.metadata().count("tessera_config") || st.metadata().count("tessera_naming") || !fs::is_directory(dir) ||
      !fs::is_regular_file(config))
    return false;
  try {  // tessera's own config.json (model_type "tessera") belongs to a checkpoint that lost its metadata
    const json j = json::parse(read_file_text(config.string(), "checkpoint"));
    return !(j.is_object() && j.value("model_type", json()) == "tessera");
  } catch (const json::exception&) {
    return true;  // HfCheckpoint::open names the file
  }
}

OpenCheckpoint open_checkpoint(const std::string& path) {
  OpenCheckpoint ck;
  const std::string dir = resolve_checkpoint_dir(path);
  if (is_sharded_hf_checkpoint(dir)) {
    ck.hf = HfCheckpoint::open(dir);
    ck.cfg = ck.hf->config();
    return ck;
  }
  SafetensorsFile st = SafetensorsFile::load(model_file(path));
  if (is_hf_model_file(st, dir)) {
    ck.hf = HfCheckpoint::open(dir, std::move(st));
    ck.cfg = ck.hf->config();
    return ck;
  }
  ck.cfg = config_from(st);
  ck.st = std::move(st);
  return ck;
}

void load_weights(const OpenCheckpoint& ck, Model& model) {
  if (ck.hf) ck.hf->load_into(model);
  else weights_from(*ck.st, model);
}
}  // namespace

ModelConfig load_checkpoint_config(const std::string& path) { return open_checkpoint(path).cfg; }

std::vector<int32_t> checkpoint_eos_ids(const std::string& path, int vocab) {
  if (!open_checkpoint(path).hf) return {};
  const fs::path dir = resolve_checkpoint_dir(path);
  const fs::path gen = dir / "generation_config.json";
  const fs::path file = fs::is_regular_file(gen) ? gen : dir / "config.json";
  json j;
  try {
    j = json::parse(read_file_text(file.string(), "checkpoint"));
  } catch (const json::exception& e) {
    TS_THROW("checkpoint ", file.string(), ": not valid JSON (", e.what(), ")");
  }
  const json eos = j.is_object() ? j.value("eos_token_id", json()) : json();
  std::vector<int32_t> ids;
  for (const json& e : eos.is_array() ? eos : json::array({eos}))
    if (e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < vocab)
      ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  return ids;
}

ModelConfig check_checkpoint_model(const std::string& path) {
  const OpenCheckpoint ck = open_checkpoint(path);
  if (ck.hf) return ck.cfg;  // HfCheckpoint::open checked every tensor
  ParamBuffer pb;            // segments only: nothing allocated
  model_describe_params(ck.cfg, pb);
  const auto layout = checkpoint_layout(ck.cfg, pb);
  check_tensor_names(*ck.st, layout);
  for (const ExportTensor& t : layout)
    ck.st->check_float_shape(t.name, stored_shape(t, pb.shape(t.segment).size() == 1));
  return ck.cfg;
}

void load_checkpoint_weights(const std::string& path, Model& model) { load_weights(open_checkpoint(path), model); }

std::unique_ptr<Model> load_checkpoint_model(const std::string& path) {
  // One open: the config, then the weights from the same mappings.
  const OpenCheckpoint ck = open_checkpoint(path);
  auto model = make_model(ck.cfg);
  load_weights(ck, *model);
  return model;
}

std::unique_ptr<Model> load_checkpoint_model(const std::string& path, Context& ctx, DType dtype) {
  const OpenCheckpoint ck = open_checkpoint(path);
  auto model = make_model(ck.cfg, ctx, dtype);
  load_weights(ck, *model);
  return model;
}

InferenceModel load_inference_model(const std::string& path, Context& ctx, DType dtype) {
  const OpenCheckpoint ck = open_checkpoint(path);
  InferenceModel out;
  out.model = make_model(ck.cfg, ctx, dtype, MasterWeights::Off);
  ParamBuffer& params = out.model->params();
  // Zeros where no tensor writes (as a fresh CPU model has them), then the file's values, then one upload.
  std::vector<float> host(params.size(), 0.0f);
  if (ck.hf) ck.hf->fill_f32(params, host.data());
  else fill_f32(*ck.st, *out.model, host.data());
  const float* w = host.data();
  const long n = static_cast<long>(host.size());
  size_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (long i = 0; i < n; ++i) bad += !std::isfinite(w[i]);
  out.non_finite = bad;
  params.write_f32(host, ctx);
  return out;
}

namespace {
// A whole-integer metadata value of the training state, named when missing or malformed (std::stoll would take
// "12abc" as 12, and std::stoull "-1" as 2^64 - 1).
template <typename T>
T meta_integer(const SafetensorsFile& st, const std::string& key) {
  const auto& meta = st.metadata();
  const auto it = meta.find(key);
  TS_CHECK(it != meta.end(), "checkpoint ", st.path(), ": optimizer state has no '", key, "' metadata");
  const std::string& text = it->second;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TS_CHECK(ec == std::errc() && end == text.data() + text.size(), "checkpoint ", st.path(), ": metadata '", key,
           "' is not a whole number", std::is_unsigned_v<T> ? " >= 0" : "", ": '", text, "'");
  return value;
}
}  // namespace

bool holds_train_state(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "model.safetensors") &&
         fs::is_regular_file(fs::path(dir) / "optimizer.safetensors");
}

std::string read_dir_tokenizer(const std::string& dir, int64_t* vocab) {
  if (vocab) *vocab = 0;
  std::error_code ec;
  const fs::path file = fs::path(dir) / "tokenizer.json";
  if (!fs::is_directory(dir, ec) || !fs::exists(file, ec)) return "";
  const std::string text = read_file_text(file.string(), "tokenizer");
  const BpeTokenizer tok(read_hf_tokenizer_json(file.string()), file.string());  // checked: it must load
  if (vocab) *vocab = static_cast<int64_t>(tok.vocab_size());
  return text;
}

TrainState load_train_state(const std::string& path, const Model& model) {
  return read_train_state(path, static_cast<int64_t>(model.params().size()));
}

TrainState read_train_state(const std::string& path, int64_t n_params) {
  const std::string dir = resolve_checkpoint_dir(path);
  const std::string file = (fs::path(dir) / "optimizer.safetensors").string();
  TS_CHECK(fs::exists(file), "checkpoint ", dir, " has no optimizer state (", file, " is missing)");
  const SafetensorsFile st = SafetensorsFile::load(file);
  TrainState s;
  const int64_t n = n_params;
  s.adam_m.resize(n);
  s.adam_v.resize(n);
  st.read_f32("adam.m", {n}, s.adam_m.data());
  st.read_f32("adam.v", {n}, s.adam_v.data());
  s.step = meta_integer<int64_t>(st, "step");
  s.rng.seed = meta_integer<uint64_t>(st, "rng_seed");
  s.rng.next_stream = meta_integer<uint64_t>(st, "rng_next_stream");
  s.data_pos = meta_integer<uint64_t>(st, "data_pos");
  // Absent in checkpoints written before loss scaling: no step was skipped, no scaler ran.
  const auto& meta = st.metadata();
  s.optimizer_step = meta.count("optimizer_step") ? meta_integer<int64_t>(st, "optimizer_step") : s.step;
  s.metrics_from = meta.count("metrics_from") ? meta_integer<int64_t>(st, "metrics_from") : 1;
  if (meta.count("loss_scale")) {
    const std::string& text = meta.at("loss_scale");
    char* end = nullptr;
    s.loss_scale = std::strtod(text.c_str(), &end);
    TS_CHECK(!text.empty() && end == text.c_str() + text.size(), "checkpoint ", file,
             ": metadata 'loss_scale' is not "
             "a number: '",
             text, "'");
    s.loss_scale_good_steps = meta_integer<int64_t>(st, "loss_scale_good_steps");
  }
  TS_CHECK(s.step >= 0, "checkpoint ", file, ": step ", s.step, " is negative");
  TS_CHECK(s.optimizer_step >= 0 && s.optimizer_step <= s.step, "checkpoint ", file, ": optimizer step ",
           s.optimizer_step, " is not in [0, step ", s.step, "]");
  TS_CHECK(s.loss_scale == 0 || (std::isfinite(s.loss_scale) && s.loss_scale >= 1), "checkpoint ", file,
           ": malformed loss scale ", s.loss_scale);
  // Checked here, where the file is named, and in every run: the scaler checks it again only where it runs (f16).
  TS_CHECK(s.loss_scale_good_steps >= 0, "checkpoint ", file, ": loss_scale_good_steps ", s.loss_scale_good_steps,
           " is negative");
  TS_CHECK(s.metrics_from >= 1 && s.metrics_from <= s.step + 1, "checkpoint ", file, ": metrics_from ", s.metrics_from,
           " is not in [1, step + 1 = ", s.step + 1, "]");
  TS_CHECK(meta.count("options"), "checkpoint ", file, ": optimizer state has no 'options' metadata");
  s.options_json = meta.at("options");
  s.tokenizer_json = read_dir_tokenizer(dir);
  return s;  // val_loss stays NaN: best_record reads it, and a run resumed from best/ must not copy it on
}

std::string unfinished_checkpoint_note(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const fs::path tmp = (p.has_parent_path() ? p.parent_path() : fs::path(".")) / (p.filename().string() + ".tmp");
  return fs::is_directory(tmp) ? ": the run was stopped while writing it (" + tmp.string() + " is incomplete)" : "";
}

std::optional<std::pair<double, int64_t>> best_record(const std::string& dir) {
  if (!holds_train_state(dir)) return std::nullopt;
  const SafetensorsFile st = SafetensorsFile::load((fs::path(dir) / "optimizer.safetensors").string());
  const auto& meta = st.metadata();
  const auto it = meta.find("val_loss");
  if (it == meta.end()) return std::nullopt;
  char* end = nullptr;
  const double loss = std::strtod(it->second.c_str(), &end);
  TS_CHECK(!it->second.empty() && end == it->second.c_str() + it->second.size() && std::isfinite(loss), "checkpoint ",
           dir, ": metadata 'val_loss' is not a finite number: '", it->second, "'");
  return std::make_pair(loss, meta_integer<int64_t>(st, "step"));
}

}  // namespace tessera
