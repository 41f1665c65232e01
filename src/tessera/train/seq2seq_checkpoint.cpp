#include "tessera/train/seq2seq_checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/json_fields.h"
#include "tessera/models/bart_naming.h"
#include "tessera/models/config.h"
#include "tessera/train/bart_export.h"
#include "tessera/train/safetensors.h"

namespace tessera {

namespace fs = std::filesystem;
using json = nlohmann::json;

// tessera's config.json for an encoder-decoder that BART cannot express (pre-norm, sinusoidal positions, unshared
// embeddings, ...): every EncDecConfig field, so that a load rebuilds exactly the model that was saved.
json encdec_config_json(const EncDecConfig& c) {
  return {{"model_type", "tessera"},
          {"is_encoder_decoder", true},
          {"preset", c.preset},
          {"vocab", c.vocab},
          {"src_vocab", c.src_vocab},
          {"enc_layers", c.enc_layers},
          {"dec_layers", c.dec_layers},
          {"d_model", c.d_model},
          {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads},
          {"d_ff", c.d_ff},
          {"max_seq", c.max_seq},
          {"placement", c.placement == NormPlacement::Pre ? "pre" : "post"},
          {"act", std::string(activation_name(c.act))},
          {"positions", position_kind_name(c.positions)},
          {"pos_offset", c.pos_offset},
          {"scale_embedding", c.scale_embedding},
          {"layernorm_embedding", c.layernorm_embedding},
          {"shared_embeddings", c.shared_embeddings},
          {"tied_output", c.tied_output},
          {"dropout", c.dropout},
          {"attn_dropout", c.attn_dropout},
          {"act_dropout", c.act_dropout},
          {"pad_id", c.pad_id},
          {"bos_id", c.bos_id},
          {"eos_id", c.eos_id},
          {"decoder_start_id", c.decoder_start_id},
          {"norm_eps", c.norm_eps},
          {"init_std", c.init_std}};
}

EncDecConfig encdec_config_from_tessera_json(const json& j, const std::string& where) {
  EncDecConfig c;
  c.preset = json_string(j, "preset", where);
  c.vocab = json_int(j, "vocab", where);
  c.src_vocab = json_int(j, "src_vocab", where);
  c.enc_layers = json_int(j, "enc_layers", where);
  c.dec_layers = json_int(j, "dec_layers", where);
  c.d_model = json_int(j, "d_model", where);
  c.n_heads = json_int(j, "n_heads", where);
  c.n_kv_heads = json_int(j, "n_kv_heads", where);
  c.d_ff = json_int(j, "d_ff", where);
  c.max_seq = json_int(j, "max_seq", where);
  const std::string placement = json_string(j, "placement", where);
  TS_CHECK(placement == "pre" || placement == "post", where, ": placement must be pre or post, got '", placement, "'");
  c.placement = placement == "pre" ? NormPlacement::Pre : NormPlacement::Post;
  const std::string positions = json_string(j, "positions", where);
  TS_CHECK(positions == "learned" || positions == "sinusoidal", where,
           ": positions must be learned or sinusoidal, got '", positions, "'");
  c.positions = positions == "learned" ? PositionKind::Learned : PositionKind::Sinusoidal;
  try {
    c.act = activation_from_name(json_string(j, "act", where));
  } catch (const Error& e) {
    TS_THROW(where, ": ", e.what());
  }
  c.pos_offset = json_int(j, "pos_offset", where);
  c.scale_embedding = json_bool(j, "scale_embedding", where);
  c.layernorm_embedding = json_bool(j, "layernorm_embedding", where);
  c.shared_embeddings = json_bool(j, "shared_embeddings", where);
  c.tied_output = json_bool(j, "tied_output", where);
  c.dropout = static_cast<float>(json_number(j, "dropout", where));
  c.attn_dropout = static_cast<float>(json_number(j, "attn_dropout", where));
  c.act_dropout = static_cast<float>(json_number(j, "act_dropout", where));
  c.pad_id = json_int(j, "pad_id", where);
  c.bos_id = json_int(j, "bos_id", where);
  c.eos_id = json_int(j, "eos_id", where);
  c.decoder_start_id = json_int(j, "decoder_start_id", where);
  c.norm_eps = static_cast<float>(json_number(j, "norm_eps", where));
  if (j.contains("init_std")) c.init_std = static_cast<float>(json_number(j, "init_std", where));
  try {
    c.validate();
  } catch (const Error& e) {
    TS_THROW(where, ": ", e.what());
  }
  return c;
}

namespace {
json read_config_json(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  try {
    json j = json::parse(read_file_text(path, "checkpoint config"));
    TS_CHECK(j.is_object(), path, ": not a JSON object");
    return j;
  } catch (const json::exception& e) {
    TS_THROW(path, ": not JSON (", e.what(), ")");
  }
}

bool is_bart_json(const nlohmann::json& j) { return j.value("model_type", json()) == "bart"; }

// The preset a BART config.json cannot name: kept beside BartConfig's fields (transformers keeps unknown keys as
// attributes and ignores them).
constexpr const char* kPresetKey = "tessera_preset";

// tessera's own layout: one tensor per parameter segment, by the segment's name and shape.
void write_segment_model(const std::string& dir, const EncoderDecoder& m) {
  const ParamBuffer& pb = m.params();
  const std::vector<float> host = pb.read_f32(m.context());
  SafetensorsWriter w;
  for (size_t i = 0; i < pb.segments().size(); ++i)
    w.add(pb.segments()[i].name, DType::F32, pb.shape(i), host.data() + pb.segments()[i].offset);
  w.set_metadata("format", "pt");
  w.write((fs::path(dir) / "model.safetensors").string());
  write_file_atomic((fs::path(dir) / "config.json").string(), encdec_config_json(m.config()).dump(2) + "\n");
}

std::unique_ptr<EncoderDecoder> read_segment_model(const std::string& dir, const EncDecConfig& cfg, Context& ctx,
                                                   DType dtype) {
  const SafetensorsFile st = SafetensorsFile::load((fs::path(dir) / "model.safetensors").string());
  auto model = std::make_unique<EncoderDecoder>(cfg, ctx, dtype);
  const ParamBuffer& pb = model->params();
  std::vector<float> host(pb.size(), 0.0f);
  std::set<std::string> expected;
  for (size_t i = 0; i < pb.segments().size(); ++i) {
    const ParamSegment& seg = pb.segments()[i];
    TS_CHECK(st.has(seg.name), "checkpoint ", st.path(), ": missing tensor '", seg.name, "'");
    st.read_f32(seg.name, pb.shape(i), host.data() + seg.offset);
    expected.insert(seg.name);
  }
  for (const std::string& name : st.names())
    TS_CHECK(expected.count(name), "checkpoint ", st.path(), ": tensor '", name, "' is not one of the model's ",
             expected.size(), " (a file for another config?)");
  model->params().write_f32(host, ctx);
  return model;
}

}  // namespace

bool is_seq2seq_checkpoint(const std::string& path) {
  std::error_code ec;
  std::string dir = path;
  if (!fs::is_directory(dir, ec)) {
    dir = resolve_checkpoint_dir(path);
    if (!fs::is_directory(dir, ec)) return false;
  }
  const fs::path config = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(config, ec)) return false;
  try {
    const json j = json::parse(read_file_text(config.string(), "checkpoint config"));
    return j.is_object() && j.value("is_encoder_decoder", false) == true;
  } catch (const std::exception&) {
    return false;
  }
}

void save_seq2seq_checkpoint(const std::string& dir, const EncoderDecoder& m, const TrainState* state) {
  const bool bart = is_bart_compatible(m.config());
  write_checkpoint_dir(dir, [&](const std::string& tmp) {
    if (bart) {
      save_bart_pretrained(tmp, m);
      const std::string config = (fs::path(tmp) / "config.json").string();
      json j = read_config_json(tmp);
      j[kPresetKey] = m.config().preset;
      write_file_atomic(config, j.dump(2) + "\n");
    } else {
      write_segment_model(tmp, m);
    }
    if (state) write_train_state_files(tmp, *state, static_cast<int64_t>(m.params().size()));
  });
}

EncDecConfig load_seq2seq_config(const std::string& path) {
  const std::string dir = resolve_checkpoint_dir(path);
  const std::string where = (fs::path(dir) / "config.json").string();
  const json j = read_config_json(dir);
  if (is_bart_json(j)) {
    return encdec_config_from_bart_json(j, where);  // which reads kPresetKey too
  }
  TS_CHECK(j.value("model_type", json()) == "tessera" && j.value("is_encoder_decoder", false) == true, where,
           ": not an encoder-decoder's config (model_type bart, or tessera's with is_encoder_decoder)");
  return encdec_config_from_tessera_json(j, where);
}

std::unique_ptr<EncoderDecoder> load_seq2seq_checkpoint(const std::string& path, Context& ctx, DType dtype) {
  const std::string dir = resolve_checkpoint_dir(path);
  TS_CHECK(fs::is_directory(dir), path, " does not exist", unfinished_checkpoint_note(path));
  const EncDecConfig cfg = load_seq2seq_config(dir);
  if (is_bart_json(read_config_json(dir))) {
    auto m = load_bart_pretrained(dir, ctx, dtype);
    TS_CHECK(m->config().vocab == cfg.vocab, "internal: BART config read twice differently");
    return m;
  }
  return read_segment_model(dir, cfg, ctx, dtype);
}

TrainState load_seq2seq_train_state(const std::string& dir, const EncoderDecoder& m) {
  return read_train_state(dir, static_cast<int64_t>(m.params().size()));
}

}  // namespace tessera
