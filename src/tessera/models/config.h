// tessera/models/config.h — ModelConfig, the one description of a decoder-only transformer, and presets.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/nn/kinds.h"
#include "tessera/ops/activation/activation.h"

namespace tessera {

// Bounds ModelConfig::validate() enforces: far past any real model, so that size products fit their types.
constexpr int kMaxLayers = 512, kMaxWidth = 1 << 18, kMaxVocab = 1 << 24, kMaxSeq = 1 << 20;

struct ModelConfig {
  std::string preset = "custom";
  int vocab = 256;
  int d_model = 128;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 0;  // key/value heads (grouped-query attention), dividing n_heads; 0: n_heads
  int d_ff = 512;
  int max_seq = 128;
  NormKind norm = NormKind::LayerNorm;
  Activation mlp = Activation::Gelu;
  PositionKind positions = PositionKind::Learned;
  bool bias = true;
  bool tied = true;
  float dropout = 0.0f;       // embedding and residual dropout (HF embd_pdrop, resid_pdrop)
  float attn_dropout = 0.0f;  // on the attention probabilities (HF attn_pdrop)
  float emb_scale = 1.0f;
  int padding_id = -1;  // -1: none
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;

  int head_dim() const { return d_model / n_heads; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Width of the packed qkv projection's output: (H + 2 Hkv) Dh, 3 d_model without grouping.
  int qkv_width() const { return (n_heads + 2 * kv_heads()) * head_dim(); }
  // Width of the first MLP matrix's output: d_ff, or 2 d_ff for SwiGLU ([gate | up]).
  int d_ff_in() const { return mlp == Activation::Swiglu ? 2 * d_ff : d_ff; }
  // Throws Error with a one-line reason for an impossible config.
  void validate() const;
  int64_t num_params() const;
  // Matches Hugging Face GPT2LMHeadModel / LlamaForCausalLM exactly, so checkpoints use their names.
  bool is_gpt2_compatible() const;
  bool is_llama_compatible() const;
};

// Switches a config to the Llama family: RMSNorm, SwiGLU, RoPE, no biases, untied embeddings.
ModelConfig llama_style(ModelConfig c);

ModelConfig model_preset(std::string_view name);
std::vector<std::string> model_preset_names();
// Sets one field from its command-line text, e.g. ("d_model", "256"), ("norm", "rmsnorm"), ("tied", "false").
void model_config_set(ModelConfig& cfg, std::string_view field, std::string_view value);
std::vector<std::string> model_config_fields();

std::string norm_kind_name(NormKind k);
std::string position_kind_name(PositionKind k);

nlohmann::json model_config_to_json(const ModelConfig& cfg);
// The config saved by model_config_to_json, validated; throws Error "<where>: missing field 'vocab'" (or a field of
// the wrong type, or an invalid config). `where` names the place it was read from: the model file's tessera_config
// ("config") or the training options' copy ("training options: model").
ModelConfig model_config_from_json(const nlohmann::json& j, std::string_view where = "config");

}  // namespace tessera
