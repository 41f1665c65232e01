#include "tessera/models/config.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/json_fields.h"
#include "tessera/core/units.h"

namespace tessera {

void ModelConfig::validate() const {
  TS_CHECK(vocab > 0, "config: vocab must be positive, got ", vocab);
  TS_CHECK(d_model > 0, "config: d_model must be positive, got ", d_model);
  TS_CHECK(n_layers > 0, "config: n_layers must be positive, got ", n_layers);
  TS_CHECK(n_heads > 0, "config: n_heads must be positive, got ", n_heads);
  TS_CHECK(d_model % n_heads == 0, "config: d_model ", d_model, " is not divisible by n_heads ", n_heads);
  TS_CHECK(n_kv_heads >= 0, "config: n_kv_heads must be positive (or 0: n_heads), got ", n_kv_heads);
  TS_CHECK(n_heads % kv_heads() == 0, "config: n_heads ", n_heads, " is not divisible by n_kv_heads ", kv_heads());
  TS_CHECK(positions != PositionKind::Rope || head_dim() % 2 == 0, "config: rope needs an even head dim, got ",
           head_dim());
  TS_CHECK(positions != PositionKind::Sinusoidal || d_model % 2 == 0,
           "config: sinusoidal positions need an even d_model, got ", d_model);
  TS_CHECK(d_ff > 0, "config: d_ff must be positive, got ", d_ff);
  TS_CHECK(max_seq > 0, "config: max_seq must be positive, got ", max_seq);
  TS_CHECK(dropout >= 0 && dropout < 1, "config: dropout must be in [0, 1), got ", dropout);
  TS_CHECK(attn_dropout >= 0 && attn_dropout < 1, "config: attn_dropout must be in [0, 1), got ", attn_dropout);
  TS_CHECK(padding_id >= -1 && padding_id < vocab, "config: padding_id ", padding_id, " is outside [-1, vocab)");
  TS_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "config: norm_eps must be positive and finite, got ", norm_eps);
  TS_CHECK(emb_scale > 0 && std::isfinite(emb_scale), "config: emb_scale must be positive and finite, got ", emb_scale);
  TS_CHECK(positions != PositionKind::Rope || (rope_theta > 0 && std::isfinite(rope_theta)),
           "config: rope_theta must be positive and finite, got ", rope_theta);
  // Bounds far past any real model, so that every size product fits its integer type (and the activation plan,
  // whose cost grows with the square of the layer count, stays seconds).
  TS_CHECK(n_layers <= kMaxLayers, "config: n_layers ", n_layers, " is more than ", kMaxLayers);
  TS_CHECK(d_model <= kMaxWidth, "config: d_model ", d_model, " is more than ", kMaxWidth);
  TS_CHECK(d_ff <= kMaxWidth, "config: d_ff ", d_ff, " is more than ", kMaxWidth);
  TS_CHECK(vocab <= kMaxVocab, "config: vocab ", vocab, " is more than ", kMaxVocab);
  TS_CHECK(max_seq <= kMaxSeq, "config: max_seq ", max_seq, " is more than ", kMaxSeq);
}

int64_t ModelConfig::num_params() const {
  const int64_t C = d_model, V = vocab;
  const int64_t norm_params = (norm == NormKind::LayerNorm && bias) ? 2 * C : C;
  int64_t layer = 2 * norm_params;
  const int64_t Q = qkv_width();
  layer += Q * C + (bias ? Q : 0);                                        // qkv
  layer += C * C + (bias ? C : 0);                                        // attention output projection
  layer += static_cast<int64_t>(d_ff_in()) * C + (bias ? d_ff_in() : 0);  // fc
  layer += static_cast<int64_t>(d_ff) * C + (bias ? C : 0);               // fc projection
  int64_t total = V * C + n_layers * layer + norm_params;
  if (positions == PositionKind::Learned) total += static_cast<int64_t>(max_seq) * C;
  if (!tied) total += V * C;
  return total;
}

bool ModelConfig::is_gpt2_compatible() const {
  return norm == NormKind::LayerNorm && mlp == Activation::Gelu && positions == PositionKind::Learned && bias &&
         kv_heads() == n_heads && tied && emb_scale == 1.0f && padding_id == -1;
}

bool ModelConfig::is_llama_compatible() const {
  return norm == NormKind::RmsNorm && mlp == Activation::Swiglu && positions == PositionKind::Rope && !bias &&
         emb_scale == 1.0f && padding_id == -1;
}

ModelConfig llama_style(ModelConfig c) {
  c.norm = NormKind::RmsNorm;
  c.mlp = Activation::Swiglu;
  c.positions = PositionKind::Rope;
  c.bias = false;
  c.tied = false;
  return c;
}

namespace {
ModelConfig cs336(const char* name, int d_model, int d_ff, int n_layers, int n_heads, int n_kv_heads = 0) {
  ModelConfig c;
  c.preset = name;
  c.vocab = 10000;
  c.d_model = d_model;
  c.d_ff = d_ff;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.max_seq = 1024;
  return llama_style(c);
}
}  // namespace

std::vector<std::string> model_preset_names() {
  return {"tiny",        "gpt2-124m", "cs336-small", "cs336-medium",
          "cs336-large", "cs336-xl",  "cs336-2.7b",  "llama-gqa-small"};
}

ModelConfig model_preset(std::string_view name) {
  if (name == "tiny") {
    // Byte-level GPT-2-style model that learns English-looking text in a couple of CPU minutes.
    ModelConfig c;
    c.preset = "tiny";
    c.vocab = 256;
    c.d_model = 128;
    c.n_layers = 4;
    c.n_heads = 4;
    c.d_ff = 512;
    c.max_seq = 64;
    c.dropout = 0.0f;
    return c;
  }
  if (name == "gpt2-124m") {
    ModelConfig c;
    c.preset = "gpt2-124m";
    c.vocab = 50257;
    c.d_model = 768;
    c.n_layers = 12;
    c.n_heads = 12;
    c.d_ff = 3072;
    c.max_seq = 1024;
    c.dropout = 0.1f;
    c.attn_dropout = 0.1f;  // GPT-2's attn_pdrop, as the Hugging Face peer trains it
    return c;
  }
  // CS336 assignment 2 model sizes, d_ff = 4 d_model as the assignment's table gives it.
  if (name == "cs336-small") return cs336("cs336-small", 768, 3072, 12, 12);
  if (name == "cs336-medium") return cs336("cs336-medium", 1024, 4096, 24, 16);
  if (name == "cs336-large") return cs336("cs336-large", 1280, 5120, 36, 20);
  if (name == "cs336-xl") return cs336("cs336-xl", 1600, 6400, 48, 25);
  if (name == "cs336-2.7b") return cs336("cs336-2.7b", 2560, 10240, 32, 32);
  // cs336-small's shape with grouped-query attention: 12 query heads sharing 4 key/value heads.
  if (name == "llama-gqa-small") return cs336("llama-gqa-small", 768, 3072, 12, 12, /*n_kv_heads=*/4);
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  TS_THROW("unknown preset '", name, "' (known: ", known, ")");
}

std::string norm_kind_name(NormKind k) { return k == NormKind::LayerNorm ? "layernorm" : "rmsnorm"; }
std::string position_kind_name(PositionKind k) {
  switch (k) {
    case PositionKind::Learned: return "learned";
    case PositionKind::Rope: return "rope";
    case PositionKind::Sinusoidal: return "sinusoidal";
  }
  return "?";
}

namespace {
int parse_int(std::string_view field, std::string_view v) {
  int out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  TS_CHECK(ec == std::errc() && ptr == v.data() + v.size(), "config: ", field, " expects an integer, got '", v, "'");
  return out;
}
// Decimal notation only, as the command line's numbers are (core/units.h): strtof alone takes "0x10" as 16. A finite
// number past float's range, or too close to zero for it, is said with the text as typed, not as "got inf" or
// "got 0". "inf" and "nan" are read as such, for validate() to say what the field accepts ("must be positive and
// finite").
float parse_float(std::string_view field, std::string_view v) {
  if (v == "inf" || v == "+inf" || v == "-inf" || v == "nan") return std::strtof(std::string(v).c_str(), nullptr);
  float out = 0.0f;
  const DecimalStatus st = parse_decimal<float>(v, &out);
  TS_CHECK(st == DecimalStatus::Ok || st == DecimalStatus::NotANumber, "config: ", field, " ", v, " ",
           decimal_range_note<float>(st));
  TS_CHECK(st == DecimalStatus::Ok, "config: ", field, " expects a decimal number, got '", v, "'");
  return out;
}
bool parse_bool(std::string_view field, std::string_view v) {
  if (v == "true" || v == "on" || v == "1") return true;
  if (v == "false" || v == "off" || v == "0") return false;
  TS_THROW("config: ", field, " expects true/false (or on/off, 1/0), got '", v, "'");
}
}  // namespace

std::vector<std::string> model_config_fields() {
  return {"vocab",   "d_model",      "n_layers",  "n_heads",    "n_kv_heads", "d_ff",
          "max_seq", "norm",         "mlp",       "positions",  "bias",       "tied",
          "dropout", "attn_dropout", "emb_scale", "padding_id", "norm_eps",   "rope_theta"};
}

void model_config_set(ModelConfig& c, std::string_view f, std::string_view v) {
  if (f == "vocab") c.vocab = parse_int(f, v);
  else if (f == "d_model") c.d_model = parse_int(f, v);
  else if (f == "n_layers") c.n_layers = parse_int(f, v);
  else if (f == "n_heads") c.n_heads = parse_int(f, v);
  else if (f == "n_kv_heads") c.n_kv_heads = parse_int(f, v);
  else if (f == "d_ff") c.d_ff = parse_int(f, v);
  else if (f == "max_seq") c.max_seq = parse_int(f, v);
  else if (f == "norm") {
    if (v == "layernorm") c.norm = NormKind::LayerNorm;
    else if (v == "rmsnorm") c.norm = NormKind::RmsNorm;
    else TS_THROW("config: norm must be layernorm or rmsnorm, got '", v, "'");
  } else if (f == "mlp") c.mlp = activation_from_name(v);
  else if (f == "positions") {
    if (v == "learned") c.positions = PositionKind::Learned;
    else if (v == "rope") c.positions = PositionKind::Rope;
    else if (v == "sinusoidal") c.positions = PositionKind::Sinusoidal;
    else TS_THROW("config: positions must be learned, rope or sinusoidal, got '", v, "'");
  } else if (f == "bias") c.bias = parse_bool(f, v);
  else if (f == "tied") c.tied = parse_bool(f, v);
  else if (f == "dropout") c.dropout = parse_float(f, v);
  else if (f == "attn_dropout") c.attn_dropout = parse_float(f, v);
  else if (f == "emb_scale") c.emb_scale = parse_float(f, v);
  else if (f == "padding_id") c.padding_id = parse_int(f, v);
  else if (f == "norm_eps") c.norm_eps = parse_float(f, v);
  else if (f == "rope_theta") c.rope_theta = parse_float(f, v);
  else TS_THROW("config: unknown field '", f, "'");
  c.preset = "custom";
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"vocab", c.vocab},
                      {"d_model", c.d_model},
                      {"n_layers", c.n_layers},
                      {"n_heads", c.n_heads},
                      {"d_ff", c.d_ff},
                      {"max_seq", c.max_seq},
                      {"norm", norm_kind_name(c.norm)},
                      {"mlp", std::string(activation_name(c.mlp))},
                      {"positions", position_kind_name(c.positions)},
                      {"bias", c.bias},
                      {"tied", c.tied},
                      {"dropout", c.dropout},
                      {"attn_dropout", c.attn_dropout},
                      {"emb_scale", c.emb_scale},
                      {"padding_id", c.padding_id},
                      {"norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"preset", c.preset}};
  // Only with grouping, so that the config of a model without it reads as before.
  if (c.kv_heads() != c.n_heads) j["n_kv_heads"] = c.kv_heads();
  return j;
}

ModelConfig model_config_from_json(const nlohmann::json& j, std::string_view where) {
  TS_CHECK(j.is_object(), where, ": expected a JSON object");
  // Each field checked by type, and integers within int's range (nlohmann's get<int> would truncate 2^32 + 128 to
  // 128, or 256.7 to 256); a missing or mistyped field is named.
  ModelConfig c;
  c.vocab = json_int(j, "vocab", where);
  c.d_model = json_int(j, "d_model", where);
  c.n_layers = json_int(j, "n_layers", where);
  c.n_heads = json_int(j, "n_heads", where);
  // Files without n_kv_heads have no grouping.
  c.n_kv_heads = j.contains("n_kv_heads") ? json_int(j, "n_kv_heads", where) : 0;
  c.d_ff = json_int(j, "d_ff", where);
  c.max_seq = json_int(j, "max_seq", where);
  model_config_set(c, "norm", json_string(j, "norm", where));
  model_config_set(c, "mlp", json_string(j, "mlp", where));
  model_config_set(c, "positions", json_string(j, "positions", where));
  c.bias = json_bool(j, "bias", where);
  c.tied = json_bool(j, "tied", where);
  c.dropout = static_cast<float>(json_number(j, "dropout", where));
  // Files written before attention dropout existed have no attn_dropout: they trained without it.
  c.attn_dropout = j.contains("attn_dropout") ? static_cast<float>(json_number(j, "attn_dropout", where)) : 0.0f;
  c.emb_scale = static_cast<float>(json_number(j, "emb_scale", where));
  c.padding_id = json_int(j, "padding_id", where);
  c.norm_eps = static_cast<float>(json_number(j, "norm_eps", where));
  c.rope_theta = static_cast<float>(json_number(j, "rope_theta", where));
  c.preset = j.contains("preset") ? json_string(j, "preset", where) : "custom";
  c.validate();
  return c;
}

}  // namespace tessera
