// tessera/models/bart_naming.h — Hugging Face BART's names for an EncoderDecoder's parameters, and its config.json.
//
// BartForConditionalGeneration is the encoder-decoder tessera computes with: post-norm blocks, learned positions
// from row 2 (embed_positions has max_position_embeddings + 2 rows), a layernorm_embedding on each side, one
// shared token table (model.shared) that is also the output projection, and heads = KV heads. Its tensors are
// ranges of tessera's segments: a block's fused qkv splits into q_proj, k_proj and v_proj; the batched cross K/V
// projection's rows [2l KV, (2l+1) KV) and [(2l+1) KV, (2l+2) KV) are layer l's encoder_attn.k_proj and v_proj.
// final_logits_bias (1, V) is a buffer of zeros in BART, not a parameter: a writer adds it, a reader checks it.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/models/encdec_config.h"
#include "tessera/models/hf_naming.h"
#include "tessera/nn/param_buffer.h"

namespace tessera {

// Whether `cfg` computes exactly what BartForConditionalGeneration computes; if not, why (one line).
bool is_bart_compatible(const EncDecConfig& cfg, std::string* why = nullptr);
// The BART tensors of an EncoderDecoder of `cfg` whose segments `params` holds; an Error when the config is not
// BART's.
std::vector<ExportTensor> bart_layout(const EncDecConfig& cfg, const ParamBuffer& params);
// BartConfig's config.json for `cfg` (GeluErf is transformers' "gelu", tessera's tanh Gelu its "gelu_new").
nlohmann::json bart_config_json(const EncDecConfig& cfg);
// The config a BartConfig's config.json describes; Error "<where>: <field> ..." for one tessera cannot follow
// exactly (another model_type, an activation other than relu, gelu or gelu_new, unequal encoder and decoder widths or
// heads, normalize_before, add_final_layer_norm).
EncDecConfig encdec_config_from_bart_json(const nlohmann::json& j, const std::string& where);

}  // namespace tessera
