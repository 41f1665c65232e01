// tessera/train/bart_export.h — an EncoderDecoder of BART's form as a Hugging Face save_pretrained directory
// (config.json + model.safetensors, f32), which BartForConditionalGeneration.from_pretrained loads, and such a
// directory read back into an EncoderDecoder: one naming table (models/bart_naming.h), read both ways.
#pragma once
#include <memory>
#include <string>

#include "tessera/core/context.h"
#include "tessera/models/encoder_decoder.h"

namespace tessera {

// Writes dir/config.json and dir/model.safetensors (dir is created); an Error when the model's config is not BART's.
void save_bart_pretrained(const std::string& dir, const EncoderDecoder& model);

// The model a save_pretrained BART directory holds, on ctx's device in `dtype`. The shared table may be stored as
// model.shared.weight or under one of its tied names (model.encoder.embed_tokens.weight,
// model.decoder.embed_tokens.weight, lm_head.weight); final_logits_bias must be zero. Errors name the file and the
// first tensor or field that does not fit; nothing is returned then.
std::unique_ptr<EncoderDecoder> load_bart_pretrained(const std::string& dir, Context& ctx, DType dtype = DType::F32);

}  // namespace tessera
