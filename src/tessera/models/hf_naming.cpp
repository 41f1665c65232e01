#include "tessera/models/hf_naming.h"

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/json_fields.h"

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
  return checkpoint_layout(cfg, params, checkpoint_naming(cfg));
}

std::vector<ExportTensor> checkpoint_layout(const ModelConfig& cfg, const ParamBuffer& params,
                                            CheckpointNaming naming) {
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
    if (name == "wte")
      out.push_back({gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", seg, 0, rows, cols, false});
    else if (name == "wpe") out.push_back({"transformer.wpe.weight", seg, 0, rows, cols, false});
    else if (name == "lnf.w")
      out.push_back({gpt2 ? "transformer.ln_f.weight" : "model.norm.weight", seg, 0, rows, 1, false});
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
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab},
            {"n_positions", c.max_seq},
            {"n_ctx", c.max_seq},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_inner", c.d_ff},
            {"activation_function", "gelu_new"},
            {"resid_pdrop", c.dropout},
            {"embd_pdrop", c.dropout},
            {"attn_pdrop", c.attn_dropout},
            {"layer_norm_epsilon", c.norm_eps},
            {"initializer_range", 0.02},
            {"tie_word_embeddings", true},
            {"bos_token_id", c.vocab - 1},
            {"eos_token_id", c.vocab - 1},
            {"torch_dtype", "float32"}};
  }
  if (naming == CheckpointNaming::Llama) {
    return {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", c.vocab},
            {"hidden_size", c.d_model},
            {"intermediate_size", c.d_ff},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.kv_heads()},
            {"head_dim", c.head_dim()},
            {"max_position_embeddings", c.max_seq},
            {"rms_norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", c.tied},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"attention_dropout", c.attn_dropout},
            {"bos_token_id", 0},
            {"eos_token_id", c.vocab - 1},
            {"torch_dtype", "float32"}};
  }
  json j = model_config_to_json(c);
  j["model_type"] = "tessera";
  return j;
}

namespace {
// A config.json field, or `fallback` (transformers' default) where it is absent or null.
// The field, or `fallback` when it is absent or null. The result may be `fallback` itself: a caller that passes a
// temporary (a literal) must copy the result before the end of its full expression, when the temporary dies.
const json& field_or(const json& j, const char* key, const json& fallback) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : *it;
}
int hf_int(const json& j, const char* key, int fallback, const std::string& where) {
  const json v = {{key, field_or(j, key, fallback)}};
  return json_int(v, key, where);
}
float hf_float(const json& j, const char* key, double fallback, const std::string& where) {
  const json v = {{key, field_or(j, key, fallback)}};
  return static_cast<float>(json_number(v, key, where));
}
bool hf_bool(const json& j, const char* key, bool fallback, const std::string& where) {
  const json v = {{key, field_or(j, key, fallback)}};
  return json_bool(v, key, where);
}
std::string hf_string(const json& j, const char* key, const char* fallback, const std::string& where) {
  const json v = {{key, field_or(j, key, fallback)}};
  return json_string(v, key, where);
}

// GPT2Config's fields. Dropout: tessera has one rate for the embeddings and the residual stream, resid_pdrop's.
ModelConfig gpt2_config_from_hf(const json& j, const std::string& where) {
  ModelConfig c;
  c.preset = "custom";
  c.norm = NormKind::LayerNorm;
  c.mlp = Activation::Gelu;
  c.positions = PositionKind::Learned;
  c.bias = true;
  c.vocab = hf_int(j, "vocab_size", 50257, where);
  c.max_seq = hf_int(j, "n_positions", 1024, where);
  c.d_model = hf_int(j, "n_embd", 768, where);
  c.n_layers = hf_int(j, "n_layer", 12, where);
  c.n_heads = hf_int(j, "n_head", 12, where);
  c.d_ff = hf_int(j, "n_inner", 4 * c.d_model, where);
  c.norm_eps = hf_float(j, "layer_norm_epsilon", 1e-5, where);
  c.dropout = hf_float(j, "resid_pdrop", 0.1, where);
  c.attn_dropout = hf_float(j, "attn_pdrop", 0.1, where);
  c.tied = hf_bool(j, "tie_word_embeddings", true, where);
  // tessera's GELU is the tanh approximation (gelu_new; gelu_pytorch_tanh is the same formula).
  const std::string act = hf_string(j, "activation_function", "gelu_new", where);
  TS_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", where, ": activation_function '", act,
           "' is not supported (tessera's GPT-2 runs the tanh GELU: gelu_new)");
  TS_CHECK(hf_bool(j, "scale_attn_weights", true, where), where,
           ": scale_attn_weights false is not supported "
           "(tessera scales attention scores by 1/sqrt(head_dim))");
  TS_CHECK(!hf_bool(j, "scale_attn_by_inverse_layer_idx", false, where), where,
           ": scale_attn_by_inverse_layer_idx true is not supported");
  TS_CHECK(!hf_bool(j, "add_cross_attention", false, where), where,
           ": add_cross_attention true is not supported "
           "(a decoder-only model has no cross-attention)");
  return c;
}

// LlamaConfig's fields. tessera's RoPE rotates the two halves of each head (transformers' rotate_half), so q_proj
// and k_proj load without a permutation.
ModelConfig llama_config_from_hf(const json& j, const std::string& where) {
  ModelConfig c = llama_style(ModelConfig{});
  c.preset = "custom";
  c.vocab = hf_int(j, "vocab_size", 32000, where);
  c.d_model = hf_int(j, "hidden_size", 4096, where);
  c.d_ff = hf_int(j, "intermediate_size", 11008, where);
  c.n_layers = hf_int(j, "num_hidden_layers", 32, where);
  c.n_heads = hf_int(j, "num_attention_heads", 32, where);
  c.n_kv_heads = hf_int(j, "num_key_value_heads", c.n_heads, where);
  c.max_seq = hf_int(j, "max_position_embeddings", 2048, where);
  c.norm_eps = hf_float(j, "rms_norm_eps", 1e-6, where);
  c.rope_theta = hf_float(j, "rope_theta", 10000.0, where);
  c.tied = hf_bool(j, "tie_word_embeddings", false, where);
  c.attn_dropout = hf_float(j, "attention_dropout", 0.0, where);
  c.dropout = 0;
  const json scaling = field_or(j, "rope_scaling", nullptr);
  TS_CHECK(scaling.is_null(), where, ": rope_scaling ", json_shown(scaling),
           " is not supported (tessera's RoPE is "
           "unscaled: rope_scaling must be null)");
  const std::string act = hf_string(j, "hidden_act", "silu", where);
  TS_CHECK(act == "silu", where, ": hidden_act '", act, "' is not supported (tessera's Llama MLP is SwiGLU: silu)");
  TS_CHECK(!hf_bool(j, "attention_bias", false, where), where,
           ": attention_bias true is not supported (tessera's "
           "Llama layout has no biases)");
  TS_CHECK(!hf_bool(j, "mlp_bias", false, where), where,
           ": mlp_bias true is not supported (tessera's Llama layout "
           "has no biases)");
  TS_CHECK(c.n_heads > 0 && c.d_model % c.n_heads == 0, where, ": hidden_size ", c.d_model,
           " is not a multiple of num_attention_heads ", c.n_heads);
  const int head_dim = hf_int(j, "head_dim", c.d_model / c.n_heads, where);
  TS_CHECK(head_dim == c.d_model / c.n_heads, where, ": head_dim ", head_dim,
           " is not supported (tessera's head "
           "dim is hidden_size / num_attention_heads = ",
           c.d_model / c.n_heads, ")");
  return c;
}
}  // namespace

HfModelConfig model_config_from_hf_json(const json& j, const std::string& where) {
  TS_CHECK(j.is_object(), where, ": expected a JSON object, got ", json_kind(j));
  TS_CHECK(j.contains("model_type"), where, ": missing field 'model_type' (expected \"gpt2\" or \"llama\")");
  const std::string type = json_string(j, "model_type", where);
  TS_CHECK(type == "gpt2" || type == "llama", where, ": model_type '", type,
           "' is not supported (tessera loads "
           "GPT2LMHeadModel, model_type \"gpt2\", and LlamaForCausalLM, \"llama\")");
  // Sliding-window attention (Mistral's, Qwen2's) attends to a band, not the whole causal prefix.
  const json window = field_or(j, "sliding_window", nullptr);
  TS_CHECK(window.is_null() || (window.is_boolean() && !window.get<bool>()), where, ": sliding_window ",
           json_shown(window), " is not supported (tessera attends to the whole causal prefix)");
  TS_CHECK(!hf_bool(j, "use_sliding_window", false, where), where,
           ": use_sliding_window true is not supported "
           "(tessera attends to the whole causal prefix)");
  HfModelConfig out;
  out.naming = type == "gpt2" ? CheckpointNaming::Gpt2 : CheckpointNaming::Llama;
  out.cfg = type == "gpt2" ? gpt2_config_from_hf(j, where) : llama_config_from_hf(j, where);
  try {
    out.cfg.validate();
  } catch (const Error& e) {
    TS_THROW(where, ": ", e.what());
  }
  return out;
}

}  // namespace tessera
