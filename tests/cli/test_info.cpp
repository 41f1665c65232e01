// `tessera info` prints the activation plan that the model itself lays out: the same peak, sum and biggest live
// set, to the byte, as a Gpt planned for that (B, T).
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "cli/cli_run.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

// The byte count printed on the line that starts with `label` ("planned peak   12.17 GiB (13070959104 bytes)").
size_t bytes_on_line(const std::string& out, const std::string& label) {
  const std::regex re(label + R"( +[0-9.]+ [KMGTP]?i?B \(([0-9]+) bytes\))");
  std::smatch m;
  if (!std::regex_search(out, m, re)) {
    ADD_FAILURE() << "no '" << label << "' line in:\n" << out;
    return 0;
  }
  return std::stoull(m[1].str());
}

TEST(CliInfo, PrintsThePlanTheModelMakes) {
  struct Case {
    const char* args;
    const char* preset;
    int B, T;
    DType dtype;
    GradMemory grads;  // as train plans them: in the arena, unless it accumulates
  };
  for (const Case& c : {Case{"--preset tiny --batch 3 --seq 50", "tiny", 3, 50, DType::F32, GradMemory::Planned},
                        Case{"--preset tiny --batch 3 --seq 50 --accum 2", "tiny", 3, 50, DType::F32, GradMemory::Own},
                        Case{"--preset gpt2-124m --batch 16 --seq 1024 --precision bf16", "gpt2-124m", 16, 1024,
                             DType::BF16, GradMemory::Planned}}) {
    SCOPED_TRACE(c.args);
    const test::CliRun r = test::run(std::string("info ") + c.args);
    ASSERT_EQ(r.code, 0) << r.err;
    const ModelConfig cfg = model_preset(c.preset);
    // The environment's debug settings (TESSERA_PLAN_NO_REUSE) apply to the binary and to the model alike.
    const MemoryPlan plan = Gpt::activation_plan(cfg, c.B, c.T, c.dtype, plan_debug_from_env(), c.grads);
    EXPECT_EQ(r.out.find("activations and grads") != std::string::npos, c.grads == GradMemory::Planned) << r.out;
    EXPECT_EQ(bytes_on_line(r.out, "planned peak"), plan.peak());
    EXPECT_EQ(bytes_on_line(r.out, "sum of buffers"), plan.total());
    EXPECT_EQ(bytes_on_line(r.out, "biggest live set"), plan.max_live().bytes);
    EXPECT_NE(r.out.find("at " + step_event_name(cfg.n_layers, plan.max_live().event) + "\n"), std::string::npos)
        << r.out;
    if (!plan_debug_from_env().no_reuse) {
      EXPECT_LT(plan.peak(), plan.total());
    }
    if (c.dtype == DType::F32) {  // a model planned for the same (B, T) allocates exactly the printed peak
      Gpt model(cfg);
      model.set_grad_memory(c.grads);
      model.reserve(c.B, c.T);
      EXPECT_EQ(bytes_on_line(r.out, "planned peak"), model.activation_peak());
    }
  }
}

TEST(CliInfo, ListsEveryBufferWithItsLife) {
  const test::CliRun r = test::run("info --preset tiny --batch 1 --seq 4 --plan");
  ASSERT_EQ(r.code, 0) << r.err;
  const MemoryPlan plan =
      Gpt::activation_plan(model_preset("tiny"), 1, 4, DType::F32, plan_debug_from_env(), GradMemory::Planned);
  int grad_rows = 0;
  for (const PlanBuffer& b : plan.buffers()) {
    grad_rows += b.fixed;
    std::string pattern(1, '\n');  // built by appending: GCC 12 warns falsely on "literal" + std::string
    pattern.append(std::regex_replace(b.name, std::regex(R"(\.)"), R"(\.)"));
    pattern.append(" +").append(std::to_string(b.offset)).append(" +").append(std::to_string(b.bytes)).append(" ");
    const std::regex row(pattern);
    EXPECT_TRUE(std::regex_search(r.out, row)) << b.name << " missing or wrong in:\n" << r.out;
  }
  EXPECT_EQ(grad_rows, model_preset("tiny").n_layers + 2);  // the gradients' ranges are listed among them
  const test::CliRun bad = test::run("info --precision f8");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("unknown precision 'f8'"), std::string::npos) << bad.err;
}

// --master-weights off drops the f32 master weights from the memory figures and says what that saves: 4 bytes a
// parameter. It applies to 16-bit precisions only.
TEST(CliInfo, MasterWeightsOffSavesFourBytesAParameter) {
  const test::CliRun on = test::run("info --preset tiny --precision bf16");
  const test::CliRun off = test::run("info --preset tiny --precision bf16 --master-weights off");
  ASSERT_EQ(on.code, 0) << on.err;
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_NE(on.out.find("with f32 master weights"), std::string::npos) << on.out;
  EXPECT_NE(on.out.find(", master "), std::string::npos) << on.out;
  EXPECT_EQ(off.out.find("with f32 master weights"), std::string::npos) << off.out;
  EXPECT_EQ(off.out.find(", master "), std::string::npos) << off.out;
  EXPECT_NE(off.out.find("without master weights (saves "), std::string::npos) << off.out;
  const test::CliRun f32 = test::run("info --preset tiny --master-weights off");
  EXPECT_EQ(f32.code, 2);
  EXPECT_NE(f32.err.find("--master-weights off applies to bf16 or f16"), std::string::npos) << f32.err;
  const test::CliRun bad = test::run("info --preset tiny --precision bf16 --master-weights maybe");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--master-weights must be on or off"), std::string::npos) << bad.err;
}

// With --checkpoint the checkpoint fixes the model: a model flag beside it was silently ignored (info printed the
// checkpoint's d_model under --d-model 64); it is refused, as train --resume refuses it.
TEST(CliInfo, ModelFlagsAreRefusedBesideACheckpoint) {
  const std::filesystem::path d = test::temp_dir("info_ckpt");
  ModelConfig cfg = model_preset("tiny");
  cfg.d_model = 32;
  save_checkpoint((d / "ck").string(), Gpt(cfg), nullptr);
  const std::string ck = " --checkpoint " + (d / "ck").string();
  for (const char* flag : {"--d-model 64", "--preset gpt2-124m", "--n-layers 2", "--vocab 300"}) {
    SCOPED_TRACE(flag);
    const test::CliRun r = test::run(std::string("info ") + flag + ck);
    EXPECT_EQ(r.code, 2) << r.out;
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_EQ(r.err, "tessera: error: " + name +
                         " cannot be combined with --checkpoint (the checkpoint fixes the "
                         "model)\n");
    EXPECT_EQ(r.out, "");
  }
  // The flags that are not the model's still apply, and the model is the checkpoint's.
  const test::CliRun ok = test::run("info --batch 2 --seq 8 --precision bf16" + ck);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("d_model 32,"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("batch 2 x seq 8"), std::string::npos) << ok.out;
  const test::CliRun empty = test::run("info --checkpoint ''");
  EXPECT_EQ(empty.err, "tessera: error: --checkpoint is empty\n");
  const test::CliRun missing = test::run("info --checkpoint " + (d / "nope").string());
  EXPECT_EQ(missing.err, "tessera: error: checkpoint " + (d / "nope").string() + " does not exist\n");
  std::filesystem::remove_all(d);
}

// A batch and sequence whose activations pass 1 EiB are refused by name. Their sizes wrapped around 2^64 before:
// info printed a planned peak of 15985868268780333056 bytes for this (and a smaller one for half the batch), and
// train's memory check read such a wrapped figure.
TEST(CliInfo, ActivationsPastOneExbibyteAreRefused) {
  const std::string model =
      "info --vocab 1000000 --d-model 64 --n-layers 1 --n-heads 1 --max-seq 1000000 --seq 1000000";
  const test::CliRun r = test::run(model + " --batch 2147483647");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.err,
            "tessera: error: batch 2147483647 x seq 1000000: the activations need more than 1 EiB (2^60 "
            "bytes) at h.0.ln1; give a smaller batch or sequence\n");
  EXPECT_EQ(r.out, "") << "the config block came before the error";
  // 1024 sequences of a million tokens (about 3.7 PiB) are still planned, and the sum is above the peak.
  const test::CliRun ok = test::run(model + " --batch 1024");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_GT(bytes_on_line(ok.out, "sum of buffers"), bytes_on_line(ok.out, "planned peak"));
}

// The gradients, planned beside the activations (the default: no --accum), count toward the 1 EiB from the start, so
// that a batch whose activations alone would fit, but not with the gradients, gets the same line naming the batch and
// sequence, not MemoryPlan's own "takes the plan past" (which names no flag). Here a sequence's activations (about
// 4.3 GB) are less than the gradients (4.17G params x 4 bytes): the batch just past the largest that fits is in that
// window. The bisection checks the line at every batch refused on the way.
TEST(CliInfo, GradientsCountTowardTheExbibyte) {
  const std::string model =
      "info --vocab 1000000 --d-model 4096 --n-layers 1 --n-heads 32 --max-seq 1000 --seq 1000 --batch ";
  const auto refused_by_name = [](const test::CliRun& r, int64_t batch) {
    return r.err.starts_with("tessera: error: batch " + std::to_string(batch) +
                             " x seq 1000: the activations need more than 1 EiB (2^60 bytes) at ") &&
           r.err.ends_with("; give a smaller batch or sequence\n");
  };
  int64_t lo = 1, hi = 2147483647;  // lo fits, hi is refused
  ASSERT_EQ(test::run(model + std::to_string(lo)).code, 0);
  const test::CliRun top = test::run(model + std::to_string(hi));
  ASSERT_EQ(top.code, 2) << top.out;
  ASSERT_TRUE(refused_by_name(top, hi)) << top.err;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const test::CliRun r = test::run(model + std::to_string(mid));
    if (r.code == 0) {
      lo = mid;
    } else {
      ASSERT_EQ(r.code, 2) << r.out;
      ASSERT_TRUE(refused_by_name(r, mid)) << r.err;
      hi = mid;
    }
  }
  EXPECT_GT(lo, 100000000) << "the bisection should end near 2^60 / 4.3 GB";
}

// The ZeRO-1 chunk is rounded down to whole blocks of 16 parameters, the tail left to the last rank: past 1 block a
// rank every chunk was 0, and info --world 100000 --zero 1 printed "6.37 MiB on each rank (ZeRO-1: 1/100000 of
// 6.37 MiB)"; near that limit the last rank's tail was printed as every rank's share.
TEST(CliInfo, ZeroFiguresFollowTheLayoutAndAWorldBeyondItsBlocksIsRefused) {
  // The default model has 834,304 parameters: 52,144 blocks of 16.
  const test::CliRun over = test::run("info --world 100000 --zero 1");
  EXPECT_EQ(over.code, 2) << over.out;
  EXPECT_EQ(over.err,
            "tessera: error: --world 100000 --zero 1: ZeRO-1 shards the optimizer state in blocks of 16 "
            "parameters, and the model's 834304 make 52144: give at most that many ranks\n");
  EXPECT_EQ(test::run("info --world 52144 --zero 1").code, 0);
  EXPECT_EQ(test::run("info --world 100000").code, 0);  // unsharded: any world
  // The limit is the flat buffers' blocks, train's: 20,020 parameters, padded per segment to 20,128, make 1,258 blocks
  // (counted without the padding, 1,251: info refused 1,252 to 1,258 ranks, which train accepts).
  const std::string padded = "info --d-model 36 --n-heads 2 --d-ff 40 --n-layers 1 --zero 1 --world ";
  EXPECT_EQ(test::run(padded + "1258").code, 0) << test::run(padded + "1258").err;
  EXPECT_NE(test::run(padded + "1259").err.find("the model's 20128 make 1258"), std::string::npos);
  // Parameters and moments are counted as their flat buffers hold them, as the gradients are: 20,128 floats, not
  // 20,020, and one total for the ZeRO share and the unsharded line.
  const test::CliRun four = test::run(padded + "4");
  EXPECT_NE(four.out.find("params 78.62 KiB, AdamW m+v 157.25 KiB,"), std::string::npos) << four.out;
  EXPECT_NE(four.out.find("grads 78.62 KiB"), std::string::npos) << four.out;
  EXPECT_NE(four.out.find("AdamW m+v 39.50 KiB on each rank (ZeRO-1: 1/4 of 157.25 KiB)"), std::string::npos)
      << four.out;
  // 40,000 ranks: one block of 16 each (128 bytes of m and v), and the last rank also the 194,304 left over.
  const test::CliRun near = test::run("info --world 40000 --zero 1");
  ASSERT_EQ(near.code, 0) << near.err;
  EXPECT_NE(near.out.find("data parallel over 40000 ranks: AdamW m+v 128.00 B on each rank, 1.48 MiB on the last "
                          "(ZeRO-1: 6.37 MiB in one block of 16 parameters a rank, and the 194304 left over on the "
                          "last)\n"),
            std::string::npos)
      << near.out;
  // A small world: the tail is noise, and one figure stands for every rank.
  const test::CliRun small = test::run("info --world 8 --zero 1");
  EXPECT_NE(small.out.find("data parallel over 8 ranks: AdamW m+v 814.75 KiB on each rank (ZeRO-1: 1/8 of 6.37 MiB)"),
            std::string::npos)
      << small.out;
}

}  // namespace
}  // namespace tessera
