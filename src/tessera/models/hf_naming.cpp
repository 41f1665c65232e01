#include "tessera/models/hf_naming.h"

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"

namespace tessera {

using json = nlohmann::json;

CheckpointNaming checkpoint_naming(const ModelConfig& cfg) {
  if (cfg.is_gpt2_compatible()) return CheckpointNaming::Gpt2;
  if (cfg.is_llama_compatible()) return CheckpointNaming::Llama;
  return CheckpointNaming::Tessera;
}

const char* checkpoint_naming_name(CheckpointNaming n) {
  switch (n) {
    case CheckpointNaming::Gpt2: return "gpt2";
    case CheckpointNaming::Llama: return "llama";
    case CheckpointNaming::Tessera: return "tessera";
  }
  return "?";
}

namespace {
// Maps tessera's per-layer suffix to the Hugging Face name(s).
void add_layer_tensor(std::vector<ExportTensor>& out, CheckpointNaming naming, const ModelConfig& cfg, int seg,
                      const std::string& layer, const std::string& suffix, int64_t rows, int64_t cols) {
  const bool vec = cols == 1;
  auto one = [&](const std::string& name, bool transpose) {
    out.push_back({name, seg, 0, rows, cols, transpose && !vec});
  };
  if (naming == CheckpointNaming::Gpt2) {
    const std::string p = "transformer.h." + layer + ".";
    if (suffix == "ln1.w") one(p + "ln_1.weight", false);
    else if (suffix == "ln1.b") one(p + "ln_1.bias", false);
    else if (suffix == "ln2.w") one(p + "ln_2.weight", false);
    else if (suffix == "ln2.b") one(p + "ln_2.bias", false);
    else if (suffix == "qkv.w") one(p + "attn.c_attn.weight", true);
    else if (suffix == "qkv.b") one(p + "attn.c_attn.bias", false);
    else if (suffix == "proj.w") one(p + "attn.c_proj.weight", true);
    else if (suffix == "proj.b") one(p + "attn.c_proj.bias", false);
    else if (suffix == "fc.w") one(p + "mlp.c_fc.weight", true);
    else if (suffix == "fc.b") one(p + "mlp.c_fc.bias", false);
    else if (suffix == "fcp.w") one(p + "mlp.c_proj.weight", true);
    else if (suffix == "fcp.b") one(p + "mlp.c_proj.bias", false);
    else TS_THROW("internal: no GPT-2 name for ", suffix);
    return;
  }
  const std::string p = "model.layers." + layer + ".";
  const int64_t C = cfg.d_model, F = cfg.d_ff, KV = int64_t{cfg.kv_heads()} * cfg.head_dim();
  if (suffix == "ln1.w") one(p + "input_layernorm.weight", false);
  else if (suffix == "ln2.w") one(p + "post_attention_layernorm.weight", false);
  else if (suffix == "qkv.w") {
    out.push_back({p + "self_attn.q_proj.weight", seg, 0, C, cols, false});
    // The packed rows [q | k | v]: H Dh = C query rows, then Hkv Dh rows each of k and v (grouped-query).
    out.push_back({p + "self_attn.k_proj.weight", seg, C, KV, cols, false});
    out.push_back({p + "self_attn.v_proj.weight", seg, C + KV, KV, cols, false});
  } else if (suffix == "proj.w") one(p + "self_attn.o_proj.weight", false);
  else if (suffix == "fc.w") {
    out.push_back({p + "mlp.gate_proj.weight", seg, 0, F, cols, false});
    out.push_back({p + "mlp.up_proj.weight", seg, F, F, cols, false});
  } else if (suffix == "fcp.w") one(p + "mlp.down_proj.weight", false);
  else TS_THROW("internal: no Llama name for ", suffix);
}
}  // namespace

std::vector<ExportTensor> checkpoint_layout(const ModelConfig& cfg, const ParamBuffer& params) {
  const CheckpointNaming naming = checkpoint_naming(cfg);
  const auto& segs = params.segments();
  std::vector<ExportTensor> out;
  for (size_t s = 0; s < segs.size(); ++s) {
    const auto& shape = params.shape(s);
    const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
    const std::string& name = segs[s].name;
    const int seg = static_cast<int>(s);
    if (naming == CheckpointNaming::Tessera) {
      out.push_back({name, seg, 0, rows, cols, false});
      continue;
    }
    const bool gpt2 = naming == CheckpointNaming::Gpt2;
    if (name == "wte") out.push_back({gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", seg, 0, rows, cols, false});
    else if (name == "wpe") out.push_back({"transformer.wpe.weight", seg, 0, rows, cols, false});
    else if (name == "lnf.w") out.push_back({gpt2 ? "transformer.ln_f.weight" : "model.norm.weight", seg, 0, rows, 1, false});
    else if (name == "lnf.b") out.push_back({"transformer.ln_f.bias", seg, 0, rows, 1, false});
    else if (name == "lm_head") out.push_back({"lm_head.weight", seg, 0, rows, cols, false});
    else {
      // "h.<layer>.<suffix>"
      const size_t dot = name.find('.', 2);
      add_layer_tensor(out, naming, cfg, seg, name.substr(2, dot - 2), name.substr(dot + 1), rows, cols);
    }
  }
  return out;
}

json hf_config_json(const ModelConfig& c, CheckpointNaming naming) {
  if (naming == CheckpointNaming::Gpt2) {
    return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab},
            {"n_positions", c.max_seq}, {"n_ctx", c.max_seq}, {"n_embd", c.d_model}, {"n_layer", c.n_layers},
            {"n_head", c.n_heads}, {"n_inner", c.d_ff}, {"activation_function", "gelu_new"},
            {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout}, {"attn_pdrop", c.attn_dropout},
            {"layer_norm_epsilon", c.norm_eps}, {"initializer_range", 0.02}, {"tie_word_embeddings", true},
            {"bos_token_id", c.vocab - 1}, {"eos_token_id", c.vocab - 1}, {"torch_dtype", "float32"}};
  }
  if (naming == CheckpointNaming::Llama) {
    return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", c.vocab},
            {"hidden_size", c.d_model}, {"intermediate_size", c.d_ff}, {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads}, {"num_key_value_heads", c.kv_heads()}, {"head_dim", c.head_dim()},
            {"max_position_embeddings", c.max_seq}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
            {"hidden_act", "silu"}, {"tie_word_embeddings", c.tied}, {"attention_bias", false},
            {"mlp_bias", false}, {"attention_dropout", c.attn_dropout}, {"bos_token_id", 0},
            {"eos_token_id", c.vocab - 1}, {"torch_dtype", "float32"}};
  }
  json j = model_config_to_json(c);
  j["model_type"] = "tessera";
  return j;
}

}  // namespace tessera
