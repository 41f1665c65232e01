// End to end through the binary: tokenizer train (512 tokens) on a slice of the bundled corpus, prepare --tokenizer
// on it, train a tiny model a few steps on those shards, generate from its checkpoint through the tokenizer, and the
// checkpoint's tokenizer.json: the same file, loaded by TextCodec (round trips) and by transformers' AutoTokenizer
// (the same ids). Bad input is one line and exit code 2.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <csignal>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "tessera/tokenizer/formats.h"
#include "tessera/tokenizer/text_codec.h"
#include "tessera/train/data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::run;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

void expect_error(const test::CliRun& r, const std::string& what) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A JSON string literal of s (the corpus is ASCII with quotes and newlines).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out + "\"";
}

class PrepareTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::temp_dir("prepare_tokenizer"));
    const std::string corpus = read_file_text(std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt");
    write_text(*dir_ / "slice.txt", corpus.substr(0, 12000));
    // The corpus's fables, one a record (they are parted by blank lines and a title in capitals).
    std::string jsonl;
    for (size_t at = 0, n = 0; at < corpus.size() && n < 40; ++n) {
      const size_t end = std::min(corpus.size(), corpus.find("\n\n\n", at) == std::string::npos
                                                     ? corpus.size()
                                                     : corpus.find("\n\n\n", at) + 3);
      jsonl += "{\"text\": " + json_string(corpus.substr(at, end - at)) + "}\n";
      docs_ += 1;
      at = end;
    }
    write_text(*dir_ / "fables.jsonl", jsonl);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path* dir_;
  static int docs_;
};
fs::path* PrepareTokenizer::dir_ = nullptr;
int PrepareTokenizer::docs_ = 0;

TEST_F(PrepareTokenizer, TrainPrepareTrainCarriesTheTokenizerIntoTheCheckpoint) {
  const fs::path& d = *dir_;
  const test::CliRun t = run("tokenizer train --text " + (d / "slice.txt").string() +
                             " --vocab-size 512 --special "
                             "'<|endoftext|>' --threads 1 --no-progress --out " +
                             (d / "tok").string());
  ASSERT_EQ(t.code, 0) << t.err;
  const std::string data = (d / "data").string();
  const test::CliRun p = run("prepare --tokenizer " + (d / "tok").string() + " --text " +
                             (d / "fables.jsonl").string() + " --threads 2 --no-progress --out " + data);
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("wrote "), std::string::npos) << p.out;
  // The directory names its tokenizer: the trained file, byte for byte. The shards are llm.c's uint16 ones.
  EXPECT_EQ(read_file_text(data + "/tokenizer.json"), read_file_text((d / "tok" / "tokenizer.json").string()));
  std::vector<int32_t> ids = read_shard_tokens(data + "/train_000000.bin", 512);
  const std::vector<int32_t> val = read_shard_tokens(data + "/val_000000.bin", 512);
  EXPECT_FALSE(val.empty());
  ids.insert(ids.end(), val.begin(), val.end());
  const BpeTokenizer tok(read_hf_tokenizer_json(data + "/tokenizer.json"));
  const int32_t eot = tok.special_id("<|endoftext|>");
  ASSERT_GE(eot, 0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), docs_ - 1);  // between the documents only
  // Several files: each .txt one document, a .jsonl's records each one, in the order given.
  const test::CliRun p2 = run("prepare --tokenizer " + (d / "tok").string() + " --text " + (d / "slice.txt").string() +
                              " --text=" + (d / "fables.jsonl").string() + " --text " + (d / "slice.txt").string() +
                              " --no-progress --out " + (d / "data2").string());
  ASSERT_EQ(p2.code, 0) << p2.err;
  std::vector<int32_t> ids2 = read_shard_tokens((d / "data2" / "train_000000.bin").string(), 512);
  const std::vector<int32_t> val2 = read_shard_tokens((d / "data2" / "val_000000.bin").string(), 512);
  EXPECT_EQ(ids2.size() + val2.size(),
            2 * tok.encode(read_file_text((d / "slice.txt").string())).size() + ids.size() + 2);
  EXPECT_EQ(std::count(ids2.begin(), ids2.end(), eot) + std::count(val2.begin(), val2.end(), eot), docs_ + 1);
  // Fewer tokens than bytes: BPE, not bytes. The same shards for one thread.
  EXPECT_LT(ids.size(), fs::file_size(d / "fables.jsonl") / 2);
  const test::CliRun p1 = run("prepare --tokenizer " + (d / "tok" / "tokenizer.json").string() + " --text " +
                              (d / "fables.jsonl").string() + " --threads 1 --no-progress --out " +
                              (d / "data1").string());
  ASSERT_EQ(p1.code, 0) << p1.err;
  for (const char* s : {"/train_000000.bin", "/val_000000.bin"})
    EXPECT_EQ(read_file_text((d / "data1").string() + s), read_file_text(data + s)) << s;

  // A model narrower than the tokenizer is one line, before any step.
  expect_error(run("train --data " + data + " --preset tiny --steps 1 --batch 2 --seq 16 --no-progress --out " +
                   (d / "narrow").string()),
               "was prepared with a tokenizer of 512 tokens (its tokenizer.json), more than the model's vocab of 256: "
               "give --vocab 512 or more");
  const std::string run_dir = (d / "run").string();
  const test::CliRun tr = run("train --data " + data +
                              " --preset tiny --vocab 512 --steps 3 --batch 2 --seq 16 "
                              "--val-every 0 --sample-tokens 0 --no-progress --out " +
                              run_dir);
  ASSERT_EQ(tr.code, 0) << tr.err;
  const std::string ckpt = run_dir + "/checkpoint";
  ASSERT_TRUE(fs::exists(ckpt + "/tokenizer.json"));
  EXPECT_EQ(read_file_text(ckpt + "/tokenizer.json"), read_file_text(data + "/tokenizer.json"));

  // A run --init-from that checkpoint, on data that names no tokenizer (bytes, below 512), carries the checkpoint's.
  ASSERT_EQ(run("prepare --text " + (d / "slice.txt").string() + " --no-progress --out " + (d / "bytes").string()).code,
            0);
  const test::CliRun ft = run("train --init-from " + ckpt + " --data " + (d / "bytes").string() +
                              " --steps 1 --batch 2 "
                              "--seq 16 --val-every 0 --sample-tokens 0 --no-progress --out " +
                              (d / "tuned").string());
  ASSERT_EQ(ft.code, 0) << ft.err;
  EXPECT_EQ(read_file_text((d / "tuned" / "checkpoint" / "tokenizer.json").string()),
            read_file_text(data + "/tokenizer.json"));

  // The codec generate uses, from the checkpoint: BPE, round trips, the tokenizer's ids.
  const TextCodec codec = TextCodec::for_checkpoint(ckpt, 512);
  EXPECT_FALSE(codec.byte_level());
  const std::string sentence = "The Fox and the Grapes: \"I am sure they are sour.\" \xc3\xa9\xe6\x97\xa5!";
  const std::vector<int32_t> enc = codec.encode(sentence);
  EXPECT_EQ(enc, tok.encode(sentence));
  EXPECT_LT(enc.size(), sentence.size());
  EXPECT_EQ(codec.decode(enc), sentence);

  // generate runs on that checkpoint through its tokenizer: the prompt is its BPE ids (fewer than its bytes), the
  // text of a record is the tokenizer's decode of its tokens, and a streamed run prints the prompt and that text.
  const std::string gen = "generate --checkpoint " + ckpt + " --device cpu --greedy --max-new-tokens 12 --prompt ";
  const test::CliRun gj = run(gen + "'The Fox and the' --json --logprobs 1");
  ASSERT_EQ(gj.code, 0) << gj.err;
  const nlohmann::json rec = nlohmann::json::parse(gj.out);
  const std::vector<int32_t> drawn = rec.at("tokens").get<std::vector<int32_t>>();
  EXPECT_EQ(drawn.size(), 12u);
  EXPECT_EQ(rec.at("text").get<std::string>(), codec.decode(drawn));
  EXPECT_EQ(rec.at("logprobs").size(), 12u);
  EXPECT_TRUE(std::any_of(drawn.begin(), drawn.end(), [](int32_t id) { return id >= 256; }))
      << "no merged token drawn: the run does not show BPE decoding";
  const test::CliRun gs = run(gen + "'The Fox and the'");
  ASSERT_EQ(gs.code, 0) << gs.err;
  EXPECT_EQ(gs.out, "The Fox and the" + codec.decode(drawn) + "\n");
  const test::CliRun gb = run(gen + "'The Fox and the' --beams 2 --json");
  ASSERT_EQ(gb.code, 0) << gb.err;
  const nlohmann::json beam = nlohmann::json::parse(gb.out.substr(0, gb.out.find('\n')));
  EXPECT_EQ(beam.at("text").get<std::string>(), codec.decode(beam.at("tokens").get<std::vector<int32_t>>()));

  // transformers loads the checkpoint's tokenizer and encodes the sentence to the same ids.
  write_text(d / "sentence.txt", sentence);
  const std::string py = std::string(TESSERA_PYTHON) +
                         " -c \"import sys; from transformers import AutoTokenizer; "
                         "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
                         "print(' '.join(map(str, t.encode(open(sys.argv[2], encoding='utf-8').read()))))\" " +
                         ckpt + " " + (d / "sentence.txt").string() + " 2>&1";
  std::FILE* pipe = ::popen(py.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (out.find("No module named 'transformers'") != std::string::npos) GTEST_SKIP() << "transformers is not installed";
  ASSERT_EQ(status, 0) << out;
  std::string want;
  for (size_t i = 0; i < enc.size(); ++i) want += (i ? " " : "") + std::to_string(enc[i]);
  EXPECT_EQ(out.substr(out.rfind('\n', out.size() - 2) == std::string::npos ? 0 : out.rfind('\n', out.size() - 2) + 1),
            want + "\n");
}

TEST_F(PrepareTokenizer, BadInputIsOneLine) {
  const fs::path& d = *dir_;
  ASSERT_EQ(run("tokenizer train --text " + (d / "slice.txt").string() +
                " --vocab-size 300 --threads 1 --no-progress "
                "--out " +
                (d / "small").string())
                .code,
            0);
  const std::string tok = (d / "small").string();
  write_text(d / "bad.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two\"\n");
  expect_error(run("prepare --tokenizer " + tok + " --text " + (d / "bad.jsonl").string() + " --out " +
                   (d / "o1").string()),
               (d / "bad.jsonl").string() + ":2: not a JSON object");
  EXPECT_FALSE(fs::exists(d / "o1"));
  expect_error(run("prepare --tokenizer " + tok + " --text " + (d / "fables.jsonl").string() +
                   " --text-field body "
                   "--out " +
                   (d / "o2").string()),
               ":1: the record has no field \"body\" (give the field that holds the text with --text-field)");
  expect_error(run("prepare --text " + (d / "slice.txt").string() + " --threads 2 --out " + (d / "o3").string()),
               "--threads is for a prepare with --tokenizer");
  expect_error(run("prepare --tokenizer " + (d / "nothing").string() + " --text " + (d / "slice.txt").string() +
                   " --out " + (d / "o4").string()),
               "nothing");
  expect_error(run("prepare --text " + (d / "slice.txt").string() + " --text " + (d / "slice.txt").string() +
                   " --out " + (d / "o6").string()),
               "several --text files are for a prepare with --tokenizer");
  // Without <|endoftext|> the documents follow each other: no separator, and the run still trains.
  const test::CliRun p = run("prepare --tokenizer " + tok + " --text " + (d / "fables.jsonl").string() +
                             " --no-progress --out " + (d / "o5").string());
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(read_file_text((d / "o5" / "tokenizer.json").string()), read_file_text(tok + "/tokenizer.json"));
}

// SIGINT while prepare --tokenizer waits for its text (a FIFO with no writer yet): exit 130, and nothing is made.
TEST_F(PrepareTokenizer, InterruptedWaitLeavesNothing) {
  const fs::path& d = *dir_;
  const fs::path fifo = d / "fifo.txt", out = d / "never", err = d / "fifo.err";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(run("tokenizer train --text " + (d / "slice.txt").string() +
                " --vocab-size 300 --special '<|endoftext|>' "
                "--threads 1 --no-progress --out " +
                (d / "tok_fifo").string())
                .code,
            0);
  const std::string script = "'" + test::binary() + "' prepare --tokenizer '" + (d / "tok_fifo").string() +
                             "' --text '" + fifo.string() + "' --out '" + out.string() + "' 2>'" + err.string() +
                             "' & p=$!; sleep 1; kill -INT $p; wait $p; echo $?";
  std::FILE* pipe = ::popen(script.c_str(), "r");  // run by /bin/sh
  ASSERT_NE(pipe, nullptr);
  char buf[64] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, pipe);
  ::pclose(pipe);
  EXPECT_EQ(std::string(buf, n), std::to_string(128 + SIGINT) + "\n");
  EXPECT_EQ(read_file_text(err.string()), "tessera: interrupted: " + out.string() + " left as it was\n");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace tessera
