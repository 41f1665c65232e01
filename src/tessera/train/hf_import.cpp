#include "tessera/train/hf_import.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/json_fields.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kIndex = "model.safetensors.index.json";

bool ends_with(const std::string& s, const char* tail) {
  const std::string t(tail);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// The name hf_naming gives tensor `name` of the file: GPT-2's with its "transformer." prefix (GPT2Model's
// save_pretrained, and the hub's gpt2, write "h.0.ln_1.weight").
std::string canonical_name(const std::string& name, CheckpointNaming naming) {
  if (naming != CheckpointNaming::Gpt2 || name.rfind("transformer.", 0) == 0 || name == "lm_head.weight") return name;
  return "transformer." + name;
}

// Buffers that older transformers saved beside the weights: recomputed by the model, never parameters.
bool is_buffer(const std::string& name, CheckpointNaming naming) {
  if (naming == CheckpointNaming::Gpt2) return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  return ends_with(name, ".rotary_emb.inv_freq");
}

json read_json(const fs::path& path, const std::string& where) {
  const std::string text = read_file_text(path.string(), where.c_str());
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    TS_THROW(where, ": ", path.string(), " is not valid JSON");
  }
}

// The shard files model.safetensors.index.json names, each checked to be there, and the tensor -> file map.
std::map<std::string, std::string> read_index(const fs::path& dir, const std::string& where) {
  const json index = read_json(dir / kIndex, where);
  TS_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), where, ": ", kIndex,
           " has no weight_map object (tensor name -> shard file)");
  std::map<std::string, std::string> map;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    TS_CHECK(it.value().is_string(), where, ": ", kIndex, ": weight_map['", it.key(), "'] is ", json_kind(it.value()),
             ", not a file name");
    const std::string file = it.value().get<std::string>();
    // A name, not a path: the shards lie beside the index.
    TS_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..", where, ": ", kIndex,
             " names shard '", file, "' for tensor '", it.key(), "', which is not a file name in the directory");
    map[it.key()] = file;
  }
  TS_CHECK(!map.empty(), where, ": ", kIndex, " names no tensors");
  for (const auto& [tensor, file] : map)
    TS_CHECK(fs::is_regular_file(dir / file), where, ": ", kIndex, " names shard ", file, " (for tensor '", tensor,
             "'), which is missing");
  return map;
}

std::vector<int64_t> stored_shape(const ExportTensor& t, bool vec) {
  if (t.transpose) return {t.cols, t.rows};
  return vec ? std::vector<int64_t>{t.rows} : std::vector<int64_t>{t.rows, t.cols};
}
}  // namespace

bool is_sharded_hf_checkpoint(const std::string& dir) {
  return fs::is_directory(dir) && fs::is_regular_file(fs::path(dir) / kIndex) &&
         fs::is_regular_file(fs::path(dir) / "config.json");
}

HfCheckpoint HfCheckpoint::open(const std::string& dir, std::optional<SafetensorsFile> model_file) {
  HfCheckpoint ck;
  ck.dir_ = dir;
  const std::string where = "checkpoint " + dir;
  const fs::path root(dir);
  ck.hf_ = model_config_from_hf_json(read_json(root / "config.json", where), where + ": config.json");
  std::map<std::string, std::string> index;  // empty: one model.safetensors
  if (model_file) {
    ck.shards_.push_back(std::move(*model_file));
  } else if (fs::is_regular_file(root / kIndex)) {
    index = read_index(root, where);
    std::set<std::string> files;
    for (const auto& [tensor, file] : index) files.insert(file);
    for (const std::string& file : files) ck.shards_.push_back(SafetensorsFile::load((root / file).string()));
  } else {
    ck.shards_.push_back(SafetensorsFile::load((root / "model.safetensors").string()));
  }
  for (size_t s = 0; s < ck.shards_.size(); ++s) {
    const SafetensorsFile& st = ck.shards_[s];
    const std::string file = fs::path(st.path()).filename().string();
    for (const std::string& name : st.names()) {
      if (is_buffer(name, ck.hf_.naming)) continue;
      TS_CHECK(index.empty() || index.count(name), where, ": shard ", file, " holds tensor '", name, "', which ",
               kIndex, " does not name");
      TS_CHECK(index.empty() || index.at(name) == file, where, ": ", kIndex, " puts tensor '", name, "' in ",
               index.at(name), ", but shard ", file, " holds it");
      const std::string canonical = canonical_name(name, ck.hf_.naming);
      const auto [it, fresh] = ck.sources_.emplace(canonical, Source{static_cast<int>(s), name});
      TS_CHECK(fresh, where, ": tensor '", name, "' is held twice (in ",
               fs::path(ck.shards_[it->second.shard].path()).filename().string(), " and in ", file, ")");
    }
  }
  for (const auto& [tensor, file] : index)
    TS_CHECK(is_buffer(tensor, ck.hf_.naming) || ck.sources_.count(canonical_name(tensor, ck.hf_.naming)), where, ": ",
             kIndex, " puts tensor '", tensor, "' in ", file, ", which does not hold it");
  ParamBuffer pb;  // segments only: nothing allocated
  model_describe_params(ck.hf_.cfg, pb);
  ck.check_tensors(checkpoint_layout(ck.hf_.cfg, pb, ck.hf_.naming), pb);
  return ck;
}

void HfCheckpoint::check_tensors(const std::vector<ExportTensor>& layout, const ParamBuffer& params) const {
  const std::string where = "checkpoint " + dir_;
  const ModelConfig& cfg = hf_.cfg;
  const bool gpt2 = hf_.naming == CheckpointNaming::Gpt2;
  // The vocab first: a config whose vocab_size the embedding does not hold (a padded or a cut vocab) is named as
  // that, not as one tensor's shape.
  const std::string wte = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  if (sources_.count(wte)) {
    const Source& src = source(wte);
    const auto& shape = shards_[src.shard].entry(src.name).shape;
    TS_CHECK(shape.size() != 2 || shape[0] == cfg.vocab, where, ": config.json's vocab_size ", cfg.vocab,
             " does not match the embedding ", src.name, ", which holds ", shape[0], " token rows");
  }
  std::set<std::string> expected;
  std::vector<std::string> missing;
  for (const ExportTensor& t : layout) {
    expected.insert(t.name);
    if (!sources_.count(t.name)) missing.push_back(t.name);
  }
  TS_CHECK(missing.empty(), where, ": missing tensor '", missing.front(), "'",
           missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : std::string(),
           "; its config.json needs ", layout.size(), " tensors");
  for (const auto& [name, src] : sources_) {
    if (cfg.tied && name == "lm_head.weight") {
      // Tied: transformers makes lm_head the embedding, whatever the file holds; only its shape must fit.
      shards_[src.shard].check_float_shape(src.name, {cfg.vocab, cfg.d_model});
      continue;
    }
    TS_CHECK(expected.count(name), where, ": tensor '", src.name, "' is not one of the model's ", layout.size(),
             " that its config.json describes",
             ends_with(name, ".bias") && !gpt2 ? " (a bias, which the Llama layout has none of)" : "");
  }
  for (const ExportTensor& t : layout) {
    const Source& src = source(t.name);
    shards_[src.shard].check_float_shape(src.name, stored_shape(t, params.shape(t.segment).size() == 1));
  }
}

void HfCheckpoint::load_into(Model& model) const {
  ParamBuffer& params = model.params();
  // A CPU f32 model is filled in place; any other through one f32 host copy written back at the end.
  const bool direct = params.device().is_cpu() && params.dtype() == DType::F32;
  std::vector<float> host_copy;
  if (!direct) host_copy = params.read_f32(model.context());
  fill_f32(params, direct ? params.host_data<float>() : host_copy.data());
  if (!direct) params.write_f32(host_copy, model.context());
}

void HfCheckpoint::fill_f32(const ParamBuffer& params, float* base) const {
  for (const ExportTensor& t : checkpoint_layout(hf_.cfg, params, hf_.naming)) {
    const Source& src = source(t.name);
    const SafetensorsFile& st = shards_[src.shard];
    float* dst = base + params.segments()[t.segment].offset + t.row_begin * t.cols;
    // Rows [row_begin, row_begin + rows) of the segment: Llama's q, k and v (gate and up) fill one fused matrix.
    if (t.transpose) st.read_f32_transposed(src.name, /*rows=*/t.cols, /*cols=*/t.rows, dst);
    else st.read_f32(src.name, stored_shape(t, params.shape(t.segment).size() == 1), dst);
  }
}

}  // namespace tessera
