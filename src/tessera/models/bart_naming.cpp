#include "tessera/models/bart_naming.h"

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/json_fields.h"

namespace tessera {

using json = nlohmann::json;

bool is_bart_compatible(const EncDecConfig& c, std::string* why) {
  const char* reason = c.placement != NormPlacement::Post ? "BART's blocks are post-norm"
                       : c.positions != PositionKind::Learned || c.pos_offset != 2
                           ? "BART's positions are learned, from row 2"
                       : !c.layernorm_embedding                 ? "BART has a layernorm_embedding"
                       : !c.shared_embeddings || !c.tied_output ? "BART's embeddings are shared and tied"
                       : c.kv_heads() != c.n_heads              ? "BART has no grouped KV heads"
                       : c.norm_eps != 1e-5f                    ? "BART's LayerNorm eps is 1e-5"
                                                                : nullptr;
  if (why && reason) *why = reason;
  return reason == nullptr;
}

namespace {

// The BART tensors of one block segment: `side` "encoder" / "decoder", tessera's suffix ("qkv.w", "cross.q.b").
void add_block_tensor(std::vector<ExportTensor>& out, const EncDecConfig& c, int seg, const std::string& side,
                      const std::string& layer, const std::string& suffix, int64_t rows, int64_t cols) {
  const std::string p = "model." + side + ".layers." + layer + ".";
  const bool w = suffix.ends_with(".w");
  const std::string kind = w ? ".weight" : ".bias", stem = suffix.substr(0, suffix.size() - 2);
  auto one = [&](const std::string& name) { out.push_back({p + name + kind, seg, 0, rows, cols, false}); };
  const bool dec = side == "decoder";
  if (stem == "qkv") {
    const int64_t C = c.d_model;
    const char* const names[3] = {"q_proj", "k_proj", "v_proj"};
    for (int i = 0; i < 3; ++i) out.push_back({p + "self_attn." + names[i] + kind, seg, i * C, C, cols, false});
  } else if (stem == "proj") one("self_attn.out_proj");
  else if (stem == "ln1") one("self_attn_layer_norm");
  else if (stem == "cross.q") one("encoder_attn.q_proj");
  else if (stem == "cross.proj") one("encoder_attn.out_proj");
  else if (stem == "ln2") one(dec ? "encoder_attn_layer_norm" : "final_layer_norm");
  else if (stem == "ln3") one("final_layer_norm");
  else if (stem == "fc") one("fc1");
  else if (stem == "fcp") one("fc2");
  else TS_THROW("internal: no BART name for ", side, " ", suffix);
}

}  // namespace

std::vector<ExportTensor> bart_layout(const EncDecConfig& c, const ParamBuffer& params) {
  std::string why;
  TS_CHECK(is_bart_compatible(c, &why), "BART naming: this config is not BART's: ", why);
  const auto& segs = params.segments();
  const int64_t KV = int64_t{c.kv_heads()} * c.head_dim();
  std::vector<ExportTensor> out;
  for (size_t s = 0; s < segs.size(); ++s) {
    const auto& shape = params.shape(s);
    const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
    const std::string& n = segs[s].name;
    const int seg = static_cast<int>(s);
    auto whole = [&](const std::string& name) { out.push_back({name, seg, 0, rows, cols, false}); };
    if (n == "enc.wte") whole("model.shared.weight");
    else if (n == "enc.wpe") whole("model.encoder.embed_positions.weight");
    else if (n == "dec.wpe") whole("model.decoder.embed_positions.weight");
    else if (n == "enc.lne.w") whole("model.encoder.layernorm_embedding.weight");
    else if (n == "enc.lne.b") whole("model.encoder.layernorm_embedding.bias");
    else if (n == "dec.lne.w") whole("model.decoder.layernorm_embedding.weight");
    else if (n == "dec.lne.b") whole("model.decoder.layernorm_embedding.bias");
    else if (n == "dec.cross_kv.w" || n == "dec.cross_kv.b") {
      // Rows [k_0 | v_0 | k_1 | v_1 | ...]: layer l's K at 2l KV, its V at (2l + 1) KV.
      const std::string kind = n.ends_with(".w") ? ".weight" : ".bias";
      for (int l = 0; l < c.dec_layers; ++l) {
        const std::string p = "model.decoder.layers." + std::to_string(l) + ".encoder_attn.";
        out.push_back({p + "k_proj" + kind, seg, 2 * l * KV, KV, cols, false});
        out.push_back({p + "v_proj" + kind, seg, (2 * l + 1) * KV, KV, cols, false});
      }
    } else {
      // "enc.<layer>.<suffix>" or "dec.<layer>.<suffix>"
      const size_t dot = n.find('.', 4);
      TS_CHECK(dot != std::string::npos && (n.starts_with("enc.") || n.starts_with("dec.")),
               "internal: no BART name for ", n);
      add_block_tensor(out, c, seg, n.starts_with("enc.") ? "encoder" : "decoder", n.substr(4, dot - 4),
                       n.substr(dot + 1), rows, cols);
    }
  }
  return out;
}

json bart_config_json(const EncDecConfig& c) {
  std::string why;
  TS_CHECK(is_bart_compatible(c, &why), "BART config: this config is not BART's: ", why);
  return {{"architectures", {"BartForConditionalGeneration"}},
          {"model_type", "bart"},
          {"vocab_size", c.vocab},
          {"d_model", c.d_model},
          {"encoder_layers", c.enc_layers},
          {"decoder_layers", c.dec_layers},
          {"encoder_attention_heads", c.n_heads},
          {"decoder_attention_heads", c.n_heads},
          {"encoder_ffn_dim", c.d_ff},
          {"decoder_ffn_dim", c.d_ff},
          {"max_position_embeddings", c.max_seq},
          {"activation_function", c.act == Activation::Relu   ? "relu"
                                  : c.act == Activation::Gelu ? "gelu_new"
                                                              : "gelu"},
          {"dropout", c.dropout},
          {"attention_dropout", c.attn_dropout},
          {"activation_dropout", c.act_dropout},
          {"encoder_layerdrop", 0.0},
          {"decoder_layerdrop", 0.0},
          {"scale_embedding", c.scale_embedding},
          {"init_std", c.init_std},
          {"pad_token_id", c.pad_id},
          {"bos_token_id", c.bos_id},
          {"eos_token_id", c.eos_id},
          {"decoder_start_token_id", c.decoder_start_id},
          {"forced_eos_token_id", c.eos_id},
          {"is_encoder_decoder", true},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

EncDecConfig encdec_config_from_bart_json(const json& j, const std::string& where) {
  TS_CHECK(j.is_object(), where, ": not a JSON object");
  const std::string type = j.contains("model_type") ? json_string(j, "model_type", where) : "";
  TS_CHECK(type == "bart", where, ": model_type '", type, "' is not bart");
  EncDecConfig c = encdec_preset("bart-base");
  // A tessera checkpoint keeps its preset's name beside BartConfig's fields (transformers ignores the key).
  c.preset = j.contains("tessera_preset") ? json_string(j, "tessera_preset", where) : "custom";
  auto int_or = [&](const char* key, int fallback) {
    return j.contains(key) && !j[key].is_null() ? json_int(j, key, where) : fallback;
  };
  auto num_or = [&](const char* key, double fallback) {
    return j.contains(key) && !j[key].is_null() ? json_number(j, key, where) : fallback;
  };
  // BartConfig's defaults for the fields a config.json may leave out.
  c.vocab = int_or("vocab_size", 50265);
  c.d_model = int_or("d_model", 1024);
  c.enc_layers = int_or("encoder_layers", 12);
  c.dec_layers = int_or("decoder_layers", 12);
  c.n_heads = int_or("encoder_attention_heads", 16);
  TS_CHECK(int_or("decoder_attention_heads", 16) == c.n_heads, where,
           ": decoder_attention_heads differs from encoder_attention_heads");
  c.d_ff = int_or("encoder_ffn_dim", 4096);
  TS_CHECK(int_or("decoder_ffn_dim", 4096) == c.d_ff, where, ": decoder_ffn_dim differs from encoder_ffn_dim");
  c.max_seq = int_or("max_position_embeddings", 1024);
  const std::string act = j.contains("activation_function") ? json_string(j, "activation_function", where) : "gelu";
  TS_CHECK(act == "relu" || act == "gelu" || act == "gelu_new", where, ": activation_function '", act,
           "' is not one tessera computes (relu, gelu, gelu_new)");
  c.act = act == "relu" ? Activation::Relu : act == "gelu" ? Activation::GeluErf : Activation::Gelu;
  c.dropout = static_cast<float>(num_or("dropout", 0.1));
  c.attn_dropout = static_cast<float>(num_or("attention_dropout", 0.0));
  c.act_dropout = static_cast<float>(num_or("activation_dropout", 0.0));
  c.init_std = static_cast<float>(num_or("init_std", 0.02));
  c.scale_embedding = j.contains("scale_embedding") && json_bool(j, "scale_embedding", where);
  c.pad_id = int_or("pad_token_id", 1);
  c.bos_id = int_or("bos_token_id", 0);
  c.eos_id = int_or("eos_token_id", 2);
  c.decoder_start_id = int_or("decoder_start_token_id", 2);
  for (const char* key : {"normalize_before", "add_final_layer_norm"})
    TS_CHECK(!j.contains(key) || !json_bool(j, key, where), where, ": ", key, " true is not BART's post-norm form");
  TS_CHECK(!j.contains("tie_word_embeddings") || json_bool(j, "tie_word_embeddings", where), where,
           ": tie_word_embeddings false: tessera's BART ties its output projection to model.shared");
  try {
    c.validate();
  } catch (const Error& e) {
    TS_THROW(where, ": ", e.what());
  }
  return c;
}

}  // namespace tessera
