#include "tessera/models/encdec_config.h"

#include <cmath>

#include "tessera/core/error.h"
#include "tessera/models/config.h"

namespace tessera {

float EncDecConfig::emb_scale() const { return scale_embedding ? std::sqrt(static_cast<float>(d_model)) : 1.0f; }

void EncDecConfig::validate() const {
  TS_CHECK(vocab > 0 && vocab <= kMaxVocab, "config: vocab must be in [1, ", kMaxVocab, "], got ", vocab);
  TS_CHECK(src_vocab >= 0 && src_vocab <= kMaxVocab, "config: src_vocab must be in [0, ", kMaxVocab, "], got ",
           src_vocab);
  TS_CHECK(!shared_embeddings || source_vocab() == vocab, "config: shared embeddings need src_vocab ", source_vocab(),
           " equal to vocab ", vocab);
  TS_CHECK(enc_layers > 0 && enc_layers <= kMaxLayers, "config: enc_layers must be in [1, ", kMaxLayers, "], got ",
           enc_layers);
  TS_CHECK(dec_layers > 0 && dec_layers <= kMaxLayers, "config: dec_layers must be in [1, ", kMaxLayers, "], got ",
           dec_layers);
  TS_CHECK(d_model > 0 && d_model <= kMaxWidth, "config: d_model must be in [1, ", kMaxWidth, "], got ", d_model);
  TS_CHECK(n_heads > 0 && d_model % n_heads == 0, "config: d_model ", d_model, " is not divisible by n_heads ",
           n_heads);
  TS_CHECK(n_kv_heads >= 0 && n_heads % kv_heads() == 0, "config: n_heads ", n_heads,
           " is not divisible by n_kv_heads ", kv_heads());
  TS_CHECK(d_ff > 0 && d_ff <= kMaxWidth, "config: d_ff must be in [1, ", kMaxWidth, "], got ", d_ff);
  TS_CHECK(max_seq > 0 && max_seq <= kMaxSeq, "config: max_seq must be in [1, ", kMaxSeq, "], got ", max_seq);
  TS_CHECK(act == Activation::Relu || act == Activation::Gelu || act == Activation::GeluErf,
           "config: an encoder-decoder's activation is relu, gelu or gelu_erf, got ", activation_name(act));
  TS_CHECK(positions == PositionKind::Learned || positions == PositionKind::Sinusoidal,
           "config: an encoder-decoder's positions are learned or sinusoidal, got ", position_kind_name(positions));
  TS_CHECK(positions != PositionKind::Sinusoidal || d_model % 2 == 0,
           "config: sinusoidal positions need an even d_model, got ", d_model);
  TS_CHECK(pos_offset >= 0 && pos_offset <= 16, "config: pos_offset must be in [0, 16], got ", pos_offset);
  TS_CHECK(pos_offset == 0 || positions == PositionKind::Learned, "config: pos_offset applies to learned positions");
  TS_CHECK(dropout >= 0 && dropout < 1, "config: dropout must be in [0, 1), got ", dropout);
  TS_CHECK(attn_dropout >= 0 && attn_dropout < 1, "config: attn_dropout must be in [0, 1), got ", attn_dropout);
  TS_CHECK(act_dropout >= 0 && act_dropout < 1, "config: act_dropout must be in [0, 1), got ", act_dropout);
  for (const auto& [name, id] :
       {std::pair{"pad_id", pad_id}, {"bos_id", bos_id}, {"eos_id", eos_id}, {"decoder_start_id", decoder_start_id}})
    TS_CHECK(id >= 0 && id < vocab && id < source_vocab(), "config: ", name, " ", id, " is outside the vocabulary");
  TS_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "config: norm_eps must be positive and finite, got ", norm_eps);
  TS_CHECK(init_std > 0 && std::isfinite(init_std), "config: init_std must be positive and finite, got ", init_std);
}

EncDecConfig encdec_preset(std::string_view name) {
  EncDecConfig c;
  c.preset = std::string(name);
  if (name == "transformer-base" || name == "transformer-big") {
    // fairseq's transformer_wmt_en_de (and _big): post-norm, ReLU, sinusoidal positions, scaled embeddings.
    const bool big = name == "transformer-big";
    c.vocab = 32768;
    c.enc_layers = c.dec_layers = 6;
    c.d_model = big ? 1024 : 512;
    c.n_heads = big ? 16 : 8;
    c.d_ff = big ? 4096 : 2048;
    c.max_seq = 1024;
    c.dropout = big ? 0.3f : 0.1f;
    return c;
  }
  if (name == "bart-base" || name == "tiny") {
    // BART: post-norm, exact GELU, learned positions from row 2, a LayerNorm after each embedding, unscaled embeddings,
    // shared and tied; pad 1, bos 0, eos 2, decoder start 2.
    const bool tiny = name == "tiny";
    c.vocab = tiny ? 61 : 50265;
    c.enc_layers = c.dec_layers = tiny ? 2 : 6;
    c.d_model = tiny ? 64 : 768;
    c.n_heads = tiny ? 4 : 12;
    c.d_ff = tiny ? 256 : 3072;
    c.max_seq = tiny ? 32 : 1024;
    c.act = Activation::GeluErf;
    c.positions = PositionKind::Learned;
    c.pos_offset = 2;
    c.scale_embedding = false;
    c.layernorm_embedding = true;
    c.dropout = c.attn_dropout = c.act_dropout = tiny ? 0.0f : 0.1f;
    c.init_std = tiny ? 0.125f : 0.02f;  // d_model^-1/2
    return c;
  }
  std::string known;
  for (const std::string& n : encdec_preset_names()) known += (known.empty() ? "" : ", ") + n;
  TS_THROW("unknown encoder-decoder preset '", std::string(name), "' (known: ", known, ")");
}

std::vector<std::string> encdec_preset_names() { return {"transformer-base", "transformer-big", "bart-base", "tiny"}; }

}  // namespace tessera
