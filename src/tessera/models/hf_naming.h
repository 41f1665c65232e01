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

// The config.json beside the weights: Hugging Face's GPT-2 or Llama config, or tessera's own config.
nlohmann::json hf_config_json(const ModelConfig& cfg, CheckpointNaming naming);

}  // namespace tessera
