// tessera generate: continues one prompt, or a file of them in batches, with the inference engine and the batched
// sampler (infer/generator.h). A single sequence streams its text as drawn; a batch prints each sequence when its
// batch is done, as plain text or as one JSON record per sequence.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/units.h"
#include "tessera/infer/beam_generate.h"
#include "tessera/infer/engine.h"
#include "tessera/infer/generator.h"
#include "tessera/models/model.h"
#include "tessera/tokenizer/text_codec.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/seq2seq_checkpoint.h"

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

constexpr int kDefaultBatchCap = 64;
constexpr const char* kSeparator = "---";

void add_generate_flags(Flags& a) {
  a.add("checkpoint", "DIR", "checkpoint directory (default runs/tiny/checkpoint)");
  a.add("prompt", "TEXT", "text to continue (default \"The \")");
  a.add("prompt-file", "FILE",
        "prompts to continue: one a line (blank lines skipped), or JSONL with a \"prompt\" "
        "field (a .jsonl name, or a file whose first non-space character is '{')");
  a.add("batch", "N", "prompts per engine batch (default all of --prompt-file, up to 64)");
  a.add("max-new-tokens", "N", "at most N new tokens a sequence, fewer where its context fills first (default 200)");
  a.add("tokens", "N", "the same as --max-new-tokens");
  a.add("min-new-tokens", "N", "EOS cannot end a sequence before N new tokens (default 0)");
  a.add("device", "cpu|cuda|auto", "where the model runs: auto takes the GPU when there is one (default auto)");
  a.add("precision", "f32|bf16|f16",
        "the compute dtype: bf16 or f16 on the GPU; the CPU computes in f32 (default "
        "bf16 on the GPU, f32 on the CPU)");
  a.add("temperature", "X", "softmax temperature, >= 0; 0 = greedy (default 0.8)");
  a.add("top-k", "N", "sample from the k most likely tokens, 0 = all (default 40)");
  a.add("top-p", "X", "sample from the smallest set with this much mass, in (0, 1] (default 1.0)");
  a.add("min-p", "X", "drop tokens less likely than X times the most likely, in [0, 1] (default 0: off)");
  a.add("repetition-penalty", "X",
        "divide a seen token's positive logit by X, multiply a negative one (default 1: "
        "off)");
  a.add("presence-penalty", "X", "subtract X from the logit of every token seen (default 0)");
  a.add("frequency-penalty", "X", "subtract X times its count from a seen token's logit (default 0)");
  a.add_repeated("logit-bias", "ID:BIAS[,...]", "add BIAS to token ID's logit; -inf bans it (repeatable)");
  a.add("seed", "N",
        "sampling seed; with --batch B, sequence j draws from Philox stream j mod B with seed N + "
        "j / B (default 0)");
  a.add_switch("greedy", "always take the most likely token (after the penalties and bias)");
  a.add_repeated("stop", "TEXT", "end a sequence where its text holds TEXT, cut before it (repeatable)");
  a.add_repeated("eos-id", "ID[,...]",
                 "token ids that end a sequence (repeatable; default: a Hugging Face checkpoint's "
                 "eos_token_id, as its generate() takes it; none for tessera's own checkpoints)");
  a.add_switch("ignore-eos", "EOS ids are ordinary tokens");
  a.add_switch("json",
               "one JSON record a line per sequence: {\"index\", \"prompt\", \"tokens\" (the new ids), "
               "\"text\", \"finish_reason\" (eos|stop|length), with --logprobs \"logprobs\": per new token "
               "{\"token\", \"logprob\" (null when outside the top N), \"top\": [[id, logprob], ...]}}");
  a.add("logprobs", "N", "with --json, the N most likely tokens of each step and their logprobs, N <= 20");
  a.add_switch("truncate-prompt", "keep the last tokens of a prompt longer than the context (else an error)");
  a.add("beams", "K",
        "beam search with K beams, Hugging Face's generate(num_beams=K); 1 = sampling or greedy "
        "(default 1)");
  a.add("length-penalty", "X", "beam search: a hypothesis scores its log-probability / length^X (default 1.0)");
  a.add("early-stopping", "true|false|never",
        "beam search: when a prompt is done, as Hugging Face's early_stopping "
        "(default false)");
  a.add("num-return-sequences", "N",
        "beam search: the N best hypotheses of each prompt, best first, N <= --beams "
        "(default 1); --json adds \"beam\" and \"score\"");
}

// "12", strictly: the whole of `s` an int.
bool parse_int(const std::string& s, long lo, long hi, int* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

// Items of a comma list, each non-empty.
std::vector<std::string> split_commas(const std::string& s, const char* flag) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    TS_CHECK(!out.back().empty(), "--", flag, " '", s, "': an empty item in the list");
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

std::vector<std::pair<int32_t, float>> read_logit_bias(const Flags& a) {
  std::vector<std::pair<int32_t, float>> bias;
  for (const std::string& v : a.all("logit-bias"))
    for (const std::string& e : split_commas(v, "logit-bias")) {
      const size_t colon = e.find(':');
      int id = 0;
      TS_CHECK(colon != std::string::npos && parse_int(e.substr(0, colon), 0, 1L << 30, &id), "--logit-bias '", e,
               "': expected ID:BIAS, a token id and a number");
      const std::string num = e.substr(colon + 1);
      char* end = nullptr;
      const float b = num.empty() ? NAN : std::strtof(num.c_str(), &end);
      TS_CHECK(!num.empty() && *end == '\0' && !std::isnan(b), "--logit-bias '", e, "': the bias '", num,
               "' is not a number");
      bias.emplace_back(id, b);
    }
  return bias;
}

// The sampling and stopping flags. The checks that need the model's vocab come later (generate_options_check).
GenerateOptions read_generate_options(const Flags& a) {
  GenerateOptions o;
  SampleParams& p = o.sampling;
  p.temperature = a.number_f32("temperature", 0.8f);
  p.top_k = a.integer("top-k", 40);
  p.top_p = a.number_f32("top-p", 1.0f);
  p.min_p = a.number_f32("min-p", 0.0f);
  p.repetition_penalty = a.number_f32("repetition-penalty", 1.0f);
  p.presence_penalty = a.number_f32("presence-penalty", 0.0f);
  p.frequency_penalty = a.number_f32("frequency-penalty", 0.0f);
  p.seed = a.u64("seed", 0);
  p.logprobs = a.integer("logprobs", 0);
  TS_CHECK(p.temperature >= 0, "--temperature must be >= 0 (0 or --greedy: greedy), got ", a.str("temperature"));
  TS_CHECK(p.top_k >= 0, "--top-k must be >= 0 (0 = all tokens), got ", p.top_k);
  TS_CHECK(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got ", a.str("top-p"));
  TS_CHECK(!a.has("greedy") || !a.has("temperature") || p.temperature == 0,
           "--greedy takes the most likely token, "
           "and --temperature ",
           a.str("temperature"), " samples: give one of them");
  if (a.has("greedy")) p.temperature = 0;
  // Greedy decoding (--greedy, or --temperature 0) takes the argmax: a top-k, top-p or min-p cut would be ignored.
  // --top-k 0 (all tokens), --top-p 1 (all the mass) and --min-p 0 cut nothing, so they go with it.
  const std::pair<const char*, bool> cuts[] = {{"top-k", p.top_k != 0},
                                               {"top-p", p.top_p != 1},
                                               {"min-p", p.min_p != 0}};
  for (const auto& [f, cut] : cuts)
    TS_CHECK(p.temperature != 0 || !a.has(f) || !cut, a.has("greedy") ? "--greedy" : "--temperature 0",
             " takes the most likely token, and --", f, " ", a.str(f), " limits what is sampled: give one of them");
  if (p.temperature == 0) p.top_k = 0;  // the default top-k 40 of sampling cuts nothing from an argmax
  // Greedy decoding draws no random number: a seed would be ignored.
  TS_CHECK(p.temperature != 0 || !a.has("seed"), a.has("greedy") ? "--greedy" : "--temperature 0",
           " takes the most likely token, and --seed ", a.str("seed"), " seeds sampling: give one of them");
  TS_CHECK(!a.has("tokens") || !a.has("max-new-tokens"),
           "--tokens is another name for --max-new-tokens: give one of "
           "them");
  const char* count_flag = a.has("tokens") ? "tokens" : "max-new-tokens";
  o.max_new_tokens = a.integer(count_flag, 200);
  TS_CHECK(o.max_new_tokens >= 0, "--", count_flag, " must be >= 0, got ", o.max_new_tokens);
  o.min_new_tokens = a.integer("min-new-tokens", 0);
  TS_CHECK(o.min_new_tokens >= 0, "--min-new-tokens must be >= 0, got ", o.min_new_tokens);
  TS_CHECK(o.min_new_tokens <= o.max_new_tokens, "--min-new-tokens ", o.min_new_tokens, " is more than --", count_flag,
           " ", o.max_new_tokens);
  TS_CHECK(p.logprobs >= 0 && p.logprobs <= SampleParams::kMaxLogprobs, "--logprobs must be in [0, ",
           SampleParams::kMaxLogprobs, "], got ", p.logprobs);
  TS_CHECK(!a.has("logprobs") || a.has("json"), "--logprobs ", a.str("logprobs"),
           " is printed in the --json records: "
           "give --json");
  o.logit_bias = read_logit_bias(a);
  for (const std::string& v : a.all("eos-id"))
    for (const std::string& e : split_commas(v, "eos-id")) {
      int id = 0;
      TS_CHECK(parse_int(e, 0, 1L << 30, &id), "--eos-id '", e, "' is not a token id (an integer >= 0)");
      o.eos_ids.push_back(id);
    }
  o.ignore_eos = a.has("ignore-eos");
  o.stop = a.all("stop");
  for (const std::string& s : o.stop) TS_CHECK(!s.empty(), "--stop: a stop string must not be empty");
  // The sampler's own ranges (min-p, penalties) before the checkpoint is read; the vocab comes with the model.
  SampleParams probe = p;
  probe.V = 1;
  sample_params_check(probe);
  return o;
}

// The prompt texts: --prompt, or --prompt-file's lines or JSONL records.
std::vector<std::string> read_prompts(const Flags& a) {
  TS_CHECK(!a.has("prompt") || !a.has("prompt-file"), "--prompt and --prompt-file: give one of them");
  if (!a.has("prompt-file")) return {a.str("prompt", "The ")};
  const std::string path = a.str("prompt-file");
  TS_CHECK(!path.empty(), "--prompt-file is empty");
  TS_CHECK(fs::is_regular_file(path), "--prompt-file ", path, " does not exist or is not a file");
  const std::string text = read_file_text(path, "--prompt-file");
  const size_t first = text.find_first_not_of(" \t\r\n");
  const bool jsonl = fs::path(path).extension() == ".jsonl" || (first != std::string::npos && text[first] == '{');
  std::vector<std::string> prompts;
  size_t at = 0;
  for (int line = 1; at < text.size(); ++line) {
    const size_t nl = text.find('\n', at);
    std::string l = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? text.size() : nl + 1;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l.find_first_not_of(" \t") == std::string::npos) continue;
    if (!jsonl) {
      prompts.push_back(l);
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
    TS_CHECK(!j.is_discarded() && j.is_object(), "--prompt-file ", path, ": line ", line, " is not a JSON object");
    TS_CHECK(j.contains("prompt") && j["prompt"].is_string(), "--prompt-file ", path, ": line ", line,
             " has no \"prompt\" string");
    prompts.push_back(j["prompt"].get<std::string>());
    TS_CHECK(!prompts.back().empty(), "--prompt-file ", path, ": line ", line, " has an empty \"prompt\"");
  }
  TS_CHECK(!prompts.empty(), "--prompt-file ", path, " holds no prompt");
  return prompts;
}

// Writes all of `text` (any byte, NUL included) and flushes: a write that fails stops the generation there.
void put(const std::string& text) {
  const bool ok = std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0;
  const int e = errno;
  if (!ok) throw OutputLost(__FILE__, __LINE__, std::string("cannot write standard output: ") + std::strerror(e));
}

nlohmann::json json_record(int index, const std::string& prompt, const GeneratedSequence& s) {
  nlohmann::json j = {{"index", index},
                      {"prompt", prompt},
                      {"tokens", s.tokens},
                      {"text", s.text},
                      {"finish_reason", finish_reason_name(s.finish)}};
  if (!s.logprobs.empty()) {
    nlohmann::json steps = nlohmann::json::array();
    for (size_t i = 0; i < s.logprobs.size(); ++i) {
      const StepLogprobs& lp = s.logprobs[i];
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, v] : lp.top) top.push_back({id, v});
      steps.push_back({{"token", s.tokens[i]},
                       {"logprob", std::isnan(lp.chosen) ? nlohmann::json(nullptr) : nlohmann::json(lp.chosen)},
                       {"top", top}});
    }
    j["logprobs"] = steps;
  }
  return j;
}

// One record a line. Text that is no valid UTF-8 (byte-level ids) is written with U+FFFD in its place; "tokens"
// keeps the ids.
std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// The model that generate runs: the checkpoint's, on the CPU in f32 or copied to the GPU in `dtype`.
struct LoadedModel {
  std::unique_ptr<Context> ctx;  // the GPU's (null on the CPU); outlives the model
  std::unique_ptr<Model> model;
  std::unique_ptr<TextCodec> codec;  // the checkpoint's tokenizer.json, or bytes
  std::vector<int32_t> config_eos;   // a Hugging Face directory's default EOS ids (checkpoint_eos_ids)
};

LoadedModel load_generate_model(const Flags& a, bool gpu, DType dtype) {
  const std::string given = a.str("checkpoint", "runs/tiny/checkpoint");
  TS_CHECK(!given.empty(), "--checkpoint is empty");
  // A crash between the two renames of a checkpoint swap leaves it at <dir>.old: the loaders read that.
  const std::string ckpt = resolve_checkpoint_dir(given);
  if (!fs::exists(ckpt)) {
    // "Train one first" fits only the default path, runs/tiny's: elsewhere it would train another model.
    std::string why = dangling_link_note(given);
    if (why.empty()) why = unfinished_checkpoint_note(given);
    if (why.empty() && !a.has("checkpoint")) why = " (train one first: tessera train)";
    TS_THROW("checkpoint ", given, " does not exist", why);
  }
  TS_CHECK(!is_seq2seq_checkpoint(ckpt), "generate: ", given,
           " is an encoder-decoder checkpoint; translate with it: tessera translate --checkpoint ", given,
           " --input FILE");
  LoadedModel m;
  size_t non_finite = 0;
  if (gpu) {
    // Straight into the GPU model in the compute dtype, without master weights, gradients or a CPU copy.
    m.ctx = std::make_unique<Context>(Device::cuda(0));
    InferenceModel loaded = load_inference_model(ckpt, *m.ctx, dtype);
    m.model = std::move(loaded.model);
    m.model->set_grad_memory(GradMemory::Planned);
    non_finite = loaded.non_finite;
  } else {
    // The loaded model is f32 on the CPU, so its weights are read in place.
    m.model = load_checkpoint_model(ckpt);
    const float* weights = m.model->params().host_data<float>();
    for (size_t i = 0; i < m.model->params().size(); ++i) non_finite += !std::isfinite(weights[i]);
  }
  // Weights that are NaN or inf (a diverged run's) are refused before anything is printed.
  TS_CHECK(non_finite == 0, "checkpoint ", given, ": ", counted(non_finite, "weight"), " of the model ",
           non_finite == 1 ? "is" : "are",
           " NaN or infinite (the run that wrote it diverged): nothing to generate from");
  // Byte-level text in and out: a model whose vocab is narrower than the bytes is refused about the model, not
  // about a default prompt the user never gave.
  const int vocab = m.model->config().vocab;
  m.codec = std::make_unique<TextCodec>(TextCodec::for_checkpoint(ckpt, vocab));
  m.config_eos = checkpoint_eos_ids(ckpt, vocab);
  const bool text_fits = !m.codec->byte_level() || vocab >= kByteVocab || a.has("prompt") || a.has("prompt-file");
  TS_CHECK(text_fits, "checkpoint ", given, ": the model's vocab of ", vocab,
           " tokens is not the byte vocabulary (256), and generate reads and writes byte-level text (a --prompt of "
           "bytes below ",
           vocab, " can still be given)");
  return m;
}

// The flags the batched loop alone runs (a model the engine does not run takes the old single-row path).
bool engine_flags_given(const Flags& a) {
  for (const char* f : {"prompt-file", "batch", "min-new-tokens", "min-p", "repetition-penalty", "presence-penalty",
                        "frequency-penalty", "logit-bias", "stop", "eos-id", "ignore-eos", "json", "logprobs", "beams",
                        "num-return-sequences"})
    if (a.has(f)) return true;
  return false;
}

// Runs the prompts in batches and prints them: a single plain sequence streams (prompt, then the text as drawn);
// otherwise each batch's sequences are printed when it ends, plain (prompt + text, a "---" line between sequences)
// or as JSON records.
void run_generate(Model& model, const TextCodec& codec, const std::vector<std::string>& texts,
                  const std::vector<std::vector<int32_t>>& prompts, GenerateOptions o, int batch, bool json) {
  const TextDecoder decode = [&codec](const std::vector<int32_t>& t) { return codec.decode(t); };
  Engine engine(model, generator_engine_options(prompts, batch, o, model.config().max_seq));
  const bool stream = prompts.size() == 1 && !json;
  const uint64_t seed = o.sampling.seed;
  size_t cut_by_context = 0;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(engine.rows())) {
    const size_t end = std::min(prompts.size(), first + static_cast<size_t>(engine.rows()));
    const std::vector<std::vector<int32_t>> chunk(prompts.begin() + static_cast<std::ptrdiff_t>(first),
                                                  prompts.begin() + static_cast<std::ptrdiff_t>(end));
    o.sampling.seed = seed + first / static_cast<size_t>(engine.rows());
    if (stream) put(texts[0]);
    std::vector<GeneratedSequence> out;
    try {
      out = generate_batch(engine, chunk, o, decode,
                           stream ? OnText([](int, const std::string& piece) { put(piece); }) : OnText());
    } catch (...) {
      // The streamed text so far ends its line; the error follows on stderr. Unchecked: the error may be stdout's.
      if (stream) std::fputc('\n', stdout);
      throw;
    }
    for (size_t i = 0; i < out.size(); ++i) {
      const size_t index = first + i;
      if (json) put(json_line(json_record(static_cast<int>(index), texts[index], out[i])));
      else if (stream) put("\n");
      else put((index > 0 ? std::string(kSeparator) + "\n" : std::string()) + texts[index] + out[i].text + "\n");
      // A "length" finish short of --max-new-tokens: the prompt and the new tokens filled the model's context.
      if (out[i].finish == FinishReason::Length && out[i].tokens.size() < static_cast<size_t>(o.max_new_tokens))
        ++cut_by_context;
    }
  }
  if (cut_by_context > 0)
    std::fprintf(stderr,
                 "tessera: %zu of %zu sequence(s) stopped before %d new tokens: the model's context of %d "
                 "tokens is full\n",
                 cut_by_context, prompts.size(), o.max_new_tokens, model.config().max_seq);
}

// --beams K > 1: beam search (infer/beam_generate.h), deterministic, Hugging Face's generate(num_beams=K).
struct BeamFlags {
  int beams = 1;
  BeamSearchOptions search;
};

BeamFlags read_beam_flags(const Flags& a, const GenerateOptions& o) {
  BeamFlags f;
  f.beams = a.integer("beams", 1);
  TS_CHECK(f.beams >= 1, "--beams must be >= 1 (1: sampling or greedy), got ", f.beams);
  const std::string es = a.str("early-stopping", "false");
  TS_CHECK(es == "true" || es == "false" || es == "never", "--early-stopping must be true, false or never, got '", es,
           "'");
  const int n_return = a.integer("num-return-sequences", 1);
  TS_CHECK(n_return >= 1 && n_return <= f.beams, "--num-return-sequences ", n_return, " must lie in [1, ", f.beams,
           "] (at most --beams)");
  if (f.beams == 1) {
    for (const char* flag : {"length-penalty", "early-stopping"})
      TS_CHECK(!a.has(flag), "--", flag, " applies to beam search: give --beams K with K > 1");
    return f;
  }
  // Beam search draws nothing: a sampling setting would be ignored.
  TS_CHECK(!a.has("temperature") || o.sampling.temperature == 0, "--beams ", f.beams,
           " searches for the most likely "
           "sequences, and --temperature ",
           a.str("temperature"), " samples: give one of them");
  for (const char* flag : {"top-k", "top-p", "min-p", "seed", "repetition-penalty", "presence-penalty",
                           "frequency-penalty", "logit-bias", "min-new-tokens", "stop", "logprobs", "ignore-eos"})
    TS_CHECK(!a.has(flag), "--beams ", f.beams, " does not take --", flag,
             " (beam search runs on the plain "
             "log-probabilities, without sampling settings or stop strings)");
  TS_CHECK(o.eos_ids.size() <= 1, "--beams ", f.beams, " takes one --eos-id, got ", o.eos_ids.size());
  f.search = {.beams = f.beams,
              .max_new_tokens = o.max_new_tokens,
              .eos_id = o.eos_ids.empty() ? -1 : o.eos_ids[0],
              .length_penalty = a.number_f32("length-penalty", 1.0f),
              .early_stopping = es == "true"    ? beam::EarlyStopping::True
                                : es == "never" ? beam::EarlyStopping::Never
                                                : beam::EarlyStopping::False,
              .num_return_sequences = n_return};
  return f;
}

// Beam search over the prompts, `batch` prompts per engine of batch x beams rows; each prompt's hypotheses printed
// best first, as sequences of their own (plain, or JSON records with "beam" and "score").
void run_beams(Model& model, const TextCodec& codec, const std::vector<std::string>& texts,
               const std::vector<std::vector<int32_t>>& prompts, BeamSearchOptions o, int batch, bool json) {
  o.vocab = model.config().vocab;
  o.batch = 1;
  beam_search_check(o);  // before anything is printed
  size_t printed = 0;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(batch)) {
    const size_t end = std::min(prompts.size(), first + static_cast<size_t>(batch));
    const std::vector<std::vector<int32_t>> chunk(prompts.begin() + static_cast<std::ptrdiff_t>(first),
                                                  prompts.begin() + static_cast<std::ptrdiff_t>(end));
    size_t longest = 0;
    for (const auto& p : chunk) longest = std::max(longest, p.size());
    Engine engine(model,
                  {.batch = static_cast<int>(chunk.size()), .beams = o.beams, .max_prompt = static_cast<int>(longest)});
    const auto result = beam_generate(engine, chunk, o);
    for (size_t i = 0; i < result.size(); ++i)
      for (size_t j = 0; j < result[i].size(); ++j, ++printed) {
        const BeamSequence& h = result[i][j];
        GeneratedSequence s;
        s.tokens = h.tokens;
        const bool eos = o.eos_id >= 0 && !h.tokens.empty() && h.tokens.back() == o.eos_id;
        s.finish = eos ? FinishReason::Eos : FinishReason::Length;
        s.text = codec.decode(std::span<const int32_t>(h.tokens.data(), h.tokens.size() - (eos ? 1 : 0)));
        const size_t index = first + i;
        if (json) {
          nlohmann::json rec = json_record(static_cast<int>(index), texts[index], s);
          rec["beam"] = j;
          rec["score"] = h.score;
          put(json_line(rec));
        } else {
          put((printed > 0 ? std::string(kSeparator) + "\n" : std::string()) + texts[index] + s.text + "\n");
        }
      }
  }
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  Flags a("generate",
          "Continues a prompt, or each prompt of a file, with a trained model. Text in and out goes\n"
          "through the checkpoint's tokenizer.json; a checkpoint without one is byte-level, and an id\n"
          "the tokenizer has no text for (above 255 there) is printed as <id N>. One sequence\n"
          "streams its text as drawn, whole characters at a time; several print each sequence (prompt and\n"
          "continuation) when its batch ends, with a line \"---\" between sequences, or with --json one\n"
          "record a line.");
  add_generate_flags(a);
  if (!a.parse(argc, argv, 2)) return 0;
  // Every flag before the checkpoint is read; none is quietly turned into another.
  GenerateOptions o = read_generate_options(a);
  BeamFlags beams = read_beam_flags(a, o);
  const std::vector<std::string> texts = read_prompts(a);
  const int batch = a.integer("batch", std::min<int>(static_cast<int>(texts.size()), kDefaultBatchCap));
  TS_CHECK(batch >= 1, "--batch must be >= 1, got ", batch);
  const InferenceDevice dev = read_inference_device(a);
  const bool gpu = dev.gpu;
  const DType dtype = dev.dtype;
  LoadedModel m = load_generate_model(a, gpu, dtype);
  const ModelConfig& cfg = m.model->config();
  generate_options_check(o, cfg.vocab);
  // As Hugging Face's generate(): a save_pretrained directory's eos_token_id ends a sequence unless told otherwise.
  // Beam search takes one EOS id, the first.
  if (!a.has("eos-id") && !o.ignore_eos && !m.config_eos.empty()) {
    o.eos_ids = beams.beams > 1 ? std::vector<int32_t>{m.config_eos[0]} : m.config_eos;
    beams.search.eos_id = m.config_eos[0];
  }
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> t = m.codec->encode(texts[i]);
    TS_CHECK(!t.empty(), "generate: the prompt is empty",
             texts.size() > 1 ? " (prompt " + std::to_string(i) + ")" : "");
    if (static_cast<int>(t.size()) > cfg.max_seq) {
      TS_CHECK(a.has("truncate-prompt"),
               "generate: ", texts.size() > 1 ? "prompt " + std::to_string(i) + " has " : "the prompt has ", t.size(),
               " tokens, more than the model's context of ", cfg.max_seq, " (--truncate-prompt keeps its last ",
               cfg.max_seq, ")");
      t.erase(t.begin(), t.end() - cfg.max_seq);
    }
    prompts.push_back(std::move(t));
  }
  const std::string why = Engine::unsupported(cfg);
  if (!why.empty()) {
    // The full-recompute generate(): one prompt, the sampling flags of the single-row sampler.
    TS_CHECK(!engine_flags_given(a) && o.sampling.min_p == 0, "generate: ", why,
             "; such a model runs one --prompt "
             "with --temperature, --top-k, --top-p, --seed and --max-new-tokens alone");
    TS_CHECK(m.codec->byte_level(), "generate: ", why,
             "; such a model runs byte-level text only, and this checkpoint has a tokenizer (", m.codec->source(), ")");
    generate_streamed(*m.model, prompts[0], o.max_new_tokens,
                      {.temperature = o.sampling.temperature,
                       .top_k = o.sampling.top_k,
                       .top_p = o.sampling.top_p,
                       .seed = o.sampling.seed});
    return 0;
  }
  if (beams.beams > 1) run_beams(*m.model, *m.codec, texts, prompts, beams.search, batch, a.has("json"));
  else run_generate(*m.model, *m.codec, texts, prompts, o, batch, a.has("json"));
  return 0;
}

}  // namespace tessera::cli
