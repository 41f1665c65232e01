// tessera/train/hf_import.h — reading a directory that Hugging Face `save_pretrained` wrote.
//
// Such a directory holds config.json (GPT2LMHeadModel or LlamaForCausalLM) and either model.safetensors or shards
// named by model.safetensors.index.json ({"weight_map": {tensor: shard file}}). The tensors take the names and
// layouts that models/hf_naming.h gives tessera's own exports, read in reverse: GPT-2's Conv1D weights (in, out)
// transposed back, Llama's q/k/v and gate/up packed into tessera's fused matrices by row. F32, F16 and BF16 tensors
// are converted to f32 as they are read.
//
// Accepted beside the model's own tensors, as transformers accepts them: GPT-2 names without the "transformer."
// prefix (the hub's gpt2), the causal-mask buffers attn.bias / attn.masked_bias of older GPT-2 files, Llama's
// rotary_emb.inv_freq buffers, and an lm_head.weight that tie_word_embeddings makes the embedding's (its shape is
// checked, its values ignored, as transformers ties it).
//
// Every check runs when the directory is opened, before a model is built or a weight read: the config's fields,
// every shard the index names, every tensor's name, shape and dtype, and the vocab. A refusal is one Error naming
// the field, the shard or the tensor; nothing is half-loaded.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/hf_naming.h"
#include "tessera/models/model.h"
#include "tessera/train/safetensors.h"

namespace tessera {

// Whether `dir` is a directory with config.json and model.safetensors.index.json (a sharded save_pretrained).
// An unsharded one is told from tessera's own checkpoints by its model file's metadata: see HfCheckpoint::open.
bool is_sharded_hf_checkpoint(const std::string& dir);

class HfCheckpoint {
 public:
  // Opens the Hugging Face directory `dir` and checks it whole. `model_file`, where given, is its
  // model.safetensors already mapped (the caller read it to learn it holds no tessera_config); otherwise the
  // directory's index or model.safetensors is read here.
  static HfCheckpoint open(const std::string& dir, std::optional<SafetensorsFile> model_file = std::nullopt);

  const ModelConfig& config() const { return hf_.cfg; }
  CheckpointNaming naming() const { return hf_.naming; }
  // Fills the parameters of a model built from config() (on any device, in any dtype).
  void load_into(Model& model) const;
  // Writes each tensor's values, as f32, at its place in `base`, a host array laid out as `params` (of a model
  // built from config()); what no tensor covers is left as it is.
  void fill_f32(const ParamBuffer& params, float* base) const;

 private:
  struct Source {
    int shard = 0;
    std::string name;  // as the shard spells it
  };
  const Source& source(const std::string& canonical) const { return sources_.at(canonical); }
  void check_tensors(const std::vector<ExportTensor>& layout, const ParamBuffer& params) const;

  std::string dir_;
  HfModelConfig hf_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, Source> sources_;  // by the name hf_naming gives it (GPT-2's with "transformer.")
};

}  // namespace tessera
