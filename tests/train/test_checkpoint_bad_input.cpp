// A checkpoint that lacks something, or holds it as the wrong type, is refused with one line that names what (which
// tensor, which field, which metadata key): never with the JSON library's exception text ("[json.exception.
// type_error.304] cannot use at() with null"), never with a count ("has 15 tensors, the model expects 16"), and
// never read as something else (std::stoll took "3x" as 3).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/safetensors.h"
#include "tessera/train/trainer.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::error_of;

// One line that holds `what`, and none of nlohmann's exception text ("[json.exception.type_error.304] ...").
void expect_named(const std::string& err, const std::string& what) {
  EXPECT_NE(err.find(what), std::string::npos) << "expected '" << what << "' in: " << err;
  EXPECT_EQ(err.find("json.exception"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

// A training checkpoint of a small GPT-2-named model (its embedding is "transformer.wte.weight"), written afresh
// before each edit.
class BadCheckpoint : public ::testing::Test {
 protected:
  fs::path dir, ck;
  std::unique_ptr<Gpt> model;
  void SetUp() override { fresh_checkpoint(); }
  void TearDown() override { fs::remove_all(dir); }
  void fresh_checkpoint() {
    dir = test::temp_dir("bad_ckpt");
    ck = dir / "ck";
    model = std::make_unique<Gpt>(test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2,
                                                     /*d_ff=*/24, /*max_seq=*/16));
    model->init_weights(1);
    TrainOptions o;
    o.model = model->config();
    TrainState s;
    s.step = 3;
    s.adam_m.assign(model->params().size(), 0.0f);
    s.adam_v = s.adam_m;
    s.options_json = train_options_to_json(o).dump();
    save_checkpoint(ck.string(), *model, &s);
  }
  fs::path model_file() const { return ck / "model.safetensors"; }
  fs::path optimizer_file() const { return ck / "optimizer.safetensors"; }
  // The error of loading the model after `edit` of model.safetensors's header.
  std::string model_error(const std::function<void(json&)>& edit) {
    fresh_checkpoint();
    test::edit_safetensors_header(model_file(), edit);
    return error_of([&] { load_checkpoint_model(ck.string()); });
  }
  // The error of loading the training state after `edit` of optimizer.safetensors's header.
  std::string state_error(const std::function<void(json&)>& edit) {
    fresh_checkpoint();
    test::edit_safetensors_header(optimizer_file(), edit);
    return error_of([&] { load_train_state(ck.string(), *model); });
  }
  // The error of resuming (train_setup) after `edit` of the training options saved in optimizer.safetensors.
  std::string resume_error(const std::function<void(json&)>& edit) {
    fresh_checkpoint();
    test::edit_safetensors_header(optimizer_file(), [&](json& h) {
      json o = json::parse(h["__metadata__"]["options"].get<std::string>());
      edit(o);
      h["__metadata__"]["options"] = o.dump();
    });
    TrainOptions o;
    o.resume = ck.string();
    o.steps = 10;
    return error_of([&] { train_setup(o); });
  }
};

constexpr const char* kWte = "transformer.wte.weight";

TEST_F(BadCheckpoint, SafetensorsHeaderNamesTheTensorAndTheField) {
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    expect_named(model_error([&](json& h) { h[kWte].erase(field); }),
                 std::string("tensor '") + kWte + "' has no " + field);
  }
  expect_named(model_error([](json& h) { h[kWte] = nullptr; }),
               std::string("tensor '") + kWte + "' is null, not an object of dtype, shape and data_offsets");
  expect_named(model_error([](json& h) { h[kWte] = 5; }), "is a number, not an object of dtype, shape");
  expect_named(model_error([](json& h) { h[kWte]["dtype"] = 32; }), "has a dtype that is a number, not a string");
  expect_named(model_error([](json& h) { h[kWte]["dtype"] = "F99"; }),
               std::string("tensor '") + kWte + "': unsupported dtype 'F99'");
  expect_named(model_error([](json& h) { h[kWte]["data_offsets"] = {0}; }), "has 1 data_offsets, not two");
  expect_named(model_error([](json& h) { h[kWte]["shape"] = {-1, 16}; }), "has a negative dim");
  // (2^62 + 4096) f32 elements are 2^64 + 16384 bytes: wrapped, the very size of the data (256 x 16 floats).
  expect_named(model_error([](json& h) { h[kWte]["shape"] = {(uint64_t{1} << 62) + 4096}; }),
               "has a shape whose size overflows");
  expect_named(model_error([](json& h) { h["__metadata__"]["format"] = 5; }),
               "metadata 'format' is a number, not a string");
  expect_named(model_error([](json& h) { h["__metadata__"] = json::array({1}); }), "__metadata__ is not a JSON object");
}

TEST_F(BadCheckpoint, ModelFileNamesTheMissingConfigOrTensor) {
  expect_named(model_error([](json& h) { h["__metadata__"].erase("tessera_config"); }),
               "checkpoint " + model_file().string() + ": header has no tessera_config metadata");
  // With its whole metadata gone, this GPT-2-shaped checkpoint is what save_pretrained writes (config.json beside a
  // model file of Hugging Face's names), and loads as such (train/hf_import.h); the model file alone is still named.
  fresh_checkpoint();
  test::edit_safetensors_header(model_file(), [](json& h) { h.erase("__metadata__"); });
  EXPECT_EQ(error_of([&] { load_checkpoint_model(ck.string()); }), "");
  expect_named(error_of([&] { load_checkpoint_model(model_file().string()); }),
               "header has no tessera_config metadata");
  // A tensor the model needs: named, where the count alone ("has 8 tensors, the model expects 9") used to be said.
  const std::string missing = model_error([](json& h) { h.erase(kWte); });
  expect_named(missing, "checkpoint " + model_file().string() + ": missing tensor '" + kWte + "'");
  // Two missing: the first named, the other counted.
  expect_named(model_error([](json& h) {
                 h.erase(kWte);
                 h.erase("transformer.wpe.weight");
               }),
               "(and 1 more)");
  // Renamed: the missing one named first, not the stranger.
  expect_named(model_error([](json& h) {
                 h["bogus"] = h[kWte];
                 h.erase(kWte);
               }),
               std::string("missing tensor '") + kWte + "'");
  // A stranger beside every tensor the model needs (an empty one: a copy over wte's bytes is refused sooner, as
  // two tensors sharing bytes).
  expect_named(model_error([](json& h) {
                 h["bogus"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
               }),
               "tensor 'bogus' is not one of the model's");
  expect_named(model_error([](json& h) { h["bogus"] = h[kWte]; }),
               "tensors 'bogus' and '" + std::string(kWte) + "' overlap in the data");
}

TEST_F(BadCheckpoint, TrainingStateNamesTheMissingOrMalformedKey) {
  for (const char* key : {"step", "rng_seed", "rng_next_stream", "data_pos", "options"}) {
    expect_named(state_error([&](json& h) { h["__metadata__"].erase(key); }),
                 "checkpoint " + optimizer_file().string() + ": optimizer state has no '" + key + "' metadata");
  }
  expect_named(state_error([](json& h) { h["__metadata__"]["step"] = "abc"; }),
               "metadata 'step' is not a whole number: 'abc'");
  // std::stoll read "3x" as 3, and std::stoull "-1" as 2^64 - 1.
  expect_named(state_error([](json& h) { h["__metadata__"]["step"] = "3x"; }),
               "metadata 'step' is not a whole number: '3x'");
  expect_named(state_error([](json& h) { h["__metadata__"]["step"] = "-1"; }), "step -1 is negative");
  expect_named(state_error([](json& h) { h["__metadata__"]["data_pos"] = "-1"; }),
               "metadata 'data_pos' is not a whole number >= 0: '-1'");
  expect_named(state_error([](json& h) { h["__metadata__"]["loss_scale"] = "big"; }),
               "metadata 'loss_scale' is not a number: 'big'");
  // A count of good steps below 0 was loaded as is (only an f16 run's scaler refused it, and no CPU run has one).
  expect_named(state_error([](json& h) {
                 h["__metadata__"]["loss_scale"] = "1024";
                 h["__metadata__"]["loss_scale_good_steps"] = "-3";
               }),
               "checkpoint " + optimizer_file().string() + ": loss_scale_good_steps -3 is negative");
  expect_named(state_error([](json& h) { h.erase("adam.m"); }), "missing tensor 'adam.m'");
  // metrics_from (where the run's own records begin) lies in [1, step + 1]: the checkpoint is at step 3.
  for (const char* from : {"0", "5"})
    expect_named(state_error([&](json& h) { h["__metadata__"]["metrics_from"] = from; }),
                 "checkpoint " + optimizer_file().string() + ": metrics_from " + from + " is not in [1, step + 1 = 4]");
  // Without optimizer_step (written before loss scaling): it is the step.
  fresh_checkpoint();
  test::edit_safetensors_header(optimizer_file(), [](json& h) { h["__metadata__"].erase("optimizer_step"); });
  EXPECT_EQ(load_train_state(ck.string(), *model).optimizer_step, 3);
  // Without metrics_from (written before it was kept): 1, the run's records from its first step.
  test::edit_safetensors_header(optimizer_file(), [](json& h) { h["__metadata__"].erase("metrics_from"); });
  EXPECT_EQ(load_train_state(ck.string(), *model).metrics_from, 1);
}

// The config in the metadata: each field named when missing or of the wrong type.
TEST_F(BadCheckpoint, SavedConfigNamesTheMissingOrMistypedField) {
  const auto config_edit = [&](const std::function<void(json&)>& edit) {
    return model_error([&](json& h) {
      json c = json::parse(h["__metadata__"]["tessera_config"].get<std::string>());
      edit(c);
      h["__metadata__"]["tessera_config"] = c.dump();
    });
  };
  expect_named(config_edit([](json& c) { c.erase("vocab"); }), "config: missing field 'vocab'");
  expect_named(config_edit([](json& c) { c["norm"] = 5; }), "config: field 'norm' must be a string, got 5");
  expect_named(config_edit([](json& c) { c["bias"] = "yes"; }), "config: field 'bias' must be true or false");
  expect_named(config_edit([](json& c) { c["dropout"] = nullptr; }), "config: field 'dropout' must be a number");
  expect_named(config_edit([](json& c) { c = json::array(); }), "config: expected a JSON object");
  // A config without "preset" loads, as "custom" (written before presets were saved).
  EXPECT_EQ(config_edit([](json& c) { c.erase("preset"); }), "");
}

// A config that disagrees with the tensors (a wpe of another max_seq, a transposed GPT-2 fc weight of another d_ff):
// generate refused it as the load found the shape, and info described it as if it were whole. check_checkpoint_model
// says what the load says, without building the model; info says it as its one line, and prints nothing.
TEST_F(BadCheckpoint, InfoChecksTheTensorsAgainstTheConfigAsTheLoadDoes) {
  for (const auto& [field, value] : {std::pair{"max_seq", 8}, std::pair{"d_ff", 32}}) {
    SCOPED_TRACE(field);
    const std::string load = model_error([&](json& h) {
      json c = json::parse(h["__metadata__"]["tessera_config"].get<std::string>());
      c[field] = value;
      h["__metadata__"]["tessera_config"] = c.dump();
    });
    expect_named(load, "the model expects");
    EXPECT_EQ(error_of([&] { check_checkpoint_model(ck.string()); }), load);
    const test::CliRun r = test::run("info --checkpoint " + ck.string());
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "tessera: error: " + load + "\n");
  }
  fresh_checkpoint();  // whole, it passes
  EXPECT_EQ(check_checkpoint_model(ck.string()).d_ff, 24);
}

TEST_F(BadCheckpoint, SavedTrainingOptionsNameTheMissingOrMistypedField) {
  expect_named(resume_error([](json& o) { o.erase("batch"); }),
               "checkpoint " + ck.string() + ": training options: missing field 'batch'");
  expect_named(resume_error([](json& o) { o["batch"] = 2.5; }), "training options: field 'batch' must be an integer");
  expect_named(resume_error([](json& o) { o["seed"] = -1; }), "training options: field 'seed' must be an integer >= 0");
  expect_named(resume_error([](json& o) { o["adam_eps"] = "x"; }),
               "training options: field 'adam_eps' must be a number");
  expect_named(resume_error([](json& o) { o.erase("model"); }), "training options: missing field 'model'");
  // Named apart from a bad tessera_config in model.safetensors, which says "config: missing field ...".
  expect_named(resume_error([](json& o) { o["model"].erase("d_ff"); }),
               "checkpoint " + ck.string() + ": training options: model: missing field 'd_ff'");
  expect_named(resume_error([](json& o) { o["model"] = 5; }), "training options: model: expected a JSON object");
  // A value out of range is the checkpoint's saved option, not a flag (--resume takes no --batch).
  expect_named(resume_error([](json& o) { o["batch"] = 0; }),
               "checkpoint " + ck.string() + ": saved option batch must be positive, got 0");
  expect_named(resume_error([](json& o) { o["lr"] = -1; }), ": saved option lr must be a positive number, got -1");
  // By its key in the checkpoint, not the flag's spelling (min-lr-ratio).
  expect_named(resume_error([](json& o) { o["min_lr_ratio"] = 2; }),
               ": saved option min_lr_ratio must be in [0, 1], got 2");
}

// A checkpoint of an older tessera, written before adam_eps, ckpt_minutes, world_size, data_in_run and
// data_fingerprint were saved in the training options and before optimizer_step and the loss scale were saved
// beside them, resumes with each one's default.
TEST_F(BadCheckpoint, AnOlderCheckpointWithoutTheLaterKeysResumesWithTheirDefaults) {
  const fs::path run = dir / "run", run_ck = run / "checkpoint";
  const test::CliRun first = test::run(test::small_train_args(run, "--stop-after 2"));
  ASSERT_EQ(first.code, 0) << first.err;
  test::edit_safetensors_header(run_ck / "optimizer.safetensors", [](json& h) {
    json& meta = h["__metadata__"];
    json o = json::parse(meta["options"].get<std::string>());
    for (const char* key : {"adam_eps", "ckpt_minutes", "world_size", "data_in_run", "data_fingerprint"}) {
      EXPECT_TRUE(o.contains(key)) << key;
      o.erase(key);
    }
    meta["options"] = o.dump();
    EXPECT_TRUE(meta.contains("optimizer_step"));
    for (const char* key : {"optimizer_step", "loss_scale", "loss_scale_good_steps"}) meta.erase(key);
  });
  TrainOptions o;
  o.resume = run_ck.string();
  o.steps = 4;
  const TrainSetup s = train_setup(o);
  EXPECT_EQ(s.options.adam_eps, 1e-8f);
  EXPECT_EQ(s.options.ckpt_minutes, 10.0);
  EXPECT_EQ(s.options.world_size, 1);
  EXPECT_EQ(s.state.step, 2);
  EXPECT_EQ(s.state.optimizer_step, 2);  // no step was skipped before loss scaling existed
  EXPECT_EQ(s.state.loss_scale, 0);
  EXPECT_EQ(s.state.loss_scale_good_steps, 0);
  const test::CliRun resumed = test::run("train --resume " + run_ck.string() + " --no-progress --sample-tokens 0");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("done: 2 steps"), std::string::npos) << resumed.out;
}

}  // namespace
}  // namespace tessera
