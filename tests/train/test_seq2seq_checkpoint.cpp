// Encoder-decoder checkpoints (train/seq2seq_checkpoint.h): a saved model loads back to the same loss, bit for bit,
// in BART's naming (a BART-shaped config) and in tessera's own (a pre-norm, sinusoidal, unshared one); the training
// state comes back whole; config.json says encoder-decoder, GPT's checkpoints do not; a file that does not fit is
// an Error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/models/bart_naming.h"
#include "tessera/models/encoder_decoder.h"
#include "tessera/train/safetensors.h"
#include "tessera/train/seq2seq_checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

EncDecConfig bart_tiny() {
  EncDecConfig c = encdec_preset("tiny");
  c.dropout = c.attn_dropout = c.act_dropout = 0.0f;
  return c;
}

// Everything BART cannot say: pre-norm with final norms, sinusoidal positions, scaled and unshared embeddings,
// an untied output, grouped KV heads.
EncDecConfig own_tiny() {
  EncDecConfig c = encdec_preset("transformer-base");
  c.preset = "custom";
  c.vocab = 37;
  c.src_vocab = 29;
  c.shared_embeddings = false;
  c.tied_output = false;
  c.enc_layers = 2;
  c.dec_layers = 3;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 20;
  c.max_seq = 24;
  c.init_std = 0.05f;  // not the default: both config.json forms must carry it
  c.placement = NormPlacement::Pre;
  c.dropout = 0.0f;
  return c;
}

struct Batch {
  int B = 3, Ts = 7, Tt = 6;
  std::vector<int32_t> src, src_lens{7, 4, 5}, tgt_in, tgt_out, tgt_lens{6, 3, 5};
  Batch(const EncDecConfig& c, std::mt19937_64& rng) {
    std::uniform_int_distribution<int32_t> src_id(3, c.source_vocab() - 1), tgt_id(3, c.vocab - 1);
    for (int i = 0; i < B * Ts; ++i) src.push_back(src_id(rng));
    for (int i = 0; i < B * Tt; ++i) tgt_in.push_back(tgt_id(rng)), tgt_out.push_back(tgt_id(rng));
    for (int b = 0; b < B; ++b) {
      tgt_in[b * Tt] = c.decoder_start_id;
      for (int t = src_lens[b]; t < Ts; ++t) src[b * Ts + t] = c.pad_id;
      for (int t = tgt_lens[b]; t < Tt; ++t) tgt_in[b * Tt + t] = tgt_out[b * Tt + t] = c.pad_id;
    }
  }
  Seq2SeqBatch view() const {
    return {.B = B,
            .Ts = Ts,
            .Tt = Tt,
            .src = src.data(),
            .src_lens = src_lens.data(),
            .tgt_in = tgt_in.data(),
            .tgt_out = tgt_out.data(),
            .tgt_lens = tgt_lens.data()};
  }
};

void round_trip(const EncDecConfig& cfg, bool expect_bart) {
  ASSERT_EQ(is_bart_compatible(cfg), expect_bart);
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  EncoderDecoder m(cfg, ctx);
  m.init_weights(rng());
  const Batch batch(cfg, rng);
  const double loss = m.forward(batch.view(), {.label_smoothing = 0.1f});
  const fs::path dir = test::temp_dir("s2s_ckpt") / "checkpoint";
  TrainState st;
  st.step = 7;
  st.optimizer_step = 6;
  st.rng = {.seed = 11, .next_stream = 5};
  st.data_pos = 42;
  st.options_json = R"({"lr":0.001})";
  st.adam_m.assign(m.params().size(), 0.25f);
  st.adam_v.assign(m.params().size(), 0.5f);
  save_seq2seq_checkpoint(dir.string(), m, &st);
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  EXPECT_TRUE(is_seq2seq_checkpoint(dir.string()));
  const json config = json::parse(read_file_text((dir / "config.json").string()));
  EXPECT_EQ(config["model_type"], expect_bart ? "bart" : "tessera");

  auto back = load_seq2seq_checkpoint(dir.string(), ctx);
  // The preset's name: BART's config.json keeps it beside its own fields (tessera_preset).
  EXPECT_EQ(load_seq2seq_config(dir.string()).preset, cfg.preset);
  EXPECT_EQ(back->config().d_model, cfg.d_model);
  EXPECT_EQ(back->config().placement, cfg.placement);
  EXPECT_EQ(back->config().init_std, cfg.init_std);
  EXPECT_EQ(back->config().shared_embeddings, cfg.shared_embeddings);
  EXPECT_EQ(back->params().read_f32(ctx), m.params().read_f32(ctx));
  EXPECT_EQ(back->forward(batch.view(), {.label_smoothing = 0.1f}), loss);  // bit for bit
  const TrainState again = load_seq2seq_train_state(dir.string(), *back);
  EXPECT_EQ(again.step, 7);
  EXPECT_EQ(again.optimizer_step, 6);
  EXPECT_EQ(again.rng.seed, 11u);
  EXPECT_EQ(again.rng.next_stream, 5u);
  EXPECT_EQ(again.data_pos, 42u);
  EXPECT_EQ(again.options_json, st.options_json);
  EXPECT_EQ(again.adam_m, st.adam_m);
  EXPECT_EQ(again.adam_v, st.adam_v);

  // A second save swaps the directory: the newer model is there, no .tmp or .old left.
  m.init_weights(rng());
  save_seq2seq_checkpoint(dir.string(), m, nullptr);
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  EXPECT_FALSE(fs::exists(dir.string() + ".old"));
  EXPECT_FALSE(fs::exists(dir / "optimizer.safetensors"));
  EXPECT_EQ(load_seq2seq_checkpoint(dir.string(), ctx)->params().read_f32(ctx), m.params().read_f32(ctx));
}

TEST(Seq2SeqCheckpoint, BartConfigRoundTripsBitForBit) { round_trip(bart_tiny(), true); }
TEST(Seq2SeqCheckpoint, OwnConfigRoundTripsBitForBit) { round_trip(own_tiny(), false); }

TEST(Seq2SeqCheckpoint, TellsEncoderDecodersFromOtherDirectories) {
  const fs::path dir = test::temp_dir("s2s_kind");
  EXPECT_FALSE(is_seq2seq_checkpoint((dir / "missing").string()));
  fs::create_directories(dir / "gpt");
  write_file_atomic((dir / "gpt" / "config.json").string(), R"({"model_type": "gpt2"})");
  EXPECT_FALSE(is_seq2seq_checkpoint((dir / "gpt").string()));
  fs::create_directories(dir / "junk");
  write_file_atomic((dir / "junk" / "config.json").string(), "{not json");
  EXPECT_FALSE(is_seq2seq_checkpoint((dir / "junk").string()));
}

TEST(Seq2SeqCheckpoint, AForeignTensorIsNamedWithItsFile) {
  Context ctx(Device::cpu());
  EncoderDecoder m(own_tiny(), ctx);
  m.init_weights(3);
  const fs::path dir = test::temp_dir("s2s_bad") / "ck";
  save_seq2seq_checkpoint(dir.string(), m, nullptr);
  // Rewrite the model file with one tensor renamed.
  const std::string file = (dir / "model.safetensors").string();
  const std::vector<float> host = m.params().read_f32(ctx);
  SafetensorsWriter w;
  const ParamBuffer& pb = m.params();
  for (size_t i = 0; i < pb.segments().size(); ++i)
    w.add(i == 0 ? "stranger" : pb.segments()[i].name, DType::F32, pb.shape(i), host.data() + pb.segments()[i].offset);
  w.write(file);
  try {
    load_seq2seq_checkpoint(dir.string(), ctx);
    FAIL() << "loaded a file without the model's first tensor";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("missing tensor '" + pb.segments()[0].name + "'"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace tessera
