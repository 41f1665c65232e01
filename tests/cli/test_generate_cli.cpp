// tessera generate's batched CLI: a --prompt-file of unequal prompts prints what each prompt alone prints, --json
// records hold their fields (and the logprobs), --stop cuts, --eos-id ends a sequence, --truncate-prompt keeps the
// last tokens, and every impossible setting is one line with exit code 2.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "tessera/core/file_io.h"
#include "tessera/infer/beam_generate.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::CliRun;
using test::run;

class GenerateCli : public ::testing::Test {
 protected:
  fs::path dir;
  std::string gen;  // "generate --checkpoint DIR --device cpu "
  void SetUp() override {
    dir = test::temp_dir("generate_cli");
    // Weights far larger than the initialisation: the logits differ clearly, so that greedy has no near ties.
    Gpt m(test::small_config(/*vocab=*/256, /*d_model=*/32, /*n_layers=*/2, /*n_heads=*/2, /*d_ff=*/48,
                             /*max_seq=*/32));
    m.init_weights(4);
    std::vector<float> w = m.params().read_f32(m.context());
    for (size_t i = 0; i < w.size(); ++i) w[i] *= 6.0f;
    m.params().write_f32(w, m.context());
    save_checkpoint((dir / "ck").string(), m, nullptr);
    gen = "generate --checkpoint " + (dir / "ck").string() + " --device cpu ";
  }
  void TearDown() override { fs::remove_all(dir); }

  std::string file(const std::string& name, const std::string& text) {
    write_file_atomic((dir / name).string(), text);
    return (dir / name).string();
  }
  static void expect_error(const CliRun& r, const std::string& what) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err, "tessera: error: " + what + "\n");
  }
};

const std::vector<std::string> kPrompts = {"The cat", "A", "Once upon a time there"};

TEST_F(GenerateCli, PromptFileEqualsSingleRuns) {
  std::string expected;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const CliRun one = run(gen + "--greedy --max-new-tokens 9 --prompt '" + kPrompts[i] + "'");
    ASSERT_EQ(one.code, 0) << one.err;
    ASSERT_EQ(one.out.substr(0, kPrompts[i].size()), kPrompts[i]);
    EXPECT_EQ(one.out.size(), kPrompts[i].size() + 9 + 1);
    expected += (i ? "---\n" : "") + one.out;
  }
  const std::string lines = file("p.txt", kPrompts[0] + "\n" + kPrompts[1] + "\r\n\n" + kPrompts[2] + "\n");
  const CliRun batch = run(gen + "--greedy --max-new-tokens 9 --prompt-file " + lines);
  ASSERT_EQ(batch.code, 0) << batch.err;
  EXPECT_EQ(batch.out, expected);
  // In batches of 2 (the last one half full), and as JSONL: the same.
  const CliRun two = run(gen + "--greedy --tokens 9 --batch 2 --prompt-file " + lines);
  EXPECT_EQ(two.out, expected) << two.err;
  std::string jsonl;
  for (const std::string& p : kPrompts) jsonl += nlohmann::json{{"prompt", p}, {"id", 3}}.dump() + "\n";
  const CliRun j = run(gen + "--greedy --max-new-tokens 9 --prompt-file " + file("p.jsonl", jsonl));
  EXPECT_EQ(j.out, expected) << j.err;
  // JSONL found by its first character, whatever the name.
  const CliRun k = run(gen + "--greedy --max-new-tokens 9 --prompt-file " + file("p.in", "  " + jsonl));
  EXPECT_EQ(k.out, expected) << k.err;
}

std::vector<nlohmann::json> records(const std::string& out) {
  std::vector<nlohmann::json> r;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) r.push_back(nlohmann::json::parse(l));
  return r;
}

TEST_F(GenerateCli, JsonRecordsHoldTheirFields) {
  const std::string lines = file("p.txt", kPrompts[0] + "\n" + kPrompts[1] + "\n" + kPrompts[2] + "\n");
  const CliRun r = run(gen + "--greedy --max-new-tokens 7 --json --logprobs 3 --prompt-file " + lines);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto recs = records(r.out);
  ASSERT_EQ(recs.size(), 3u) << r.out;
  for (size_t i = 0; i < recs.size(); ++i) {
    const nlohmann::json& j = recs[i];
    EXPECT_EQ(j["index"], i);
    EXPECT_EQ(j["prompt"], kPrompts[i]);
    EXPECT_EQ(j["finish_reason"], "length");
    const std::vector<int32_t> tokens = j["tokens"].get<std::vector<int32_t>>();
    ASSERT_EQ(tokens.size(), 7u);
    const CliRun one = run(gen + "--greedy --max-new-tokens 7 --prompt '" + kPrompts[i] + "'");
    EXPECT_EQ(kPrompts[i] + byte_decode(tokens) + "\n", one.out);
    ASSERT_EQ(j["logprobs"].size(), 7u);
    for (size_t s = 0; s < 7; ++s) {
      const nlohmann::json& lp = j["logprobs"][s];
      EXPECT_EQ(lp["token"], tokens[s]);
      ASSERT_EQ(lp["top"].size(), 3u);
      EXPECT_EQ(lp["top"][0][0], tokens[s]);  // greedy: the most likely
      EXPECT_EQ(lp["logprob"], lp["top"][0][1]);
      EXPECT_LE(lp["top"][0][1].get<double>(), 0.0);
      EXPECT_GE(lp["top"][0][1].get<double>(), lp["top"][1][1].get<double>());
    }
  }
  // Without --logprobs no "logprobs" field; one prompt gives one record.
  const CliRun one = run(gen + "--greedy --max-new-tokens 2 --json --prompt Hi");
  ASSERT_EQ(one.code, 0) << one.err;
  const auto rec = records(one.out);
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_FALSE(rec[0].contains("logprobs"));
  EXPECT_EQ(rec[0]["prompt"], "Hi");
}

TEST_F(GenerateCli, StopCutsAndEosEnds) {
  const std::string prompt = "The cat";
  const CliRun free = run(gen + "--greedy --max-new-tokens 24 --json --prompt '" + prompt + "'");
  ASSERT_EQ(free.code, 0) << free.err;
  const std::vector<int32_t> tokens = records(free.out)[0]["tokens"].get<std::vector<int32_t>>();
  const std::string text = byte_decode(tokens);
  // A letter or digit of the continuation as the stop string (quoted safely for the shell).
  size_t at = 0;
  while (at < text.size() && !std::isalnum(static_cast<unsigned char>(text[at]))) ++at;
  ASSERT_LT(at, text.size()) << "no letter in the continuation";
  const std::string stop(1, text[at]);
  const CliRun cut =
      run(gen + "--greedy --max-new-tokens 24 --stop zzzq --stop " + stop + " --prompt '" + prompt + "'");
  ASSERT_EQ(cut.code, 0) << cut.err;
  EXPECT_EQ(cut.out, prompt + text.substr(0, text.find(stop)) + "\n");
  const CliRun cut_json =
      run(gen + "--greedy --max-new-tokens 24 --json --stop " + stop + " --prompt '" + prompt + "'");
  const auto rec = records(cut_json.out);
  ASSERT_EQ(rec.size(), 1u) << cut_json.err;
  EXPECT_EQ(rec[0]["finish_reason"], "stop");
  EXPECT_EQ(rec[0]["tokens"].size(), text.find(stop) + 1);
  // The first new token as the EOS id (in a comma list): it ends the sequence at once, and is no text.
  const CliRun eos = run(gen + "--greedy --max-new-tokens 24 --json --eos-id 255," + std::to_string(tokens[0]) +
                         " --prompt '" + prompt + "'");
  const auto e = records(eos.out);
  ASSERT_EQ(e.size(), 1u) << eos.err;
  EXPECT_EQ(e[0]["finish_reason"], "eos");
  EXPECT_EQ(e[0]["tokens"], nlohmann::json::array({tokens[0]}));
  EXPECT_EQ(e[0]["text"], "");
  // --min-new-tokens bans it for the first 3; --ignore-eos ignores it.
  const CliRun late = run(gen + "--greedy --max-new-tokens 24 --json --min-new-tokens 3 --eos-id " +
                          std::to_string(tokens[0]) + " --prompt '" + prompt + "'");
  const auto l = records(late.out);
  ASSERT_EQ(l.size(), 1u) << late.err;
  EXPECT_GE(l[0]["tokens"].size(), 3u);
  EXPECT_NE(l[0]["tokens"][0], tokens[0]);
  const CliRun ign = run(gen + "--greedy --max-new-tokens 24 --json --ignore-eos --eos-id " +
                         std::to_string(tokens[0]) + " --prompt '" + prompt + "'");
  EXPECT_EQ(records(ign.out).at(0)["tokens"], nlohmann::json(tokens)) << ign.err;
}

TEST_F(GenerateCli, TruncatePromptKeepsTheLastTokens) {
  const std::string longer(40, 'x'), last(32, 'x');
  expect_error(run(gen + "--greedy --tokens 3 --prompt " + longer),
               "generate: the prompt has 40 tokens, more than the "
               "model's context of 32 (--truncate-prompt keeps its last 32)");
  const CliRun t = run(gen + "--greedy --tokens 3 --truncate-prompt --prompt " + longer);
  ASSERT_EQ(t.code, 0) << t.err;
  const CliRun l = run(gen + "--greedy --tokens 3 --prompt " + last);
  ASSERT_EQ(l.code, 0) << l.err;
  // A full context takes one new token (its last position read the whole cache).
  EXPECT_EQ(t.out, longer + l.out.substr(last.size()));
  EXPECT_EQ(l.out.size(), last.size() + 1 + 1);
}

TEST_F(GenerateCli, BadInputIsOneLineAndExit2) {
  const std::string empty = file("empty.txt", "\n  \n"), no_prompt = file("n.jsonl", "{\"text\": \"a\"}\n");
  const std::string not_json = file("bad.jsonl", "{\"prompt\": \"a\"}\nnot json\n");
  const std::pair<std::string, std::string> cases[] = {
      {"--top-k -1", "--top-k must be >= 0 (0 = all tokens), got -1"},
      {"--eos-id 300", "--eos-id 300 is outside the model's vocabulary [0, 256)"},
      {"--eos-id 3,,4", "--eos-id '3,,4': an empty item in the list"},
      {"--eos-id x", "--eos-id 'x' is not a token id (an integer >= 0)"},
      {"--min-new-tokens 5 --max-new-tokens 3", "--min-new-tokens 5 is more than --max-new-tokens 3"},
      {"--logit-bias 3", "--logit-bias '3': expected ID:BIAS, a token id and a number"},
      {"--logit-bias 3:abc", "--logit-bias '3:abc': the bias 'abc' is not a number"},
      {"--logit-bias 999:1", "--logit-bias: token id 999 is outside the vocabulary [0, 256)"},
      {"--logit-bias 5:1,5:2", "--logit-bias: token id 5 is listed twice"},
      {"--logit-bias 5:inf", "--logit-bias: the bias of token 5 must be a number below +inf (-inf bans it), got inf"},
      {"--prompt-file " + empty, "--prompt-file " + empty + " holds no prompt"},
      {"--prompt-file " + no_prompt, "--prompt-file " + no_prompt + ": line 1 has no \"prompt\" string"},
      {"--prompt-file " + not_json, "--prompt-file " + not_json + ": line 2 is not a JSON object"},
      {"--prompt-file " + (dir / "none").string(),
       "--prompt-file " + (dir / "none").string() + " does not exist or is not a file"},
      {"--prompt a --prompt-file " + empty, "--prompt and --prompt-file: give one of them"},
      {"--logprobs 3", "--logprobs 3 is printed in the --json records: give --json"},
      {"--logprobs 21 --json", "--logprobs must be in [0, 20], got 21"},
      {"--batch 0", "--batch must be >= 1, got 0"},
      {"--stop ''", "--stop: a stop string must not be empty"},
      {"--greedy --min-p 0.1",
       "--greedy takes the most likely token, and --min-p 0.1 limits what is sampled: give one "
       "of them"},
      {"--min-p 2", "--min-p must be in [0, 1], got 2"},
      {"--repetition-penalty 0", "--repetition-penalty must be > 0 (1 is off), got 0"},
  };
  for (const auto& [args, said] : cases) {
    SCOPED_TRACE(args);
    expect_error(run(gen + args), said);
  }
}

// --beams K: the library's beam_generate on the checkpoint's model, hypothesis for hypothesis, printed per prompt best
// first; the settings beam search cannot take are refused.
TEST_F(GenerateCli, BeamsPrintBeamGeneratesHypotheses) {
  const std::string lines = file("p.txt", kPrompts[0] + "\n" + kPrompts[2] + "\n");
  const CliRun r = run(gen +
                       "--beams 3 --num-return-sequences 2 --max-new-tokens 5 --length-penalty 0.5 "
                       "--early-stopping true --json --prompt-file " +
                       lines);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto recs = records(r.out);
  ASSERT_EQ(recs.size(), 4u) << r.out;
  auto model = load_checkpoint_model((dir / "ck").string());
  Engine engine(*model, {.batch = 2, .beams = 3, .max_prompt = static_cast<int>(kPrompts[2].size())});
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string* p : {&kPrompts[0], &kPrompts[2]})
    prompts.push_back(std::vector<int32_t>(p->begin(), p->end()));
  const auto want = beam_generate(engine, prompts,
                                  {.beams = 3,
                                   .max_new_tokens = 5,
                                   .length_penalty = 0.5f,
                                   .early_stopping = beam::EarlyStopping::True,
                                   .num_return_sequences = 2});
  for (size_t i = 0; i < 4; ++i) {
    const nlohmann::json& j = recs[i];
    const BeamSequence& h = want[i / 2][i % 2];
    EXPECT_EQ(j["index"], i / 2);
    EXPECT_EQ(j["beam"], i % 2);
    EXPECT_EQ(j["prompt"], i < 2 ? kPrompts[0] : kPrompts[2]);
    EXPECT_EQ(j["tokens"], nlohmann::json(h.tokens));
    EXPECT_FLOAT_EQ(j["score"].get<float>(), h.score);
    EXPECT_EQ(j["finish_reason"], "length");
  }
  // Plain: the best hypothesis after its prompt.
  const CliRun plain = run(gen + "--beams 3 --max-new-tokens 5 --length-penalty 0.5 --early-stopping true --prompt '" +
                           kPrompts[0] + "'");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out, kPrompts[0] + byte_decode(want[0][0].tokens) + "\n");
  const std::pair<std::string, std::string> cases[] = {
      {"--beams 2 --temperature 0.8",
       "--beams 2 searches for the most likely sequences, and --temperature 0.8 "
       "samples: give one of them"},
      {"--beams 2 --num-return-sequences 3", "--num-return-sequences 3 must lie in [1, 2] (at most --beams)"},
      {"--beams 40", "--beams must lie in [1, 32], got 40"},
      {"--beams 0", "--beams must be >= 1 (1: sampling or greedy), got 0"},
      {"--length-penalty 2", "--length-penalty applies to beam search: give --beams K with K > 1"},
      {"--beams 2 --early-stopping maybe", "--early-stopping must be true, false or never, got 'maybe'"},
      {"--beams 2 --stop x",
       "--beams 2 does not take --stop (beam search runs on the plain log-probabilities, "
       "without sampling settings or stop strings)"},
      {"--beams 2 --eos-id 1,2", "--beams 2 takes one --eos-id, got 2"},
  };
  for (const auto& [args, said] : cases) {
    SCOPED_TRACE(args);
    expect_error(run(gen + args), said);
  }
  // More beams than the vocab holds tokens.
  Gpt narrow(
      test::small_config(/*vocab=*/8, /*d_model=*/16, /*n_layers=*/1, /*n_heads=*/2, /*d_ff=*/32, /*max_seq=*/16));
  narrow.init_weights(1);
  save_checkpoint((dir / "narrow").string(), narrow, nullptr);
  expect_error(run("generate --device cpu --checkpoint " + (dir / "narrow").string() +
                   " --beams 9 --prompt \"$(printf "
                   "'\\001\\002')\""),
               "--beams 9 exceeds the vocabulary of 8 tokens");
}

// A model the engine does not run (sinusoidal positions) still continues one --prompt through the full-recompute
// generate(); what only the batched loop does is refused, naming why.
TEST_F(GenerateCli, SinusoidalModelsRunOnePromptAlone) {
  ModelConfig c = test::small_config(256, 32, 1, 2, 48, 32);
  c.positions = PositionKind::Sinusoidal;
  Gpt m(c);
  m.init_weights(2);
  save_checkpoint((dir / "sin").string(), m, nullptr);
  const std::string sin = "generate --checkpoint " + (dir / "sin").string() + " --device cpu --greedy --tokens 5 ";
  const CliRun one = run(sin + "--prompt Hi");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(one.out.size(), 2u + 5u + 1u);
  expect_error(run(sin + "--prompt Hi --json"),
               "generate: the inference engine runs learned (GPT-2) or rotary (Llama) "
               "positions, not sinusoidal ones; such a model runs one --prompt with --temperature, --top-k, --top-p, "
               "--seed and --max-new-tokens alone");
}

}  // namespace
}  // namespace tessera
