// tessera/models/hf_naming.h — the Hugging Face names of a model's parameters, and its config.json.
//
// Where the config matches GPT2LMHeadModel or LlamaForCausalLM the tensors take Hugging Face's names and layouts:
// GPT-2's Conv1D weights transposed to (in, out), Llama's q/k/v and gate/up split out of tessera's fused matrices.
// Other configs keep tessera's own segment names. Checkpoints (train/checkpoint.h) write and read by this table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/models/config.h"
#include "tessera/nn/param_buffer.h"

namespace tessera {

enum class CheckpointNaming { Gpt2, Llama, Tessera };

CheckpointNaming checkpoint_naming(const ModelConfig& cfg);
// "gpt2", "llama", "tessera": the model file's tessera_naming metadata.
const char* checkpoint_naming_name(CheckpointNaming n);

// One exported tensor: rows [row_begin, row_begin + rows) of a model segment viewed as (segment rows, cols),
// optionally transposed.
struct ExportTensor {
  std::string name;
  int segment = 0;
  int64_t row_begin = 0, rows = 0, cols = 0;
  bool transpose = false;
};
// The exported tensors of a model of `cfg` whose segments `params` holds (a model's, or one that
// model_describe_params filled, with nothing allocated).
std::vector<ExportTensor> checkpoint_layout(const ModelConfig& cfg, const ParamBuffer& params);

// checkpoint_layout under the naming given rather than the one the config implies: a Hugging Face GPT-2 with an
// untied lm_head builds a config that is not is_gpt2_compatible, and its tensors keep GPT-2's names.
std::vector<ExportTensor> checkpoint_layout(const ModelConfig& cfg, const ParamBuffer& params, CheckpointNaming naming);

// The config.json beside the weights: Hugging Face's GPT-2 or Llama config, or tessera's own config.
nlohmann::json hf_config_json(const ModelConfig& cfg, CheckpointNaming naming);

// A Hugging Face config.json read back (the reverse of hf_config_json): the tessera config that computes what
// GPT2LMHeadModel or LlamaForCausalLM computes, and the naming of its tensors.
struct HfModelConfig {
  ModelConfig cfg;
  CheckpointNaming naming = CheckpointNaming::Gpt2;
};
// Fields that are absent or null take transformers' defaults (GPT2Config, LlamaConfig). Throws Error
// "<where>: <field> ..." naming the first field tessera cannot follow exactly: another model_type, rope_scaling,
// attention_bias or mlp_bias true, a sliding window, an activation other than GPT-2's tanh GELU or Llama's SiLU, a
// head_dim other than hidden_size / num_attention_heads, or a config that ModelConfig::validate() refuses.
HfModelConfig model_config_from_hf_json(const nlohmann::json& j, const std::string& where);

}  // namespace tessera
