// The EncoderDecoder against Hugging Face BART as an oracle: tessera's weights, written with BART's names as a
// save_pretrained directory, load into BartForConditionalGeneration (tests/oracle/hf_bart_oracle.py, fp32, dropout
// off), and on one padded batch the label-smoothed loss, the logits of every target row inside its length and the
// gradient of every parameter agree with tessera's (the key biases' gradients, zero in exact arithmetic, are
// rounding noise in both). The same directory read back gives the same parameters; a
// config that is not BART's, and a file BART's naming does not describe, are refused in one line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/core/file_io.h"
#include "tessera/models/bart_naming.h"
#include "tessera/models/encoder_decoder.h"
#include "tessera/train/bart_export.h"
#include "tessera/train/safetensors.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kScript = std::string(TESSERA_SOURCE_DIR) + "/tests/oracle/hf_bart_oracle.py";

// A BART-shaped tiny model with GQA off, random weights larger than the init (so that every path matters).
EncDecConfig tiny_bart() {
  EncDecConfig c = encdec_preset("tiny");
  c.dropout = c.attn_dropout = c.act_dropout = 0.0f;
  return c;
}

void randomize(EncoderDecoder& m, std::mt19937_64& rng) {
  m.init_weights(rng());
  std::vector<float> w = m.params().read_f32(m.context());
  for (const ParamSegment& s : m.params().segments()) {
    const bool gain = s.name.ends_with("ln1.w") || s.name.ends_with("ln2.w") || s.name.ends_with("ln3.w") ||
                      s.name.ends_with("lne.w");
    const std::vector<double> r = test::randn<double>(s.numel, rng, 0.3);
    for (size_t i = 0; i < s.numel; ++i) w[s.offset + i] = static_cast<float>(gain ? 1.0 + r[i] : r[i]);
  }
  m.params().write_f32(w, m.context());
}

struct Batch {
  int B = 3, Ts = 7, Tt = 6;
  std::vector<int32_t> src, src_lens{7, 4, 5}, tgt_in, tgt_out, tgt_lens{6, 3, 5};
  explicit Batch(const EncDecConfig& c, std::mt19937_64& rng) {
    auto ids = [&](int n) {
      std::vector<int32_t> v = test::randint(size_t(n), c.vocab - 3, rng);
      for (int32_t& x : v) x += 3;  // ids 3.. : no pad, bos or eos inside the lengths
      return v;
    };
    src = ids(B * Ts);
    tgt_in = ids(B * Tt);
    tgt_out = ids(B * Tt);
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
  json to_json(float smoothing) const {
    return {{"B", B},
            {"Ts", Ts},
            {"Tt", Tt},
            {"src", src},
            {"src_lens", src_lens},
            {"tgt_in", tgt_in},
            {"tgt_out", tgt_out},
            {"tgt_lens", tgt_lens},
            {"label_smoothing", smoothing}};
  }
};

// 0: ran; 77: transformers is not installed (and TESSERA_REQUIRE_HF is not 1); else a failure.
int run_oracle(const fs::path& dir) {
  const std::string cmd = std::string(TESSERA_PYTHON) + " '" + kScript + "' '" + dir.string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double rel(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(BartExport, LossLogitsAndEveryGradientEqualTransformers) {
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  const EncDecConfig cfg = tiny_bart();
  EncoderDecoder m(cfg, ctx, DType::F32);
  randomize(m, rng);
  const Batch batch(cfg, rng);
  constexpr float kSmoothing = 0.1f;
  const fs::path dir = test::temp_dir("bart_export");
  save_bart_pretrained(dir.string(), m);
  write_file_atomic((dir / "batch.json").string(), batch.to_json(kSmoothing).dump());
  const int rc = run_oracle(dir);
  if (rc == 77) GTEST_SKIP() << "transformers is not installed for " << TESSERA_PYTHON;
  ASSERT_EQ(rc, 0);
  const json hf = json::parse(read_file_text((dir / "out.json").string()));

  const double loss = m.forward(batch.view(), {.label_smoothing = kSmoothing});
  EXPECT_NEAR(loss, hf["loss"].get<double>(), 1e-5 * std::abs(hf["loss"].get<double>()));
  std::vector<float> logits;
  for (int row : hf["rows"].get<std::vector<int>>()) {
    const std::vector<float> r = m.read_logits_row(row);
    logits.insert(logits.end(), r.begin(), r.end());
  }
  EXPECT_LT(rel(logits, hf["logits"].get<std::vector<double>>()), 1e-5);

  m.zero_grad();
  m.backward();
  const std::vector<float> grad = m.params().read_grad_f32(ctx);
  const std::vector<ExportTensor> layout = bart_layout(cfg, m.params());
  const auto& hf_grads = hf["grads"];
  for (const ExportTensor& t : layout) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(hf_grads.contains(t.name));
    const std::vector<double> want = hf_grads[t.name].get<std::vector<double>>();
    const size_t begin = m.params().segments()[t.segment].offset + size_t(t.row_begin * t.cols);
    const std::vector<float> got(grad.begin() + long(begin), grad.begin() + long(begin + want.size()));
    ASSERT_EQ(size_t(t.rows * t.cols), want.size());
    if (t.name.ends_with("k_proj.bias")) {
      // q·(k + b) adds q·b to every score of a row, which the softmax cancels: the key bias's gradient is zero
      // but for rounding, in both.
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_LT(std::abs(got[i]), 1e-5);
        EXPECT_LT(std::abs(want[i]), 1e-5);
      }
      continue;
    }
    EXPECT_LT(rel(got, want), 2e-4);
  }
  // Every parameter BART trains has a tessera tensor.
  std::set<std::string> names;
  for (const ExportTensor& t : layout) names.insert(t.name);
  for (const auto& [name, g] : hf_grads.items()) EXPECT_TRUE(names.count(name)) << name << " has no tessera tensor";
}

TEST(BartExport, ReadBackGivesTheSameParameters) {
  std::mt19937_64 rng(test::test_seed());
  Context ctx(Device::cpu());
  EncoderDecoder m(tiny_bart(), ctx, DType::F32);
  randomize(m, rng);
  const fs::path dir = test::temp_dir("bart_roundtrip");
  save_bart_pretrained(dir.string(), m);
  const std::unique_ptr<EncoderDecoder> back = load_bart_pretrained(dir.string(), ctx);
  EXPECT_EQ(back->params().read_f32(ctx), m.params().read_f32(ctx));
  EXPECT_EQ(back->config().vocab, m.config().vocab);
  EXPECT_EQ(back->config().act, Activation::GeluErf);
}

TEST(BartExport, RefusesWhatBartCannotHoldInOneLine) {
  Context ctx(Device::cpu());
  EncDecConfig c = encdec_preset("transformer-base");
  c.vocab = 50;
  c.enc_layers = c.dec_layers = 1;
  c.d_model = 8;
  c.n_heads = 2;
  c.d_ff = 8;
  EncoderDecoder m(c, ctx);
  EXPECT_EQ(test::error_of([&] { save_bart_pretrained(test::temp_dir("bart_refused").string(), m); }),
            "BART naming: this config is not BART's: BART's positions are learned, from row 2");
  // A file with a tensor BART's naming does not describe.
  std::mt19937_64 rng(test::test_seed());
  EncoderDecoder bart(tiny_bart(), ctx);
  const fs::path dir = test::temp_dir("bart_extra");
  save_bart_pretrained(dir.string(), bart);
  json cfg = json::parse(read_file_text((dir / "config.json").string()));
  cfg["activation_function"] = "silu";
  write_file_atomic((dir / "config.json").string(), cfg.dump());
  EXPECT_EQ(test::without_numbers(test::error_of([&] { load_bart_pretrained(dir.string(), ctx); })),
            test::without_numbers((dir / "config.json").string() +
                                  ": activation_function 'silu' is not one tessera computes (relu, gelu, gelu_new)"));
}

}  // namespace
}  // namespace tessera
