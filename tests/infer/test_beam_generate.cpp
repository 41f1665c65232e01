// Beam search through the inference engine (infer/beam_generate.h) on the CPU in f32:
// - equal to a brute-force beam search written plainly here over full forwards (no cache: every beam's whole
//   sequence runs through Model::forward each step), on tiny GPT-2 and Llama-GQA models of 11 tokens, for K 1 and 3,
//   length penalty 0, 1, 2, early stopping true / false / "never", an EOS that ends some hypotheses, and two prompts
//   of unequal lengths in one batch, shortest first (the engine runs them longest first);
// - a batch of unequal prompts equals each prompt alone;
// - step 0 expands beam 0 only: one step returns the K best distinct first tokens with their log-probs;
// - equal to Hugging Face generate(num_beams=4) (tests/oracle/hf_beam_generate.py) on the GPT-2 and the Llama with
//   grouped KV heads that save_pretrained wrote (tests/oracle/hf_fixtures.py), loaded by train/hf_import: tokens,
//   and scores to 1e-4, for length penalty 1 and 0.5, early stopping true and false, 2 return sequences, with EOS
//   ids that end returned hypotheses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/infer/beam_generate.h"
#include "tessera/models/gpt.h"
#include "tessera/train/checkpoint.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using beam::EarlyStopping;

constexpr int kV = 11;
// Where two quantities whose order decides the search lie closer than this, the f32 rounding of the engine (the
// cache's grouping, f32 running sums) may order them otherwise than the f64 brute force: such a case is skipped.
constexpr double kTieGap = 1e-4;

ModelConfig gpt2_tiny() {
  return test::small_config(kV, /*d_model=*/16, /*n_layers=*/2, /*n_heads=*/2, /*d_ff=*/24, 24);
}
ModelConfig llama_tiny() {
  ModelConfig c = llama_style(test::small_config(kV, /*d_model=*/16, /*n_layers=*/2, /*n_heads=*/4, /*d_ff=*/20, 24));
  c.n_kv_heads = 2;
  return c;
}

// Weights larger than the 0.02 initialisation, so that the logits differ clearly across tokens and positions.
void init(Model& m, uint64_t seed) {
  m.init_weights(seed);
  std::vector<float> w = m.params().read_f32(m.context());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  for (float& x : w) x += x == 0.0f ? 0.0f : d(rng);
  m.params().write_f32(w, m.context());
}

// log_softmax of the last position's logits, from a full forward over seq, in f64.
std::vector<double> log_probs(Model& m, const std::vector<int32_t>& seq) {
  const int T = static_cast<int>(seq.size());
  m.forward(seq.data(), nullptr, 1, T, {});
  const std::vector<float> z = m.read_logits_row(T - 1);
  const int V = m.config().vocab;
  double mx = -INFINITY, s = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, double(z[v]));
  for (int v = 0; v < V; ++v) s += std::exp(z[v] - mx);
  std::vector<double> out(static_cast<size_t>(V));
  for (int v = 0; v < V; ++v) out[v] = z[v] - (mx + std::log(s));
  return out;
}

// The narrowest gap between two finite quantities whose order decides the search.
struct Gap {
  double min = INFINITY;
  void see(double a, double b) {
    if (std::isfinite(a) && std::isfinite(b)) min = std::min(min, std::abs(a - b));
  }
};

struct Hyp {
  std::vector<int32_t> tokens;
  double score;
};

// Hugging Face's beam search for one prompt (transformers 4.44's BeamSearchScorer and BeamHypotheses), plainly:
// every extension of every live beam enumerated from a full forward and sorted; the best num_return_sequences
// hypotheses, best first.
std::vector<Hyp> brute_force(Model& m, const std::vector<int32_t>& prompt, const BeamSearchOptions& o, Gap& gap) {
  const int K = o.beams, V = m.config().vocab;
  const double lp = o.length_penalty;
  struct Beam {
    std::vector<int32_t> tokens;
    double score;
  };
  std::vector<Beam> beams(static_cast<size_t>(K), Beam{{}, -INFINITY});
  beams[0].score = 0;  // the others start at -inf: only beam 0 expands at step 0
  std::vector<Hyp> hyps;
  double worst = 1e9;
  auto add = [&](std::vector<int32_t> tokens, double sum, int len) {
    const double score = sum / std::pow(static_cast<double>(len), lp);
    if (static_cast<int>(hyps.size()) >= K) gap.see(score, worst);
    if (!(static_cast<int>(hyps.size()) < K || score > worst)) return;
    hyps.push_back({std::move(tokens), score});
    if (static_cast<int>(hyps.size()) > K) {
      std::vector<std::pair<double, int>> sorted;
      for (int i = 0; i < static_cast<int>(hyps.size()); ++i) sorted.push_back({hyps[i].score, i});
      std::sort(sorted.begin(), sorted.end());
      gap.see(sorted[0].first, sorted[1].first);
      hyps.erase(hyps.begin() + sorted[0].second);
      worst = sorted[1].first;
    } else {
      worst = std::min(score, worst);
    }
  };
  bool done = false;
  for (int t = 0; t < o.max_new_tokens && !done; ++t) {
    std::vector<std::pair<double, int>> cands;  // (-score, beam * V + token): ascending = best first, ties lowest index
    for (int i = 0; i < K; ++i) {
      if (!std::isfinite(beams[i].score)) continue;
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), beams[i].tokens.begin(), beams[i].tokens.end());
      const std::vector<double> lsm = log_probs(m, seq);
      for (int v = 0; v < V; ++v) cands.push_back({-(beams[i].score + lsm[v]), i * V + v});
    }
    std::sort(cands.begin(), cands.end());
    for (size_t i = 0; i + 1 < cands.size() && i < static_cast<size_t>(2 * K); ++i)
      gap.see(cands[i].first, cands[i + 1].first);
    cands.resize(std::min<size_t>(cands.size(), 2 * K));
    std::vector<Beam> next;
    for (int rank = 0; rank < static_cast<int>(cands.size()) && static_cast<int>(next.size()) < K; ++rank) {
      const int beam = cands[rank].second / V, token = cands[rank].second % V;
      const double score = -cands[rank].first;
      std::vector<int32_t> tokens = beams[beam].tokens;
      tokens.push_back(token);
      if (token == o.eos_id) {
        if (rank < K) add(tokens, score, t + 1);
      } else {
        next.push_back({tokens, score});
      }
    }
    while (static_cast<int>(next.size()) < K) next.push_back({{}, -INFINITY});
    // HF's is_done at cur_len = t + 1.
    const double best = -cands[0].first;
    if (static_cast<int>(hyps.size()) >= K) {
      if (o.early_stopping == EarlyStopping::True) {
        done = true;
      } else {
        const int len = o.early_stopping == EarlyStopping::Never && lp > 0 ? o.max_new_tokens : t + 1;
        const double bound = best / std::pow(static_cast<double>(len), lp);
        gap.see(worst, bound);
        done = worst >= bound;
      }
    }
    beams = next;
  }
  if (!done)
    for (const Beam& bm : beams) add(bm.tokens, bm.score, o.max_new_tokens);
  std::stable_sort(hyps.begin(), hyps.end(), [](const Hyp& a, const Hyp& b) { return a.score < b.score; });
  for (size_t i = 0; i + 1 < hyps.size(); ++i) gap.see(hyps[i].score, hyps[i + 1].score);
  std::vector<Hyp> out;
  for (int j = 0; j < o.num_return_sequences && !hyps.empty(); ++j) {
    out.push_back(hyps.back());
    hyps.pop_back();
  }
  return out;
}

TEST(BeamGenerate, EqualsBruteForceOverFullForwards) {
  std::mt19937_64 rng(test::test_seed());
  int compared = 0, skipped = 0, eos_ended = 0, hyps_seen = 0;
  for (const ModelConfig& cfg : {gpt2_tiny(), llama_tiny()}) {
    Gpt model(cfg);
    init(model, rng());
    for (int K : {1, 3})
      for (float lp : {0.0f, 1.0f, 2.0f})
        for (EarlyStopping es : {EarlyStopping::False, EarlyStopping::True, EarlyStopping::Never}) {
          // Shortest first: the engine runs them longest first, and the results come back in this order.
          const std::vector<std::vector<int32_t>> prompts = {test::randint(2, kV, rng), test::randint(5, kV, rng)};
          const int eos = 1 + static_cast<int>(rng() % (kV - 1));
          const BeamSearchOptions o{.beams = K,
                                    .max_new_tokens = 6,
                                    .eos_id = eos,
                                    .length_penalty = lp,
                                    .early_stopping = es,
                                    .num_return_sequences = K};
          // A cache of exactly the positions the search needs: the longest prompt + max_new_tokens - 1.
          Engine eng(model, {.batch = 2, .beams = K, .max_prompt = 5, .max_seq = 5 + o.max_new_tokens - 1});
          const auto got = beam_generate(eng, prompts, o);
          ASSERT_EQ(got.size(), 2u);
          for (int b = 0; b < 2; ++b) {
            SCOPED_TRACE(std::string(cfg.norm == NormKind::RmsNorm ? "llama" : "gpt2") + " K " + std::to_string(K) +
                         " lp " + std::to_string(lp) + " early_stopping " + std::to_string(static_cast<int>(es)) +
                         " entry " + std::to_string(b) + " seed " + std::to_string(test::test_seed()));
            Gap gap;
            const auto want = brute_force(model, prompts[b], o, gap);
            if (gap.min < kTieGap) {
              ++skipped;
              continue;
            }
            ++compared;
            ASSERT_EQ(got[b].size(), want.size());
            for (size_t i = 0; i < want.size(); ++i) {
              EXPECT_EQ(got[b][i].tokens, want[i].tokens) << "hypothesis " << i;
              EXPECT_NEAR(got[b][i].score, want[i].score, 1e-4) << "hypothesis " << i;
              eos_ended += !want[i].tokens.empty() && want[i].tokens.back() == eos;
              ++hyps_seen;
            }
          }
        }
  }
  EXPECT_LE(skipped, compared / 4) << "too many near ties: widen the weights";
  // The matrix reaches what it is meant to: hypotheses ended by EOS, and others.
  EXPECT_GT(eos_ended, 0);
  EXPECT_LT(eos_ended, hyps_seen);
}

TEST(BeamGenerate, BatchOfUnequalPromptsEqualsEachAlone) {
  std::mt19937_64 rng(test::test_seed());
  for (const ModelConfig& cfg : {gpt2_tiny(), llama_tiny()}) {
    Gpt model(cfg);
    init(model, rng());
    const std::vector<std::vector<int32_t>> prompts = {test::randint(3, kV, rng), test::randint(7, kV, rng),
                                                       test::randint(1, kV, rng)};
    const BeamSearchOptions o{.beams = 4,
                              .max_new_tokens = 8,
                              .eos_id = static_cast<int>(rng() % kV),
                              .length_penalty = 1.0f,
                              .num_return_sequences = 2};
    Engine batched(model, {.batch = 3, .beams = 4, .max_prompt = 7});
    const auto got = beam_generate(batched, prompts, o);
    ASSERT_EQ(got.size(), 3u);
    for (int b = 0; b < 3; ++b) {
      Engine one(model, {.batch = 1, .beams = 4, .max_prompt = 7});
      const auto alone = beam_generate(one, {prompts[b]}, o);
      ASSERT_EQ(got[b].size(), alone[0].size()) << "prompt " << b;
      for (size_t i = 0; i < alone[0].size(); ++i) {
        EXPECT_EQ(got[b][i].tokens, alone[0][i].tokens) << "prompt " << b << " hypothesis " << i;
        EXPECT_NEAR(got[b][i].score, alone[0][i].score, 1e-5) << "prompt " << b << " hypothesis " << i;
      }
    }
  }
}

// One step from the prompts: only beam 0 expands (the K beams share the prompt, so were all K expanded, each token
// would come K times), so the K hypotheses are the K likeliest distinct first tokens, scored by their log-probs.
TEST(BeamGenerate, OnlyBeamZeroExpandsAtStepZero) {
  std::mt19937_64 rng(test::test_seed());
  Gpt model(llama_tiny());
  init(model, rng());
  const std::vector<std::vector<int32_t>> prompts = {test::randint(2, kV, rng), test::randint(4, kV, rng)};
  const int K = 3;
  Engine eng(model, {.batch = 2, .beams = K, .max_prompt = 4});
  const auto got = beam_generate(eng, prompts, {.beams = K, .max_new_tokens = 1, .num_return_sequences = K});
  for (int b = 0; b < 2; ++b) {
    const std::vector<double> lsm = log_probs(model, prompts[b]);
    std::vector<int> order(kV);
    for (int v = 0; v < kV; ++v) order[v] = v;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return lsm[x] > lsm[y]; });
    ASSERT_EQ(got[b].size(), static_cast<size_t>(K));
    for (int i = 0; i < K; ++i) {
      EXPECT_EQ(got[b][i].tokens, std::vector<int32_t>{order[i]}) << "prompt " << b << " rank " << i;
      EXPECT_NEAR(got[b][i].score, lsm[order[i]], 1e-5) << "prompt " << b << " rank " << i;
    }
  }
}

TEST(BeamGenerate, RefusesWhatItCannotRun) {
  Gpt model(gpt2_tiny());
  init(model, 1);
  Engine eng(model, {.batch = 2, .beams = 2, .max_prompt = 4, .max_seq = 8});
  const std::vector<std::vector<int32_t>> prompts = {{1, 2}, {1, 2, 3, 4}};
  // 4 + 5 - 1 = 8 positions fit; 4 + 6 - 1 do not.
  EXPECT_EQ(test::error_of([&] { beam_generate(eng, prompts, {.beams = 2, .max_new_tokens = 5}); }), "");
  const std::string m = test::error_of([&] { beam_generate(eng, prompts, {.beams = 2, .max_new_tokens = 6}); });
  EXPECT_NE(m.find("prompt 1 has 4 tokens; with --max-new-tokens 6 it needs 9 cache positions"), std::string::npos)
      << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(test::error_of([&] {
              beam_generate(eng, prompts, {.beams = 2, .num_return_sequences = 3});
            }).find("--num-return-sequences"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { beam_generate(eng, {{1}}, {.beams = 2}); }).find("engine of 2 rows"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { beam_generate(eng, prompts, {.beams = 2, .eos_id = kV}); }).find("--eos-id"),
            std::string::npos);
}

// ---- Against Hugging Face ----

// The fixtures of tests/oracle/hf_fixtures.py, written once per version of the script and Python into the
// directory tests/train/test_hf_import.cpp uses (the same name), made whole in a directory of this process and
// renamed into place. "" where the script skips (exit 77: no transformers, and TESSERA_REQUIRE_HF is not 1).
fs::path fixtures() {
  static const fs::path dir = [] {
    const std::string script = std::string(TESSERA_SOURCE_DIR) + "/tests/oracle/hf_fixtures.py";
    Fnv h;
    h.add(read_file_text(script));
    h.add(std::string(TESSERA_PYTHON));
    const fs::path final_dir = fs::temp_directory_path() / ("tessera_hf_fixtures_" + std::to_string(h.h));
    if (fs::is_directory(final_dir)) return final_dir;
    const fs::path tmp = final_dir.string() + ".tmp" + std::to_string(::getpid());
    const std::string cmd = std::string(TESSERA_PYTHON) + " '" + script + "' --out '" + tmp.string() + "' 2>&1";
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

bool require_hf() {
  const char* r = std::getenv("TESSERA_REQUIRE_HF");
  return r && std::string(r) == "1";
}

// HF's results for `spec` (hf_beam_generate.py), one JSON object a case; empty, with the test skipped, where torch
// or transformers is missing (a failure under TESSERA_REQUIRE_HF=1).
std::vector<nlohmann::json> run_hf(const nlohmann::json& spec, const fs::path& work) {
  const fs::path spec_path = work / "spec.json", out = work / "hf.jsonl";
  write_file_atomic(spec_path.string(), spec.dump());
  const std::string cmd = std::string(TESSERA_PYTHON) + " '" + TESSERA_SOURCE_DIR +
                          "/tests/oracle/hf_beam_generate.py' --spec '" + spec_path.string() + "' >'" + out.string() +
                          "' 2>&1";
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const std::string text = read_file_text(out.string());
  std::vector<nlohmann::json> hf;
  if (code == 77) {
    EXPECT_FALSE(require_hf()) << text;
    return hf;
  }
  EXPECT_EQ(code, 0) << text;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') hf.push_back(nlohmann::json::parse(line));
  EXPECT_EQ(hf.size(), spec.size()) << text;
  return hf;
}

TEST(BeamGenerateHf, EqualsTransformersGenerate) {
  if (fixtures().empty()) {
    ASSERT_FALSE(require_hf()) << "TESSERA_REQUIRE_HF=1 but the fixtures were skipped";
    GTEST_SKIP() << "transformers is not installed for " << TESSERA_PYTHON;
  }
  // The EOS ids: tokens that the fixtures' beams reach within 8 steps, so that hypotheses end early, some of them
  // among the returned ones, and early stopping true and false part ways.
  struct Fixture {
    const char* dir;
    std::vector<int> eos;
  };
  const Fixture models[] = {{"gpt2", {23, 31}}, {"llama", {60, 11}}};
  const std::vector<std::vector<int32_t>> prompts = {{48, 49, 50, 51}, {7, 60}};
  struct Case {
    int model;
    BeamSearchOptions o;
  };
  std::vector<Case> cases;  // (model, eos, lp, early stopping true then false), each with every prompt in the spec
  nlohmann::json spec = nlohmann::json::array();
  for (int m = 0; m < 2; ++m)
    for (int eos : models[m].eos)
      for (float lp : {1.0f, 0.5f})
        for (bool es : {true, false}) {
          cases.push_back({m,
                           {.beams = 4,
                            .max_new_tokens = 8,
                            .eos_id = eos,
                            .length_penalty = lp,
                            .early_stopping = es ? EarlyStopping::True : EarlyStopping::False,
                            .num_return_sequences = 2}});
          for (const auto& p : prompts)
            spec.push_back({{"checkpoint", (fixtures() / models[m].dir).string()},
                            {"prompt", p},
                            {"max_new_tokens", 8},
                            {"num_beams", 4},
                            {"length_penalty", lp},
                            {"early_stopping", es},
                            {"num_return_sequences", 2},
                            {"eos", eos}});
        }
  const fs::path work = test::temp_dir("beam_generate_hf");
  const std::vector<nlohmann::json> hf = run_hf(spec, work);
  fs::remove_all(work);
  if (hf.empty() && !HasFailure()) GTEST_SKIP() << "torch or transformers is missing";
  ASSERT_EQ(hf.size(), spec.size());
  for (int m = 0; m < 2; ++m) {
    SCOPED_TRACE(models[m].dir);
    const auto model = load_checkpoint_model((fixtures() / models[m].dir).string());
    int eos_returned = 0, es_differ = 0;
    for (size_t c = 0; c < cases.size(); ++c) {
      if (cases[c].model != m) continue;
      const BeamSearchOptions& o = cases[c].o;
      Engine eng(*model, {.batch = 2, .beams = 4, .max_prompt = 4});
      const auto got = beam_generate(eng, prompts, o);
      for (size_t b = 0; b < prompts.size(); ++b) {
        SCOPED_TRACE("eos " + std::to_string(o.eos_id) + " lp " + std::to_string(o.length_penalty) +
                     " early_stopping " + std::to_string(static_cast<int>(o.early_stopping)) + " prompt " +
                     std::to_string(b));
        const nlohmann::json& want = hf[c * prompts.size() + b];
        ASSERT_EQ(got[b].size(), want["sequences"].size());
        for (size_t j = 0; j < got[b].size(); ++j) {
          const auto tokens = want["sequences"][j].get<std::vector<int32_t>>();
          EXPECT_EQ(got[b][j].tokens, tokens) << "rank " << j;
          EXPECT_NEAR(got[b][j].score, want["scores"][j].get<double>(), 1e-4) << "rank " << j;
          eos_returned += !tokens.empty() && tokens.back() == o.eos_id;
        }
        // Cases come in (early stopping true, false) pairs.
        if (c % 2 == 1) es_differ += want != hf[(c - 1) * prompts.size() + b];
      }
    }
    EXPECT_GT(eos_returned, 0) << "no returned hypothesis ends with EOS: pick other EOS ids";
    EXPECT_GT(es_differ, 0) << "early stopping true and false agree everywhere: pick other EOS ids";
  }
}

}  // namespace
}  // namespace tessera
