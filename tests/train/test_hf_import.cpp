// Hugging Face checkpoints in: directories that transformers' save_pretrained wrote (tests/oracle/hf_fixtures.py:
// a tiny GPT2LMHeadModel, in fp32, fp16 and as the hub's gpt2 names its tensors, and a tiny LlamaForCausalLM with
// grouped KV heads, in fp32, bf16 and sharded) load into tessera, whose logits on a prompt equal transformers' and
// whose greedy continuation (tessera generate --greedy) equals generate(do_sample=False). The refusals: one line
// naming the field, the tensor or the shard, and nothing loaded or printed.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/safetensors.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::edit_safetensors_header;
using test::error_of;

const std::string kScript = std::string(TESSERA_SOURCE_DIR) + "/tests/oracle/hf_fixtures.py";
const char* const kDirs[] = {"gpt2", "gpt2-bare", "gpt2-f16", "llama", "llama-bf16", "llama-sharded"};

// The fixtures, written once per version of the script and Python (each test runs in a process of its own): into
// <temp>/tessera_hf_fixtures_<hash>, made whole in a directory of this process and renamed into place. "" where the
// script skips (exit 77: transformers is not installed, and TESSERA_REQUIRE_HF is not 1).
fs::path fixtures() {
  static const fs::path dir = [] {
    Fnv h;
    h.add(read_file_text(kScript));
    h.add(std::string(TESSERA_PYTHON));
    const fs::path final_dir = fs::temp_directory_path() / ("tessera_hf_fixtures_" + std::to_string(h.h));
    if (fs::is_directory(final_dir)) return final_dir;
    const fs::path tmp = final_dir.string() + ".tmp" + std::to_string(::getpid());
    const std::string cmd = std::string(TESSERA_PYTHON) + " '" + kScript + "' --out '" + tmp.string() + "' 2>&1";
    const int status = std::system(cmd.c_str());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return fs::path();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
    std::error_code ec;
    fs::rename(tmp, final_dir, ec);  // another test process may have put its copy there first
    fs::remove_all(tmp, ec);
    return final_dir;
  }();
  return dir;
}

#define REQUIRE_FIXTURES() \
  if (fixtures().empty()) GTEST_SKIP() << "transformers is not installed for " << TESSERA_PYTHON;

json refs_of(const fs::path& d) { return json::parse(read_file_text((d / "refs.json").string())); }

// ||a - b|| / ||b||.
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

TEST(HfImport, LogitsEqualTransformers) {
  REQUIRE_FIXTURES();
  for (const char* name : kDirs) {
    SCOPED_TRACE(name);
    const fs::path d = fixtures() / name;
    const json r = refs_of(d);
    const auto model = load_checkpoint_model(d.string());
    // The inference loader reads the same weights from the same directory.
    Context cpu(Device::cpu());
    const InferenceModel inference = load_inference_model(d.string(), cpu, DType::F32);
    EXPECT_EQ(inference.non_finite, 0u);
    EXPECT_EQ(inference.model->params().read_f32(cpu), model->params().read_f32(model->context()));
    const std::vector<int32_t> prompt = r["prompt"].get<std::vector<int32_t>>();
    const int T = static_cast<int>(prompt.size()), V = model->config().vocab;
    ASSERT_EQ(V, 96);
    model->forward(prompt.data(), nullptr, 1, T, {});
    std::vector<float> logits;
    for (int t = 0; t < T; ++t) {
      const std::vector<float> row = model->read_logits_row(t);
      logits.insert(logits.end(), row.begin(), row.begin() + V);
    }
    const std::vector<double> want = r["logits"].get<std::vector<double>>();
    ASSERT_EQ(logits.size(), want.size());
    // Against transformers in fp32 on the same weights (a 16-bit file's rounded weights, widened).
    EXPECT_LE(rel_err(logits, want), 1e-5);
    if (std::string(name).rfind("llama", 0) == 0) {
      EXPECT_EQ(model->config().n_heads, 4);
      EXPECT_EQ(model->config().kv_heads(), 2);
      EXPECT_FALSE(model->config().tied);
    } else {
      EXPECT_TRUE(model->config().tied);
    }
  }
}

// refs.json's greedy path has a top-2 logit gap of at least 0.05 at every step (the script chose the seed for it),
// far above the float differences between the two implementations: a tie cannot decide it.
TEST(HfImport, GreedyEqualsTransformersGenerate) {
  REQUIRE_FIXTURES();
  for (const char* name : kDirs) {
    SCOPED_TRACE(name);
    const fs::path d = fixtures() / name;
    const json r = refs_of(d);
    EXPECT_GE(r["min_gap"].get<double>(), 0.05);
    std::string prompt, want;
    for (int id : r["prompt"]) prompt.push_back(static_cast<char>(id));
    for (int id : r["greedy"]) want.push_back(static_cast<char>(id));
    const int n = static_cast<int>(r["greedy"].size() - r["prompt"].size());
    ASSERT_GE(n, 20);
    // refs.json's path is generate(eos_token_id=None): EOS ignored.
    const auto run = test::run("generate --checkpoint '" + d.string() + "' --prompt '" + prompt + "' --tokens " +
                               std::to_string(n) + " --greedy --ignore-eos");
    ASSERT_EQ(run.code, 0) << run.err;
    EXPECT_EQ(run.out.substr(0, want.size()), want);
  }
}

// As transformers' generate(): a save_pretrained directory's eos_token_id ends the sequence, from
// generation_config.json where it exists (an id or a list; ids past the vocab never match), else config.json;
// --ignore-eos and --eos-id override it.
TEST(HfImport, GenerateStopsAtTheConfigsEos) {
  REQUIRE_FIXTURES();
  const fs::path d = test::temp_dir("hf_eos") / "gpt2";
  fs::create_directories(d.parent_path());
  fs::copy(fixtures() / "gpt2", d, fs::copy_options::recursive);
  const json r = refs_of(d);
  const std::vector<int> greedy = r["greedy"].get<std::vector<int>>();
  const size_t p = r["prompt"].size(), n = greedy.size() - p;
  std::string prompt;
  for (size_t i = 0; i < p; ++i) prompt.push_back(static_cast<char>(greedy[i]));
  // The first new token from the third on that the continuation has not drawn before: it ends the sequence there.
  size_t k = 2;
  while (k < greedy.size() - p &&
         std::find(greedy.begin() + p, greedy.begin() + p + k, greedy[p + k]) != greedy.begin() + p + k)
    ++k;
  ASSERT_LT(k, n);
  const int eos = greedy[p + k], first = greedy[p];
  const int vocab = json::parse(read_file_text((d / "config.json").string()))["vocab_size"].get<int>();
  auto set_json = [&](const char* file, const json& eos_field) {
    json j = json::parse(read_file_text((d / file).string()));
    j["eos_token_id"] = eos_field;
    std::ofstream((d / file).string()) << j.dump();
  };
  auto new_tokens = [&](const std::string& flags) {
    const auto run = test::run("generate --checkpoint '" + d.string() + "' --prompt '" + prompt +
                               "' --max-new-tokens " + std::to_string(n) + " --greedy --json" + flags);
    EXPECT_EQ(run.code, 0) << run.err;
    const json rec = json::parse(run.out);
    return std::pair{rec["tokens"].get<std::vector<int>>(), rec["finish_reason"].get<std::string>()};
  };
  const std::vector<int> until_eos(greedy.begin() + p, greedy.begin() + p + k + 1);
  fs::remove(d / "generation_config.json");
  set_json("config.json", eos);
  EXPECT_EQ(new_tokens(""), std::pair(until_eos, std::string("eos")));
  set_json("config.json", first);  // generation_config.json, written now, is the one read
  std::ofstream((d / "generation_config.json").string()) << json{{"eos_token_id", {vocab + 5, eos}}}.dump();
  EXPECT_EQ(new_tokens(""), std::pair(until_eos, std::string("eos")));
  EXPECT_EQ(new_tokens(" --ignore-eos").first, std::vector<int>(greedy.begin() + p, greedy.end()));
  EXPECT_EQ(new_tokens(" --eos-id " + std::to_string(eos)), std::pair(until_eos, std::string("eos")));
}

TEST(HfImport, InfoDescribesTheShardedLlama) {
  REQUIRE_FIXTURES();
  const auto run = test::run("info --checkpoint '" + (fixtures() / "llama-sharded").string() + "'");
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find("rmsnorm"), std::string::npos) << run.out;
}

// A copy of fixture `name` to break.
fs::path copy_of(const char* name, const std::string& as) {
  const fs::path d = test::temp_dir("hf_import_" + as);
  fs::copy(fixtures() / name, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

void edit_config(const fs::path& d, const std::function<void(json&)>& edit) {
  json j = json::parse(read_file_text((d / "config.json").string()));
  edit(j);
  write_file_atomic((d / "config.json").string(), j.dump(2));
}

// The load fails with one line holding `want`; generate and info say the same line, exit 2 and print nothing.
void expect_refused(const fs::path& d, const std::string& want) {
  const std::string msg = error_of([&] { load_checkpoint_model(d.string()); });
  EXPECT_NE(msg.find(want), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(error_of([&] { check_checkpoint_model(d.string()); }), msg);
  const std::vector<std::string> before = test::names_in(d);
  for (const char* cmd : {"generate --greedy --prompt 0 --tokens 3", "info"}) {
    const auto run = test::run(std::string(cmd) + " --checkpoint '" + d.string() + "'");
    EXPECT_EQ(run.code, 2) << cmd;
    EXPECT_EQ(run.out, "") << cmd;
    EXPECT_NE(run.err.find(want), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
  EXPECT_EQ(test::names_in(d), before);
}

TEST(HfImport, RefusesUnsupportedConfigFields) {
  REQUIRE_FIXTURES();
  struct Case {
    const char* dir;
    const char* field;
    json value;
    const char* want;
  };
  const Case cases[] = {
      {"llama", "rope_scaling", {{"type", "linear"}, {"factor", 2.0}}, "config.json: rope_scaling {\""},
      {"llama", "model_type", "mistral", "config.json: model_type 'mistral' is not supported"},
      {"gpt2", "model_type", "gpt_neox", "config.json: model_type 'gpt_neox' is not supported"},
      {"llama", "attention_bias", true, "config.json: attention_bias true is not supported"},
      {"llama", "mlp_bias", true, "config.json: mlp_bias true is not supported"},
      {"llama", "sliding_window", 16, "config.json: sliding_window 16 is not supported"},
      {"llama", "hidden_act", "gelu", "config.json: hidden_act 'gelu' is not supported"},
      {"llama", "head_dim", 16, "config.json: head_dim 16 is not supported"},
      {"gpt2", "activation_function", "relu", "config.json: activation_function 'relu' is not supported"},
      {"llama", "vocab_size", 100,
       "config.json's vocab_size 100 does not match the embedding "
       "model.embed_tokens.weight, which holds 96 token rows"},
      {"gpt2", "vocab_size", 64, "config.json's vocab_size 64 does not match the embedding transformer.wte.weight"},
      {"llama", "intermediate_size", 40,
       "tensor 'model.layers.0.mlp.gate_proj.weight' has shape (48, 32), the "
       "model expects (40, 32)"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    const fs::path d = copy_of(c.dir, std::to_string(i++));
    edit_config(d, [&](json& j) { j[c.field] = c.value; });
    expect_refused(d, c.want);
    fs::remove_all(d);
  }
}

TEST(HfImport, RefusesBrokenTensors) {
  REQUIRE_FIXTURES();
  {
    SCOPED_TRACE("missing");
    const fs::path d = copy_of("llama", "missing");
    edit_safetensors_header(d / "model.safetensors", [](json& h) { h.erase("model.layers.1.mlp.down_proj.weight"); });
    expect_refused(d, ": missing tensor 'model.layers.1.mlp.down_proj.weight'; its config.json needs 21 tensors");
    fs::remove_all(d);
  }
  {
    SCOPED_TRACE("unknown dtype");
    const fs::path d = copy_of("gpt2", "dtype");
    edit_safetensors_header(d / "model.safetensors", [](json& h) { h["transformer.ln_f.bias"]["dtype"] = "F8_E5M2"; });
    expect_refused(d, "tensor 'transformer.ln_f.bias': unsupported dtype 'F8_E5M2'");
    fs::remove_all(d);
  }
  {
    SCOPED_TRACE("integer dtype");
    const fs::path d = copy_of("gpt2", "int");
    edit_safetensors_header(d / "model.safetensors", [](json& h) { h["transformer.ln_f.bias"]["dtype"] = "I32"; });
    expect_refused(d, "tensor 'transformer.ln_f.bias' has dtype I32, expected a float");
    fs::remove_all(d);
  }
  {
    // A Llama file with a bias, which its layout has none of (a Qwen2-style attention bias, say).
    SCOPED_TRACE("bias");
    const fs::path d = copy_of("llama", "bias");
    const SafetensorsFile st = SafetensorsFile::load((fixtures() / "llama" / "model.safetensors").string());
    std::vector<std::vector<float>> data;
    data.reserve(st.size() + 1);
    SafetensorsWriter w;
    for (const std::string& name : st.names()) {
      data.emplace_back(st.entry(name).numel());
      st.read_f32(name, st.entry(name).shape, data.back().data());
      w.add(name, DType::F32, st.entry(name).shape, data.back().data());
    }
    data.emplace_back(32, 0.0f);
    w.add("model.layers.0.self_attn.q_proj.bias", DType::F32, {32}, data.back().data());
    w.set_metadata("format", "pt");
    w.write((d / "model.safetensors").string());
    expect_refused(d,
                   "tensor 'model.layers.0.self_attn.q_proj.bias' is not one of the model's 21 that its "
                   "config.json describes (a bias, which the Llama layout has none of)");
    fs::remove_all(d);
  }
  {
    SCOPED_TRACE("missing shard");
    const fs::path d = copy_of("llama-sharded", "shard");
    fs::remove(d / "model-00002-of-00005.safetensors");
    expect_refused(d, ": model.safetensors.index.json names shard model-00002-of-00005.safetensors (for tensor '");
    fs::remove_all(d);
  }
}

// A directory that is neither tessera's checkpoint nor Hugging Face's keeps the messages it had.
TEST(HfImport, OtherDirectoriesKeepTheirMessages) {
  REQUIRE_FIXTURES();
  const fs::path d = copy_of("gpt2", "neither");
  fs::remove(d / "config.json");
  EXPECT_NE(error_of([&] { load_checkpoint_model(d.string()); }).find("header has no tessera_config metadata"),
            std::string::npos);
  fs::remove(d / "model.safetensors");
  EXPECT_NE(error_of([&] { load_checkpoint_model(d.string()); }).find("holds no model.safetensors"), std::string::npos);
  fs::remove_all(d);
}

// train --init-from: the first step's loss is the one transformers computes on the same batch with the same
// weights (a fresh optimizer changes nothing before the first update). The shard holds exactly one batch of 2 x 8
// (and its last target), so the batch is the one refs.json's loss was computed on.
TEST(HfImport, TrainInitFromStartsAtTransformersLoss) {
  REQUIRE_FIXTURES();
  for (const char* name : {"gpt2", "gpt2-bare"}) {
    SCOPED_TRACE(name);
    const fs::path src = fixtures() / name;
    const json r = refs_of(src);
    const fs::path work = test::temp_dir(std::string("hf_init_from_") + name);
    std::vector<uint16_t> tokens;
    for (int t : r["tokens"]) tokens.push_back(static_cast<uint16_t>(t));
    ASSERT_EQ(tokens.size(), 17u);
    fs::create_directories(work / "data");
    write_shard((work / "data" / "train_000000.bin").string(), tokens);
    const auto run = test::run("train --init-from '" + src.string() + "' --data '" + (work / "data").string() +
                               "' --out '" + (work / "run").string() +
                               "' --steps 1 --batch 2 --seq 8 --device cpu "
                               "--sample-tokens 0 --no-progress");
    ASSERT_EQ(run.code, 0) << run.err;
    const std::string metrics = read_file_text((work / "run" / "metrics.jsonl").string());
    const json first = json::parse(metrics.substr(0, metrics.find('\n')));
    ASSERT_EQ(first["step"], 1);
    EXPECT_NEAR(first["loss"].get<double>(), r["loss"].get<double>(), 1e-5 * r["loss"].get<double>());
    // A new run: its checkpoint is at step 1, and it loads as tessera's own (GPT-2-named) checkpoint.
    EXPECT_EQ(load_train_state((work / "run" / "checkpoint").string(),
                               *load_checkpoint_model((work / "run" / "checkpoint").string()))
                  .step,
              1);
    fs::remove_all(work);
  }
}

TEST(HfImport, TrainInitFromRefusals) {
  REQUIRE_FIXTURES();
  const std::string gpt2 = (fixtures() / "gpt2").string();
  const fs::path work = test::temp_dir("hf_init_from_bad");
  struct Case {
    std::string args, want;
  };
  const Case cases[] = {
      {"--init-from '" + gpt2 + "' --d-model 64 --out x", "--d-model cannot be combined with --init-from"},
      {"--init-from '" + gpt2 + "' --preset tiny --out x", "--preset cannot be combined with --init-from"},
      {"--init-from '" + gpt2 + "'", "--init-from starts a new run: give it an output directory with --out DIR"},
      {"--init-from '" + gpt2 + "' --resume '" + gpt2 + "' --out x", "give one of them"},
      {"--init-from '" + (work / "nothing").string() + "' --out x", "does not exist"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const auto run = test::run("train " + c.args + " --steps 1 --no-progress", work);
    EXPECT_EQ(run.code, 2);
    EXPECT_NE(run.err.find(c.want), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_FALSE(fs::exists(work / "x"));
  }
  fs::remove_all(work);
}

}  // namespace
}  // namespace tessera
