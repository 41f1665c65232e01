// tessera/train/seq2seq_checkpoint.h — an EncoderDecoder's checkpoints: the directory layout of GPT's
// (train/checkpoint.h), written with the same atomic directory swap.
//
// A checkpoint is a directory:
//   model.safetensors   the parameters, f32. Where the config is BART's (models/bart_naming.h: is_bart_compatible)
//                       the tensors carry BartForConditionalGeneration's names (train/bart_export.h writes them) and
//                       config.json is a BartConfig, so `transformers` loads the directory as it is; otherwise the
//                       tensors are tessera's segments by name and config.json is tessera's encoder-decoder config
//                       (model_type "tessera", "is_encoder_decoder": true).
//   config.json         as above; either way it carries "is_encoder_decoder": true, which is_seq2seq_checkpoint reads.
//   tokenizer.json      where the run's data named a tokenizer (TrainState::tokenizer_json).
//   optimizer.safetensors  (training checkpoints) the TrainState, exactly as GPT's checkpoints store it.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tessera/core/context.h"
#include "tessera/models/encoder_decoder.h"
#include "tessera/train/checkpoint.h"

namespace tessera {

// tessera's own config.json of an encoder-decoder (model_type "tessera", "is_encoder_decoder": true, every field
// of EncDecConfig), and the config it describes (Errors "<where>: <field> ...").
nlohmann::json encdec_config_json(const EncDecConfig& c);
EncDecConfig encdec_config_from_tessera_json(const nlohmann::json& j, const std::string& where);

// Whether `dir` (a checkpoint directory, or <dir>.old after an interrupted swap) holds an encoder-decoder: its
// config.json says "is_encoder_decoder": true. False for GPT's checkpoints, a missing directory or unreadable JSON.
bool is_seq2seq_checkpoint(const std::string& dir);

// Writes the checkpoint directory atomically (checkpoint.h's swap); optimizer.safetensors when state is given, and
// tokenizer.json where the state holds one.
void save_seq2seq_checkpoint(const std::string& dir, const EncoderDecoder& m, const TrainState* state);

// The checkpoint's model on ctx's device in `dtype`. Errors name the file and the first thing that does not fit.
std::unique_ptr<EncoderDecoder> load_seq2seq_checkpoint(const std::string& dir, Context& ctx, DType dtype = DType::F32);

// The config a checkpoint's config.json describes, without reading the weights.
EncDecConfig load_seq2seq_config(const std::string& dir);

// The training state of a checkpoint whose model is `m` (the optimizer moments must have its parameter count).
TrainState load_seq2seq_train_state(const std::string& dir, const EncoderDecoder& m);

}  // namespace tessera
