// What the CLI says and accepts, word for word, where a new user's trial found it wrong.
#include <filesystem>
#include <string>

#include "cli/cli_run.h"
#include "tessera/bench/kernels.h"
#include "tessera/core/file_io.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::CliRun;
using test::run;

class CliMessages : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override { dir = test::temp_dir("cli_messages"); }
  void TearDown() override { fs::remove_all(dir); }

  // A checkpoint of a small random model at dir/ck.
  void save_small_checkpoint() {
    Gpt m(test::small_config(/*vocab=*/256, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/32,
                             /*max_seq=*/16));
    m.init_weights(1);
    save_checkpoint((dir / "ck").string(), m, nullptr);
  }

  // Exit 2 and exactly the line `tessera: error: <what>`.
  static void expect_error(const CliRun& r, const std::string& what) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err, "tessera: error: " + what + "\n");
  }
};

// Argmax (--temperature 0 or --greedy) beside --top-k 0 (all tokens) or --top-p 1 (all the mass) was refused as if
// they limited what is sampled; cuts that do limit it are still refused.
TEST_F(CliMessages, ArgmaxGoesWithCutsThatCutNothing) {
  save_small_checkpoint();
  const std::string gen = "generate --checkpoint ck --tokens 5 ";
  const CliRun greedy = run(gen + "--greedy", dir);
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  for (const char* flags : {"--temperature 0 --top-k 0", "--temperature 0 --top-p 1",
                            "--temperature 0 --top-p 1.0 "
                            "--top-k 0",
                            "--greedy --top-k 0", "--greedy --top-p 1"}) {
    const CliRun r = run(gen + flags, dir);
    EXPECT_EQ(r.code, 0) << flags << ": " << r.err;
    EXPECT_EQ(r.out, greedy.out) << flags;
  }
  expect_error(run(gen + "--temperature 0 --top-k 1", dir),
               "--temperature 0 takes the most likely token, and --top-k 1 limits what is sampled: give one of them");
  expect_error(run(gen + "--greedy --top-p 0.99", dir),
               "--greedy takes the most likely token, and --top-p 0.99 limits what is sampled: give one of them");
}

// A checkpoint whose weights hold a NaN (a diverged run's) printed the prompt, then "sampling: logit 0 is nan":
// it is refused before anything is printed.
TEST_F(CliMessages, GenerateRefusesNonFiniteWeightsBeforePrinting) {
  save_small_checkpoint();
  const std::string file = (dir / "ck" / "model.safetensors").string();
  std::string bytes = read_file_text(file);
  const char nan_f32[4] = {0x00, 0x00, static_cast<char>(0xc0), 0x7f};  // the last weight (f32, little-endian)
  bytes.replace(bytes.size() - 4, 4, nan_f32, 4);
  write_file_atomic(file, bytes);
  const CliRun r = run("generate --checkpoint ck --tokens 5 --prompt x", dir);
  expect_error(r,
               "checkpoint ck: 1 weight of the model is NaN or infinite (the run that wrote it diverged): nothing "
               "to generate from");
  EXPECT_EQ(r.out, "");
}

// "tessera: error: tessera prepare: --out DIR is required" said tessera twice.
TEST_F(CliMessages, PrepareNamesAMissingFlagOnce) {
  write_file_atomic((dir / "t.txt").string(), std::string("some text"));
  expect_error(run("prepare --out d", dir),
               "--text FILE is required (or --source and --target, or --pairs, for paired shards)");
  expect_error(run("prepare --text t.txt", dir), "--out DIR is required");
}

// From a new user's trial:
// - an empty text: train --data read its train split as 2^64 - 1 tokens (size - 1 val byte) and let it through to a
//   "prepare: the text has 0 bytes" that named the other command; it now fails the split's own check, as 1 byte does;
// - a NUL byte was called "not UTF-8" (NUL is UTF-8);
// - info's line on planned gradients said "-128.00 B less" where the plan costs 128 bytes more;
// - a trillion parameters printed as "215780.500B".
TEST_F(CliMessages, TextAndInfoWordsFromATrial) {
  write_file_atomic((dir / "empty.txt").string(), std::string());
  expect_error(run("train --device cpu --no-progress --data empty.txt --out r", dir),
               "data empty.txt: its train split holds 0 tokens, fewer than batch x seq + 1 = 513");
  expect_error(run("prepare --text empty.txt --out d", dir),
               "text empty.txt has 0 bytes; at least 2 are needed (a train token and a val token)");
  write_file_atomic((dir / "nul.txt").string(), std::string("hello\0world", 11));
  expect_error(run("prepare --text nul.txt --out d", dir),
               "text nul.txt is not plain text (a NUL byte at byte 5); tessera prepare tokenizes text files only");
  const CliRun tiny = run("info --d-model 32 --n-layers 1 --batch 1 --seq 1", dir);
  ASSERT_EQ(tiny.code, 0) << tiny.err;
  EXPECT_NE(tiny.out.find("128.00 B more than in a buffer of their own"), std::string::npos) << tiny.out;
  const CliRun huge =
      run("info --vocab 16777216 --d-model 262144 --n-heads 1 --n-layers 512 --d-ff 262144 "
          "--max-seq 1048576 --batch 1 --seq 1",
          dir);
  ASSERT_EQ(huge.code, 0) << huge.err;
  EXPECT_NE(huge.out.find("params     215780499652608 (215.780T)"), std::string::npos) << huge.out;
}

// A count of 1 takes the singular: "wrote 1 train and 1 val tokens", "data parallel over 1 ranks", "the text has 1
// bytes".
TEST_F(CliMessages, ACountOfOneIsSingular) {
  write_file_atomic((dir / "one.txt").string(), std::string("a"));
  expect_error(run("prepare --text one.txt --out d", dir),
               "text one.txt has 1 byte; at least 2 are needed (a train token and a val token)");
  write_file_atomic((dir / "two.txt").string(), std::string("ab"));
  CliRun r = run("prepare --text two.txt --out d", dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote 1 train token and 1 val token to d\n");
  std::string text;
  for (int i = 0; i < 30; ++i) text += "It is easy to despise what you cannot get. ";
  write_file_atomic((dir / "t.txt").string(), text);
  r = run("prepare --text t.txt --out d", dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote 1161 train and 129 val tokens to d\n");  // the counts above 1 read as before

  r = run("info --world 1 --zero 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("data parallel over 1 rank: "), std::string::npos) << r.out;
  r = run("info --world 2 --zero 1");
  EXPECT_NE(r.out.find("data parallel over 2 ranks: "), std::string::npos) << r.out;
  // Without --world, --zero 1 had nothing to shard over and printed one rank's figures as sharded.
  expect_error(run("info --zero 1"),
               "--zero 1 shards the optimizer state over data-parallel ranks: give their "
               "number with --world N");
}

// The bench headers said "1 timed runs" under --iters 1 (--steps 1 for bench model and compare), on stdout and in
// the markdown.
TEST_F(CliMessages, BenchHeadersSayOneTimedRun) {
  const std::string one = " --device cpu --warmup 0 --no-progress ";
  for (const auto& [args, header] :
       {std::pair<std::string, std::string>{"bench kernels --only embedding --iters 1" + one,
                                            "tessera bench kernels on cpu, f32, size small, 0 warm-up + 1 timed "
                                            "run\n"},
        {"bench optimizer --iters 1" + one,
         "tessera bench optimizer on cpu, f32, size small, 0 warm-up + 1 timed "
         "run\n"},
        {"bench attention --iters 1" + one,
         "tessera bench attention on cpu, f32, size small, 0 warm-up + 1 timed "
         "run\n"},
        {"bench model --preset tiny --batch 1 --seq 16 --steps 1" + one,
         "tessera bench model on cpu, f32, batch 1, seq 16, 0 warm-up + 1 timed run per region\n"},
        // No peer to run: a python that fails at once leaves a note, and the tables still come.
        {"bench compare --preset tiny --batch 1 --seq 16 --steps 1" + one,
         "tessera bench compare on cpu, f32, batch 1, seq 16, 0 warm-up + 1 timed run per region\n"}}) {
    const CliRun r = test::run_after("TESSERA_PYTHON=false ", args + "--out " + (dir / "b.md").string());
    ASSERT_EQ(r.code, 0) << args << ": " << r.err;
    EXPECT_TRUE(r.out.starts_with(header)) << r.out;
    EXPECT_NE(read_file_text((dir / "b.md").string()).find(" 0 warm-up + 1 timed run"), std::string::npos) << args;
    EXPECT_EQ(read_file_text((dir / "b.md").string()).find("1 timed runs"), std::string::npos) << args;
  }
}

// --max-memory 0 and --max-memory 99999999999999999999 were told "expects a size such as 512MiB or 2GiB": they are
// sizes, one not positive and one out of range. Text that is no size still gets the example.
TEST_F(CliMessages, MaxMemorySaysWhatIsWrongWithTheSize) {
  for (const char* cmd : {"model", "compare"}) {
    const std::string bench = std::string("bench ") + cmd, run_it = bench + " --device cpu --max-memory ";
    expect_error(run(run_it + "0"), bench + ": --max-memory must be positive, got '0'");
    expect_error(run(run_it + "-5MiB"), bench + ": --max-memory must be positive, got '-5MiB'");
    expect_error(run(run_it + "0.5"), bench + ": --max-memory '0.5' is less than 1 byte");
    expect_error(run(run_it + "99999999999999999999"),
                 bench + ": --max-memory '99999999999999999999' is out of range (more than 1 EB)");
    expect_error(run(run_it + "12XB"), bench + ": --max-memory expects a size such as 512MiB or 2GiB, got '12XB'");
  }
}

// `--steps=` said "a flag is missing its value" without naming it, or, with a flag after it, took that flag as its
// value. It is now the empty value, as `--steps ''` is, and refused as that is.
TEST_F(CliMessages, AnEmptyValueAfterEqualsIsTheEmptyValue) {
  expect_error(run("train --steps=", dir), "train: --steps expects an integer, got ''");
  expect_error(run("train --steps= --out o", dir), "train: --steps expects an integer, got ''");
  EXPECT_FALSE(fs::exists(dir / "o"));
  expect_error(run("info --batch= --seq 8", dir), "info: --batch expects an integer, got ''");
  expect_error(run("generate --checkpoint=", dir), "--checkpoint is empty");
  save_small_checkpoint();
  expect_error(run("generate --checkpoint ck --prompt=", dir), "generate: the prompt is empty");
  expect_error(run("generate --prompt= --checkpoint ck --tokens 3", dir), "generate: the prompt is empty");
}

// The kernels line of `tessera bench --help` lists every family bench kernels runs; swiglu was missing.
TEST_F(CliMessages, BenchHelpListsEveryKernelFamily) {
  const CliRun r = run("bench --help");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.out.find("\n  kernels ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  for (const char* family : kKernelFamilies) EXPECT_NE(line.find(family), std::string::npos) << family << ": " << line;
}

// A model field given as a flag is named as the flag, wherever the message names it (--lr nan said "--lr ...",
// --emb-scale nan "config: emb_scale ..."); a path given as a checkpoint that is none says so first: "cannot read
// DIR/model.safetensors" and "header length 8386653730289748603 exceeds the file size 479" read as faults in a
// checkpoint.
TEST_F(CliMessages, ModelFlagsAndNonCheckpointsAreNamedAsGiven) {
  expect_error(run("info --emb-scale nan"), "--emb-scale must be positive and finite, got nan");
  expect_error(run("train --d-model 30 --n-heads 4 --steps 1 --device cpu --out " + (dir / "o").string()),
               "--d-model 30 is not divisible by --n-heads 4");
  // A check of two fields names the one given as a flag as the flag, the preset's as the field: only the message's
  // first field was renamed, so this said "config: d_model 768 is not divisible by n_heads 5".
  expect_error(run("info --preset gpt2-124m --n-heads 5"), "d_model 768 is not divisible by --n-heads 5");
  expect_error(run("info --padding-id 300"), "--padding-id 300 is outside [-1, vocab)");
  expect_error(run("info --vocab 10 --padding-id 300"), "--padding-id 300 is outside [-1, vocab)");
  // Values and words that spell a field are not fields: they stay as typed.
  expect_error(run("info --norm tied --tied true"), "--norm must be layernorm or rmsnorm, got 'tied'");
  expect_error(run("info --norm x-norm"), "--norm must be layernorm or rmsnorm, got 'x-norm'");
  expect_error(run("info --positions sinusoidal --d-model 33 --n-heads 3"),
               "config: sinusoidal positions need an even d_model, got 33");
  fs::create_directories(dir / "data");
  const std::string data = (dir / "data").string();
  expect_error(run("generate --checkpoint " + data),
               data +
                   " is not a checkpoint: it holds no model.safetensors "
                   "(train writes its checkpoints to OUT/checkpoint and OUT/best)");
  expect_error(run("train --resume " + data), data +
                                                  " is not a checkpoint: it holds no model.safetensors (train "
                                                  "writes its checkpoints to OUT/checkpoint and OUT/best)");
  // A file given as the checkpoint says what a checkpoint is: a 3-byte file said "file is truncated (3 bytes)", a
  // config.json gave the header length its text spells.
  const std::string config = (dir / "config.json").string();
  write_file_atomic(config, std::string("{\"model_type\": \"gpt2\", \"n_embd\": 16}\n"));
  const std::string afile = (dir / "afile").string();
  write_file_atomic(afile, std::string("abc"));
  for (const auto& [file, bytes] : {std::pair{config, "37 bytes"}, std::pair{afile, "3 bytes"}})
    for (const char* command : {"generate", "info"})
      expect_error(
          run(std::string(command) + " --checkpoint " + file),
          file + " is not a checkpoint: it is a file of " + bytes +
              " that is not a safetensors file (a "
              "checkpoint is a directory that train writes, OUT/checkpoint or OUT/best, or the model.safetensors "
              "in one)");
  // A checkpoint's model.safetensors given as the file still loads.
  save_small_checkpoint();
  const CliRun direct = run("generate --tokens 3 --checkpoint " + (dir / "ck" / "model.safetensors").string());
  EXPECT_EQ(direct.code, 0) << direct.err;
  // A real one cut short is said to be truncated.
  save_small_checkpoint();
  const std::string file = (dir / "ck" / "model.safetensors").string();
  write_file_atomic(file, read_file_text(file).substr(0, 200));
  const CliRun cut = run("generate --checkpoint " + (dir / "ck").string());
  EXPECT_TRUE(cut.err.ends_with(" (the file is truncated)\n")) << cut.err;
}

// A file of full length whose header-length prefix is corrupt was said to be truncated: "header length
// 18446744073709551615 exceeds the file size 3342632 (the file is truncated)". A length beyond what any writer gives
// (safetensors' 100 MB) is a corrupt length; one within it, past the end, still reads as a file cut short.
TEST_F(CliMessages, ACorruptHeaderLengthIsNotATruncatedFile) {
  save_small_checkpoint();
  const std::string file = (dir / "ck" / "model.safetensors").string();
  const std::string good = read_file_text(file);
  std::string bytes = good;
  bytes.replace(0, 8, std::string(8, static_cast<char>(0xff)));
  write_file_atomic(file, bytes);
  expect_error(run("generate --checkpoint ck", dir),
               "safetensors: ck/model.safetensors: its header length is corrupt "
               "(the first 8 bytes give 18446744073709551615, beyond the file size " +
                   std::to_string(good.size()) + " and the format's limit of 100000000 bytes)");
  bytes = good;
  const uint64_t past_end = good.size();  // plausible, and 8 bytes past the end of the file
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((past_end >> (8 * i)) & 0xff);
  write_file_atomic(file, bytes);
  expect_error(run("generate --checkpoint ck", dir), "safetensors: ck/model.safetensors: header length " +
                                                         std::to_string(past_end) + " exceeds the file size " +
                                                         std::to_string(good.size()) + " (the file is truncated)");
}

// generate of a model with a vocab narrower than the bytes said "the prompt holds byte 84, outside the model's vocab
// 64" about the default prompt, which the user never gave. It says why there is no text to continue; a prompt of
// bytes the vocab holds still runs.
TEST_F(CliMessages, GenerateOfANarrowVocabSaysWhyNotItsDefaultPrompt) {
  Gpt m(test::small_config(/*vocab=*/64, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/32, /*max_seq=*/16));
  m.init_weights(1);
  const std::string ck = (dir / "narrow").string();
  save_checkpoint(ck, m, nullptr);
  expect_error(run("generate --checkpoint " + ck),
               "checkpoint " + ck +
                   ": the model's vocab of 64 tokens is not the "
                   "byte vocabulary (256), and generate reads and writes byte-level text (a --prompt of bytes below 64 "
                   "can still be given)");
  const CliRun r = run("generate --checkpoint " + ck + " --prompt '!' --tokens 3");
  EXPECT_EQ(r.code, 0) << r.err;
  expect_error(run("generate --checkpoint " + ck + " --prompt T"),
               "the prompt holds byte 84, outside the model's "
               "vocab 64");
}

}  // namespace
}  // namespace tessera
