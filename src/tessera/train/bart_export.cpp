#include "tessera/train/bart_export.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/models/bart_naming.h"
#include "tessera/train/safetensors.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
// The names under which a BART file may store the one shared token table.
const char* const kSharedNames[] = {"model.shared.weight", "model.encoder.embed_tokens.weight",
                                    "model.decoder.embed_tokens.weight", "lm_head.weight"};
}  // namespace

void save_bart_pretrained(const std::string& dir, const EncoderDecoder& model) {
  const EncDecConfig& cfg = model.config();
  const ParamBuffer& pb = model.params();
  const std::vector<ExportTensor> layout = bart_layout(cfg, pb);
  const nlohmann::json config = bart_config_json(cfg);
  fs::create_directories(dir);
  // One f32 host copy of every parameter (the writer streams each tensor from it) and BART's zero logits bias.
  const std::vector<float> host = pb.read_f32(model.context());
  const std::vector<float> zeros(static_cast<size_t>(cfg.vocab), 0.0f);
  SafetensorsWriter w;
  for (const ExportTensor& t : layout) {
    const float* src = host.data() + pb.segments()[t.segment].offset + t.row_begin * t.cols;
    if (pb.shape(t.segment).size() == 1) w.add(t.name, DType::F32, {t.rows}, src);
    else w.add(t.name, DType::F32, {t.rows, t.cols}, src);
  }
  w.add("final_logits_bias", DType::F32, {1, cfg.vocab}, zeros.data());
  w.set_metadata("format", "pt");
  w.write(dir + "/model.safetensors");
  write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
}

std::unique_ptr<EncoderDecoder> load_bart_pretrained(const std::string& dir, Context& ctx, DType dtype) {
  const std::string config_path = dir + "/config.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file_text(config_path, "BART config"));
  } catch (const nlohmann::json::exception& e) {
    TS_THROW(config_path, ": not JSON (", e.what(), ")");
  }
  const EncDecConfig cfg = encdec_config_from_bart_json(j, config_path);
  const SafetensorsFile st = SafetensorsFile::load(dir + "/model.safetensors");
  const std::string& file = st.path();
  auto model = std::make_unique<EncoderDecoder>(cfg, ctx, dtype);
  const ParamBuffer& pb = model->params();
  std::vector<float> host(pb.size(), 0.0f);
  std::set<std::string> used;
  for (const ExportTensor& t : bart_layout(cfg, pb)) {
    std::string name = t.name;
    if (name == kSharedNames[0])
      for (const char* alias : kSharedNames)
        if (!st.has(name) && st.has(alias)) name = alias;
    TS_CHECK(st.has(name), file, ": missing tensor '", t.name, "'");
    const bool vec = pb.shape(t.segment).size() == 1;
    float* dst = host.data() + pb.segments()[t.segment].offset + t.row_begin * t.cols;
    st.read_f32(name, vec ? std::vector<int64_t>{t.rows} : std::vector<int64_t>{t.rows, t.cols}, dst);
    used.insert(name);
  }
  // Tied copies of the shared table say nothing more; a logits bias tessera would drop must be zero.
  for (const std::string& name : st.names()) {
    if (used.count(name)) continue;
    bool tied_copy = false;
    for (const char* alias : kSharedNames) tied_copy = tied_copy || name == alias;
    if (tied_copy) continue;
    TS_CHECK(name == "final_logits_bias", file, ": tensor '", name, "' is not one of BART's");
    std::vector<float> bias(static_cast<size_t>(cfg.vocab));
    st.read_f32(name, {1, cfg.vocab}, bias.data());
    for (float b : bias) TS_CHECK(b == 0.0f, file, ": final_logits_bias is not zero, and tessera has no logits bias");
  }
  model->params().write_f32(host, ctx);
  return model;
}

}  // namespace tessera
