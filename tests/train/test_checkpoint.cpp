#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/models/gpt.h"
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
    EXPECT_EQ(std::memcmp(a.params().host_data<float>(), b->params().host_data<float>(), a.params().size() * 4), 0);
    fs::remove_all(d);
  }
}

// The inference loader (straight into a model without master weights or a CPU copy) gives the training loader's
// weights, bit for bit, and counts the weights that are NaN or infinite.
TEST(Checkpoint, InferenceLoadEqualsTheTrainingLoadAndCountsNonFinite) {
  for (const ModelConfig& cfg : {small(false), small(true)}) {
    const fs::path d = temp_dir("infer_load");
    Gpt a(cfg);
    a.init_weights(test::test_seed());
    save_checkpoint((d / "ck").string(), a, nullptr);
    Context ctx(Device::cpu());
    const InferenceModel b = load_inference_model((d / "ck").string(), ctx, DType::F32);
    EXPECT_EQ(b.non_finite, 0u);
    EXPECT_EQ(b.model->params().read_f32(ctx), a.params().read_f32(a.context()));
    float* w = a.params().host_data<float>();
    w[3] = std::numeric_limits<float>::quiet_NaN();
    w[a.params().size() - 1] = -std::numeric_limits<float>::infinity();
    save_checkpoint((d / "ck").string(), a, nullptr);
    EXPECT_EQ(load_inference_model((d / "ck").string(), ctx, DType::F32).non_finite, 2u);
    fs::remove_all(d);
  }
}

TEST(Checkpoint, Gpt2UsesHuggingFaceNamesAndConv1DLayout) {
  const fs::path d = temp_dir("gpt2");
  ModelConfig c = small(false);
  c.dropout = 0.25f;
  c.attn_dropout = 0.125f;
  Gpt m(c);
  m.init_weights(5);
  save_checkpoint((d / "ck").string(), m, nullptr);
  const auto st = SafetensorsFile::load((d / "ck" / "model.safetensors").string());
  EXPECT_EQ(st.meta("format"), "pt");
  EXPECT_FALSE(st.has("lm_head.weight"));  // tied
  // Every matrix is stored as Conv1D's (in, out), the transpose of ours (out, in); a square one (attn.c_proj) has the
  // right shape either way, so each is checked element by element.
  struct Matrix {
    const char* hf;
    const char* ours;
    int in, out;
  };
  for (const Matrix& x : {Matrix{"transformer.h.1.attn.c_attn.weight", "h.1.qkv.w", 16, 48},
                          Matrix{"transformer.h.1.attn.c_proj.weight", "h.1.proj.w", 16, 16},
                          Matrix{"transformer.h.1.mlp.c_fc.weight", "h.1.fc.w", 16, 24},
                          Matrix{"transformer.h.1.mlp.c_proj.weight", "h.1.fcp.w", 24, 16}}) {
    ASSERT_EQ(st.entry(x.hf).shape, (std::vector<int64_t>{x.in, x.out})) << x.hf;
    const float* hf = reinterpret_cast<const float*>(st.data(x.hf));
    const float* ours = m.params().host_data<float>() + m.params().segments()[m.params().find(x.ours)].offset;
    for (int o = 0; o < x.out; ++o)
      for (int i = 0; i < x.in; ++i) ASSERT_EQ(hf[i * x.out + o], ours[o * x.in + i]) << x.hf;
  }
  const auto cfg = nlohmann::json::parse(read_file_text((d / "ck" / "config.json").string()));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["n_embd"], 16);
  EXPECT_EQ(cfg["resid_pdrop"], 0.25);
  EXPECT_EQ(cfg["embd_pdrop"], 0.25);
  EXPECT_EQ(cfg["attn_pdrop"], 0.125);  // Hugging Face's name for attention dropout
  fs::remove_all(d);
}

TEST(Checkpoint, LlamaSplitsFusedMatrices) {
  const fs::path d = temp_dir("llama");
  ModelConfig c = small(true);
  c.attn_dropout = 0.125f;
  Gpt m(c);
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
  const float* ours = m.params().host_data<float>() + m.params().segments()[m.params().find("h.0.qkv.w")].offset;
  EXPECT_EQ(std::memcmp(k, ours + 16 * 16, 16 * 16 * 4), 0);  // rows [C, 2C) of the fused qkv
  const auto cfg = nlohmann::json::parse(read_file_text((d / "ck" / "config.json").string()));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["intermediate_size"], 24);
  EXPECT_EQ(cfg["attention_dropout"], 0.125);
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
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); })
                .find("outside the file (the file is truncated, or its "
                      "header wrong: its data section holds "),
            std::string::npos);
  // Header length beyond the file: one no writer gives (over safetensors' 100 MB) is corrupt, not a cut-short file.
  auto b2 = bytes;
  b2[5] = 0x7f;
  p = write("len.safetensors", b2);
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); }).find("its header length is corrupt"), std::string::npos);
  // Garbage header.
  auto b3 = bytes;
  b3[8] = '#';
  p = write("json.safetensors", b3);
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); }).find("not valid JSON"), std::string::npos);
  // A data offset that is not an integer (the JSON parser would truncate 0.5 to 0).
  {
    const std::string header = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0.5,4]}})";
    std::vector<uint8_t> b(8 + header.size() + 4, 0);
    b[0] = static_cast<uint8_t>(header.size());
    std::memcpy(b.data() + 8, header.data(), header.size());
    p = write("offset.safetensors", b);
    EXPECT_NE(error_of([&] { SafetensorsFile::load(p); }).find("data_offsets entry that is not an integer: 0.5"),
              std::string::npos);
  }
  // Too short to hold a header length: as a safetensors file, cut short; as the file given for a checkpoint, none.
  p = write("tiny.safetensors", {1, 2, 3});
  EXPECT_NE(error_of([&] { SafetensorsFile::load(p); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { load_checkpoint_model(p); })
                .find("is not a checkpoint: it is a file of 3 bytes that is "
                      "not a safetensors file"),
            std::string::npos);
  // A file for another model: shapes do not match.
  ModelConfig other = small(false);
  other.d_ff = 32;
  Gpt o(other);
  EXPECT_NE(error_of([&] { load_checkpoint_weights(good, o); }).find("has shape"), std::string::npos);
  // Missing optimizer state.
  EXPECT_NE(error_of([&] { load_train_state((d / "ck").string(), m); }).find("no optimizer state"), std::string::npos);
  fs::remove_all(d);
}

// The writer streams each tensor from the caller's buffer when the file is written: no copy is taken at add().
TEST(Safetensors, WriterStreamsFromTheBuffersAndMapsOnLoad) {
  const fs::path d = temp_dir("stwriter");
  std::vector<float> a(1000), b(6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  SafetensorsWriter w;
  w.add("a", DType::F32, {10, 100}, a.data());
  w.add("t", DType::F32, {3, 2}, [&](void* dst) {  // made at write time: the transpose of b viewed as (2, 3)
    float* out = static_cast<float*>(dst);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) out[c * 2 + r] = b[r * 3 + c];
  });
  EXPECT_EQ(w.temp_bytes(), 6u * 4u);
  a[7] = -1.0f;  // changed after add(): the file must hold the buffer as it is at write()
  for (int i = 0; i < 6; ++i) b[i] = static_cast<float>(10 + i);
  w.write((d / "x.safetensors").string());
  const auto st = SafetensorsFile::load((d / "x.safetensors").string());
  std::vector<float> ra(1000), rt(6), back(6);
  st.read_f32("a", {10, 100}, ra.data());
  EXPECT_EQ(ra, a);
  st.read_f32("t", {3, 2}, rt.data());
  EXPECT_EQ(rt, (std::vector<float>{10, 13, 11, 14, 12, 15}));
  st.read_f32_transposed("t", 3, 2, back.data());
  EXPECT_EQ(back, b);
  EXPECT_NE(error_of([&] {
              SafetensorsFile::load((d / "none.safetensors").string());
            }).find("safetensors: cannot read"),
            std::string::npos);
  fs::remove_all(d);
}

// model.safetensors is opened once: the config from its metadata and the weights from the same mapping.
TEST(Checkpoint, LoadModelReadsTheFileOnce) {
  const fs::path d = temp_dir("once");
  Gpt a(small(false));
  a.init_weights(3);
  save_checkpoint((d / "ck").string(), a, nullptr);
  const uint64_t before = SafetensorsFile::load_count();
  auto b = load_checkpoint_model((d / "ck").string());
  EXPECT_EQ(SafetensorsFile::load_count() - before, 1u);
  EXPECT_EQ(std::memcmp(a.params().host_data<float>(), b->params().host_data<float>(), a.params().size() * 4), 0);
  fs::remove_all(d);
}

// checkpoint_save_host_bytes is the one temporary of saving: the largest tensor stored transposed.
TEST(Checkpoint, SaveHostBytesIsTheLargestTransposedTensor) {
  for (const ModelConfig& cfg : {small(false), small(true)}) {
    Gpt m(cfg);
    size_t largest = 0;
    for (const ExportTensor& t : checkpoint_layout(m))
      if (t.transpose) largest = std::max(largest, static_cast<size_t>(t.rows * t.cols) * sizeof(float));
    EXPECT_EQ(checkpoint_save_host_bytes(cfg), largest);
  }
  ModelConfig wide = small(false);
  wide.d_ff = 100;  // fc (100, 16) outgrows qkv (48, 16)
  EXPECT_EQ(checkpoint_save_host_bytes(wide), 100u * 16u * 4u);
  EXPECT_GT(checkpoint_save_host_bytes(small(false)), 0u);
  EXPECT_EQ(checkpoint_save_host_bytes(small(true)), 0u);  // Llama's tensors all stream from the parameters
}

// Runs save_checkpoint in a child process with TESSERA_FAULT_INJECT=`faults`. Returns the signal that killed
// it, or 0 when it finished. (The child only writes files: no OpenMP after fork.)
int save_in_child(const std::string& dir, const Model& model, const TrainState& state, const std::string& faults) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("TESSERA_FAULT_INJECT", faults.c_str(), 1);
    try {
      save_checkpoint(dir, model, &state);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "save_checkpoint failed in the child";
  return 0;
}

TrainState state_at(int64_t step, size_t n) {
  TrainState s;
  s.step = step;
  s.options_json = "{}";
  s.adam_m.assign(n, static_cast<float>(step));
  s.adam_v.assign(n, static_cast<float>(step) / 2);
  return s;
}

// A save whose write fails (here a file-size limit, as a full disk would) throws, leaves no <dir>.tmp behind and
// keeps the previous checkpoint.
TEST(Checkpoint, AFailedWriteLeavesNoTemporaryDirectory) {
  const fs::path d = temp_dir("full");
  const std::string ck = (d / "ck").string();
  Gpt m1(small(false)), m2(small(false));
  m1.init_weights(1);
  m2.init_weights(2);
  const size_t n = m1.params().size();
  const TrainState s1 = state_at(1, n), s2 = state_at(2, n);
  save_checkpoint(ck, m1, &s1);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      save_checkpoint(ck, m2, &s2);
    } catch (const Error&) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "the save past the size limit did not fail with an Error";
  EXPECT_FALSE(fs::exists(d / "ck.tmp")) << "the failed save left its temporary directory";
  auto loaded = load_checkpoint_model(ck);
  EXPECT_EQ(load_train_state(ck, *loaded).step, 1);
  fs::remove_all(d);  // it was left in /tmp after every run
}

// A save killed at any step leaves a checkpoint that loads (the old one or the new one, whole), and the next
// save cleans up after it. With RENAME_EXCHANGE and (ckpt-no-exchange) without.
TEST(Checkpoint, SurvivesACrashAtEveryStepOfSaving) {
  struct Case {
    const char* faults;
    bool killed;
    int64_t loads_step;  // which checkpoint is there after the crash: 1 (the old) or 2 (the new)
  };
  for (const Case& c : {Case{"ckpt-after-write", true, 1}, Case{"ckpt-after-exchange", true, 2},
                        Case{"ckpt-no-exchange,ckpt-after-move-old", true, 1}, Case{"ckpt-no-exchange", false, 2}}) {
    SCOPED_TRACE(c.faults);
    const fs::path d = temp_dir("crash");
    const std::string ck = (d / "ck").string();
    Gpt m1(small(false)), m2(small(false)), m3(small(false));
    m1.init_weights(1);
    m2.init_weights(2);
    m3.init_weights(3);
    const size_t n = m1.params().size();
    const TrainState s1 = state_at(1, n), s2 = state_at(2, n), s3 = state_at(3, n);
    save_checkpoint(ck, m1, &s1);
    EXPECT_EQ(save_in_child(ck, m2, s2, c.faults), c.killed ? SIGKILL : 0);

    const Gpt& expect = c.loads_step == 1 ? m1 : m2;
    auto loaded = load_checkpoint_model(ck);
    EXPECT_EQ(std::memcmp(loaded->params().host_data<float>(), expect.params().host_data<float>(), n * 4), 0);
    const TrainState st = load_train_state(ck, *loaded);
    EXPECT_EQ(st.step, c.loads_step);
    EXPECT_EQ(st.adam_m.back(), static_cast<float>(c.loads_step));

    // The next save, with nothing injected, replaces whatever the crash left.
    save_checkpoint(ck, m3, &s3);
    EXPECT_EQ(load_train_state(ck, *loaded).step, 3);
    EXPECT_FALSE(fs::exists(d / "ck.tmp"));
    EXPECT_FALSE(fs::exists(d / "ck.old"));
    fs::remove_all(d);
  }
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

// The runs the stop-and-resume tests compare: a small model with dropout on `sentence` x 40, prepared under d/data.
TrainOptions small_run(const fs::path& d, const std::string& sentence) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += sentence;
  prepare_text(text, (d / "data").string());
  TrainOptions o;
  o.model = small(false);
  o.model.dropout = 0.1f;
  o.data = (d / "data").string();
  o.batch = 2;
  o.seq = 16;
  o.progress = false;
  return o;
}

// Whether two checkpoints hold the same weights, bit for bit.
bool same_weights(const fs::path& a, const fs::path& b) {
  auto ma = load_checkpoint_model(a.string()), mb = load_checkpoint_model(b.string());
  return ma->params().size() == mb->params().size() &&
         std::memcmp(ma->params().host_data<float>(), mb->params().host_data<float>(), ma->params().size() * 4) == 0;
}

// Resumes the run in `dir` from its checkpoint, to the saved run's step count.
void resume_in(const fs::path& dir, const std::string& device = "") {
  TrainOptions r;
  r.resume = (dir / "checkpoint").string();
  r.out = dir.string();
  r.device = device;
  r.steps = 0;
  r.progress = false;
  train(r);
}

// (step, loss) for each line of a metrics.jsonl, followed by (-step, val_loss) where the line has one.
std::vector<std::pair<int64_t, double>> logged_losses(const fs::path& metrics) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    if (j.contains("val_loss")) out.emplace_back(-j["step"].get<int64_t>(), j["val_loss"].get<double>());
  }
  return out;
}

// Stopping and resuming gives the same losses, bit for bit, as one uninterrupted run; with dropout, label
// smoothing and gradient accumulation so the RNG, optimizer and data position must all be restored.
TEST(Trainer, ResumeIsBitExact) {
  const fs::path d = temp_dir("resume");
  TrainOptions o = small_run(d, "the quick brown fox jumps over the lazy dog. ");
  o.accum = 2;
  o.label_smoothing = 0.1f;
  o.warmup = 2;
  o.val_every = 3;
  o.steps = 6;
  o.out = (d / "full").string();
  train(o);
  o.stop_after = 2;  // interrupted after step 2 of 6: no validation step, and the stop must add none
  o.out = (d / "split").string();
  train(o);
  resume_in(d / "split");  // to the saved run's 6 steps
  const auto a = logged_losses(d / "full" / "metrics.jsonl"), b = logged_losses(d / "split" / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second, b[i].second) << "step " << a[i].first;  // bit for bit
  }
  EXPECT_LT(a.back().second, a.front().second);                                      // and it learns
  EXPECT_TRUE(same_weights(d / "full" / "checkpoint", d / "split" / "checkpoint"));  // the final weights agree too
  fs::remove_all(d);
}

// A stop seen between the micro-batches of a step abandons it (a long --accum step held SIGTERM up): the checkpoint
// is the last whole step's, here the initial state, and the resumed run's losses and weights are an uninterrupted
// run's, bit for bit, so the abandoned micro-batch's RNG draws and data were given back.
TEST(Trainer, AStopBetweenMicroBatchesAbandonsTheStepAndResumesBitExact) {
  const fs::path d = temp_dir("abandon");
  TrainOptions o = small_run(d, "the quick brown fox jumps over the lazy dog. ");
  o.accum = 3;
  o.val_every = 0;
  o.steps = 3;
  o.device = "cpu";  // a GPU step runs as a CUDA graph, whole: a stop is seen between steps there
  o.out = (d / "full").string();
  train(o);
  o.out = (d / "split").string();
  volatile std::sig_atomic_t stop = 0;
  TrainControl c;
  c.stop = &stop;
  c.on_start = [&](size_t, size_t) { stop = 1; };  // pending from the first micro-batch on
  const TrainResult r = train(train_setup(o), c);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps, 0);
  EXPECT_EQ(r.last_step, 0);
  EXPECT_EQ(fs::file_size(d / "split" / "metrics.jsonl"), 0u);
  resume_in(d / "split", "cpu");  // to the saved run's 3 steps
  const auto full = logged_losses(d / "full" / "metrics.jsonl");
  ASSERT_FALSE(full.empty());
  EXPECT_EQ(full, logged_losses(d / "split" / "metrics.jsonl"));  // bit for bit, the final validation's too
  EXPECT_TRUE(same_weights(d / "full" / "checkpoint", d / "split" / "checkpoint"));
  fs::remove_all(d);
}

// A branch (--resume A/checkpoint --out B) stopped in its first step leaves B a checkpoint at the branch point and no
// metrics. Resumed in place, B warned "no record of steps 1 to 2 (the file is empty)": steps it never had. B's
// checkpoint records where its own records begin (metrics_from), and a later deletion of them is still said.
TEST(Trainer, ABranchStoppedInItsFirstStepIsMissingNoRecords) {
  const fs::path d = temp_dir("branchstop");
  TrainOptions o = small_run(d, "sphinx of black quartz, judge my vow. ");
  o.accum = 2;
  o.val_every = 0;
  o.steps = 4;
  o.stop_after = 2;
  o.device = "cpu";  // a stop between micro-batches (a GPU step is one CUDA graph)
  o.out = (d / "a").string();
  train(o);
  TrainOptions b;
  b.resume = (d / "a" / "checkpoint").string();
  b.out = (d / "b").string();
  b.device = "cpu";
  b.steps = 0;  // the saved run's 4
  b.progress = false;
  volatile std::sig_atomic_t stop = 0;
  TrainControl c;
  c.stop = &stop;
  c.on_start = [&](size_t, size_t) { stop = 1; };
  ASSERT_TRUE(train(train_setup(b), c).interrupted);
  ASSERT_EQ(fs::file_size(d / "b" / "metrics.jsonl"), 0u);
  const auto metrics_from = [&] {
    auto m = load_checkpoint_model((d / "b" / "checkpoint").string());
    return load_train_state((d / "b" / "checkpoint").string(), *m).metrics_from;
  };
  EXPECT_EQ(metrics_from(), 3);
  testing::internal::CaptureStderr();
  resume_in(d / "b", "cpu");  // steps 3 and 4
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  std::vector<int64_t> steps;
  for (const auto& [step, loss] : logged_losses(d / "b" / "metrics.jsonl"))
    if (step > 0) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(metrics_from(), 3);  // kept by the resume in place
  fs::remove(d / "b" / "metrics.jsonl");
  TrainOptions more;
  more.resume = (d / "b" / "checkpoint").string();
  more.out = (d / "b").string();
  more.device = "cpu";
  more.steps = 5;
  more.progress = false;
  testing::internal::CaptureStderr();
  train(more);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "tessera: warning: " + (d / "b" / "metrics.jsonl").string() +
                ": no record of steps 3 to 4 (the file is "
                "missing); the resumed run's records follow step 4 without them\n");
  fs::remove_all(d);
}

// A run whose checkpoint save was killed resumes and ends with the same weights as an uninterrupted run: the
// save of step 4 dies right after the swap (the step-4 checkpoint is in place) or, without RENAME_EXCHANGE,
// between its two renames (only the step-3 one, as ck.old, is there to resume from).
TEST(Trainer, ResumesAfterACrashDuringCheckpointing) {
  const fs::path d = temp_dir("crashresume");
  TrainOptions o = small_run(d, "pack my box with five dozen liquor jugs. ");
  o.warmup = 2;
  o.steps = 6;
  o.out = (d / "full").string();
  train(o);
  o.stop_after = 4;
  o.out = (d / "four").string();
  train(o);
  const std::string four = (d / "four" / "checkpoint").string();
  auto m4 = load_checkpoint_model(four);
  const TrainState s4 = load_train_state(four, *m4);

  for (const char* faults : {"ckpt-after-exchange", "ckpt-no-exchange,ckpt-after-move-old"}) {
    SCOPED_TRACE(faults);
    const fs::path out = d / "split";
    fs::remove_all(out);
    o.stop_after = 3;
    o.out = out.string();
    train(o);
    const std::string ck = (out / "checkpoint").string();
    ASSERT_EQ(save_in_child(ck, *m4, s4, faults), SIGKILL);
    auto crashed = load_checkpoint_model(ck);
    EXPECT_EQ(load_train_state(ck, *crashed).step, std::string(faults) == "ckpt-after-exchange" ? 4 : 3);
    TrainOptions r;
    r.resume = resolve_checkpoint_dir(ck);
    r.steps = 0;  // the saved run's 6
    r.out = out.string();
    r.progress = false;
    train(r);
    EXPECT_TRUE(same_weights(ck, d / "full" / "checkpoint"));
    auto resumed = load_checkpoint_model(ck);
    EXPECT_EQ(load_train_state(ck, *resumed).step, 6);
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
