#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/safetensors.h"
#include "tessera/train/trainer.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::temp_dir;

ModelConfig small(bool llama) {
  const ModelConfig c = test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/2, /*n_heads=*/2, /*d_ff=*/24,
                                           /*max_seq=*/16);
  return llama ? llama_style(c) : c;
}

TEST(Checkpoint, RoundTripEveryNaming) {
  ModelConfig tessera_cfg = small(false);
  tessera_cfg.positions = PositionKind::Sinusoidal;  // not a Hugging Face architecture
  for (const ModelConfig& cfg : {small(false), small(true), tessera_cfg}) {
    const fs::path d = temp_dir("rt");
    Gpt a(cfg);
    a.init_weights(test::test_seed());
    save_checkpoint((d / "ck").string(), a, nullptr);
    EXPECT_FALSE(fs::exists(d / "ck.tmp"));
    auto b = load_checkpoint_model((d / "ck").string());
    ASSERT_EQ(b->params().size(), a.params().size());
    EXPECT_EQ(std::memcmp(a.params().data(), b->params().data(), a.params().size() * 4), 0);
    fs::remove_all(d);
  }
}

TEST(Checkpoint, Gpt2UsesHuggingFaceNamesAndConv1DLayout) {
  const fs::path d = temp_dir("gpt2");
  Gpt m(small(false));
  m.init_weights(5);
  save_checkpoint((d / "ck").string(), m, nullptr);
  const auto st = SafetensorsFile::load((d / "ck" / "model.safetensors").string());
  EXPECT_EQ(st.meta("format"), "pt");
  EXPECT_FALSE(st.has("lm_head.weight"));  // tied
  const auto& e = st.entry("transformer.h.1.attn.c_attn.weight");
  ASSERT_EQ(e.shape, (std::vector<int64_t>{16, 48}));  // Conv1D: (in, out)
  const float* hf = reinterpret_cast<const float*>(st.data("transformer.h.1.attn.c_attn.weight"));
  const int seg = m.params().find("h.1.qkv.w");
  const float* ours = m.params().data() + m.params().segments()[seg].offset;  // (out=48, in=16)
  for (int o = 0; o < 48; ++o)
    for (int i = 0; i < 16; ++i) ASSERT_EQ(hf[i * 48 + o], ours[o * 16 + i]);
  const auto cfg = nlohmann::json::parse(read_file_text((d / "ck" / "config.json").string()));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["n_embd"], 16);
  fs::remove_all(d);
}

TEST(Checkpoint, LlamaSplitsFusedMatrices) {
  const fs::path d = temp_dir("llama");
  Gpt m(small(true));
  m.init_weights(6);
  save_checkpoint((d / "ck").string(), m, nullptr);
  const auto st = SafetensorsFile::load((d / "ck" / "model.safetensors").string());
  for (const char* n : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight", "lm_head.weight",
                        "model.norm.weight", "model.embed_tokens.weight"})
    EXPECT_TRUE(st.has(n)) << n;
  EXPECT_EQ(st.entry("model.layers.0.mlp.up_proj.weight").shape, (std::vector<int64_t>{24, 16}));
  const float* k = reinterpret_cast<const float*>(st.data("model.layers.0.self_attn.k_proj.weight"));
  const float* ours = m.params().data() + m.params().segments()[m.params().find("h.0.qkv.w")].offset;
  EXPECT_EQ(std::memcmp(k, ours + 16 * 16, 16 * 16 * 4), 0);  // rows [C, 2C) of the fused qkv
  const auto cfg = nlohmann::json::parse(read_file_text((d / "ck" / "config.json").string()));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["intermediate_size"], 24);
  fs::remove_all(d);
}

TEST(Checkpoint, RejectsCorruptAndMismatchedFiles) {
  const fs::path d = temp_dir("bad");
  Gpt m(small(false));
  m.init_weights(1);
  save_checkpoint((d / "ck").string(), m, nullptr);
  const std::string good = (d / "ck" / "model.safetensors").string();
  const auto bytes = read_file_bytes(good);
  auto write = [&](const std::string& name, std::vector<uint8_t> b) {
    const std::string p = (d / name).string();
    write_file_atomic(p, b.data(), b.size());
    return p;
  };
  // Truncated data section.
  auto p = write("trunc.safetensors", std::vector<uint8_t>(bytes.begin(), bytes.end() - 100));
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); }).find("outside the file"), std::string::npos);
  // Header length beyond the file.
  auto b2 = bytes;
  b2[5] = 0x7f;
  p = write("len.safetensors", b2);
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); }).find("exceeds the file size"), std::string::npos);
  // Garbage header.
  auto b3 = bytes;
  b3[8] = '#';
  p = write("json.safetensors", b3);
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); }).find("not valid JSON"), std::string::npos);
  // Too short to hold a header length.
  p = write("tiny.safetensors", {1, 2, 3});
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); }).find("truncated"), std::string::npos);
  // A file for another model: shapes do not match.
  ModelConfig other = small(false);
  other.d_ff = 32;
  Gpt o(other);
  EXPECT_NE(error_of([&] { load_checkpoint_weights(good, o); }).find("has shape"), std::string::npos);
  // Missing optimizer state.
  EXPECT_NE(error_of([&] { load_train_state((d / "ck").string(), m); }).find("no optimizer state"), std::string::npos);
  fs::remove_all(d);
}

TEST(Schedule, WarmupThenCosine) {
  TrainOptions o;
  o.lr = 1.0f;
  o.warmup = 10;
  o.min_lr_ratio = 0.1f;
  EXPECT_FLOAT_EQ(lr_at(1, 110, o), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(10, 110, o), 1.0f);
  EXPECT_NEAR(lr_at(60, 110, o), 0.55f, 1e-6);
  EXPECT_NEAR(lr_at(110, 110, o), 0.1f, 1e-6);
}

// Stopping and resuming gives the same losses, bit for bit, as one uninterrupted run; with dropout, label
// smoothing and gradient accumulation so the RNG, optimizer and data position must all be restored.
TEST(Trainer, ResumeIsBitExact) {
  const fs::path d = temp_dir("resume");
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  prepare_text(text, (d / "data").string());
  TrainOptions o;
  o.model = small(false);
  o.model.dropout = 0.1f;
  o.data = (d / "data").string();
  o.batch = 2;
  o.seq = 16;
  o.accum = 2;
  o.label_smoothing = 0.1f;
  o.warmup = 2;
  o.val_every = 3;
  o.progress = false;
  o.steps = 6;
  o.out = (d / "full").string();
  train(o);
  o.stop_after = 3;  // interrupted after step 3 of 6
  o.out = (d / "split").string();
  train(o);
  TrainOptions r;
  r.resume = (d / "split" / "checkpoint").string();
  r.out = (d / "split").string();
  r.steps = 0;  // the saved run's 6
  r.progress = false;
  train(r);
  auto losses = [](const fs::path& p) {
    std::vector<std::pair<int64_t, double>> out;
    std::ifstream in(p);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
      if (j.contains("val_loss")) out.emplace_back(-j["step"].get<int64_t>(), j["val_loss"].get<double>());
    }
    return out;
  };
  const auto a = losses(d / "full" / "metrics.jsonl"), b = losses(d / "split" / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second, b[i].second) << "step " << a[i].first;  // bit for bit
  }
  EXPECT_LT(a.back().second, a.front().second);  // and it learns
  // The final weights agree too.
  auto ma = load_checkpoint_model((d / "full" / "checkpoint").string());
  auto mb = load_checkpoint_model((d / "split" / "checkpoint").string());
  EXPECT_EQ(std::memcmp(ma->params().data(), mb->params().data(), ma->params().size() * 4), 0);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
