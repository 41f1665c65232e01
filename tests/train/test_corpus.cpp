// prepare --tokenizer's library side: version-2 (uint32) shards beside llm.c's uint16 ones, the token split against
// the byte split it copies, and the corpus encoder (train/corpus.h) against one serial encode of the whole text.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/bpe_train.h"
#include "tessera/train/corpus.h"
#include "tessera/train/data.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::temp_dir;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::string corpus_text() { return read_file_text(std::string(TESSERA_SOURCE_DIR) + "/data/corpus.txt"); }

// A 512-token vocabulary with <|endoftext|>, trained on the bundled corpus.
const BpeTokenizer& corpus_tokenizer() {
  static const BpeTokenizer tok = [] {
    BpeTrainParams p;
    p.vocab_size = 512;
    p.special_tokens = {"<|endoftext|>"};
    p.threads = 1;
    return BpeTokenizer(bpe_train_text(corpus_text(), p));
  }();
  return tok;
}

TEST(ShardV2, WideVocabWritesUint32AndReadsBack) {
  const fs::path d = temp_dir("shard_v2");
  const std::vector<int32_t> ids = {0, 65535, 65536, 69999, 7};
  write_shard_tokens((d / "w.bin").string(), ids, 70000);
  EXPECT_EQ(fs::file_size(d / "w.bin"), 1024 + ids.size() * 4);
  EXPECT_EQ(read_shard_tokens((d / "w.bin").string()), ids);
  EXPECT_NE(error_of([&] { read_shard((d / "w.bin").string()); }).find("a version-2 shard (uint32 tokens)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_shard_tokens((d / "w.bin").string(), 69000);
            }).find("token id 69999 at position 3 is not below the model's vocab 69000"),
            std::string::npos);
  // A vocab that fits uint16 keeps llm.c's format.
  write_shard_tokens((d / "n.bin").string(), std::vector<int32_t>{1, 65535}, 65536);
  EXPECT_EQ(fs::file_size(d / "n.bin"), 1024 + 2 * 2);
  EXPECT_EQ(read_shard((d / "n.bin").string()), (std::vector<uint16_t>{1, 65535}));
  EXPECT_NE(error_of([&] {
              write_shard_tokens((d / "x.bin").string(), std::vector<int32_t>{70000}, 70000);
            }).find("token id 70000"),
            std::string::npos);
}

TEST(ShardV2, TokenStreamReadsBothWidthsAcrossTheBoundary) {
  const fs::path d = temp_dir("shard_v2_stream");
  std::vector<int32_t> a, b;
  for (int i = 0; i < 7; ++i) a.push_back(100 + i);
  for (int i = 0; i < 9; ++i) b.push_back(66000 + i);
  write_shard_tokens((d / "train_000000.bin").string(), a, 60000);  // uint16
  write_shard_tokens((d / "train_000001.bin").string(), b, 70000);  // uint32
  TokenStream s(find_shards(d.string(), "train"), 70000);
  EXPECT_EQ(s.size(), 16u);
  EXPECT_EQ(s.max_token(), 66008);
  std::vector<int32_t> in(10, -1), tg(10, -1);
  s.next_batch(2, 5, in.data(), tg.data());
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(in[i], all[i]) << i;
    EXPECT_EQ(tg[i], all[i + 1]) << i;
  }
  EXPECT_NE(error_of([&] {
              TokenStream(find_shards(d.string(), "train"), 66000);
            }).find("token id 66000 at position 0 is not below the model's vocab 66000"),
            std::string::npos);
}

TEST(ShardV2, BadTokenWidthIsOneLine) {
  const fs::path d = temp_dir("shard_v2_bad");
  write_shard_tokens((d / "w.bin").string(), std::vector<int32_t>{1, 2}, 70000);
  std::fstream f(d / "w.bin", std::ios::in | std::ios::out | std::ios::binary);
  const int32_t two = 2;
  f.seekp(12);
  f.write(reinterpret_cast<const char*>(&two), 4);
  f.close();
  EXPECT_NE(error_of([&] {
              read_shard_tokens((d / "w.bin").string());
            }).find("a version-2 shard declares 2 bytes a token (expected 4)"),
            std::string::npos);
}

// The token split is the byte split with ids for bytes: the same stream as a text and as ids gives the same shards,
// the short-stream tail (with a partial val block at the end, f = 0.5 at 1500) included.
TEST(TokenShards, SplitIsTheByteSplit) {
  const fs::path d = temp_dir("token_split");
  for (const double f : {0.1, 0.5, 0.3, 0.9}) {
    for (const size_t n : {2, 3, 5, 1023, 1024, 1025, 1500, 3500, 4000, 10239, 10240, 10241, 25000, 70000}) {
      std::string text(n, '\0');
      std::vector<int32_t> ids(n);
      for (size_t i = 0; i < n; ++i) {
        text[i] = static_cast<char>(i % 251);
        ids[i] = static_cast<int32_t>(i % 251);
      }
      prepare_shards(text, (d / "bytes").string(), {.val_fraction = f});
      // The ids in uneven chunks, as the corpus encoder hands them out.
      const TokenSource source = [&](const TokenSink& sink) {
        for (size_t at = 0, step = 1; at < n; at += step, step = step * 3 % 2000 + 1)
          sink(std::span<const int32_t>(ids).subspan(at, std::min(step, n - at)));
      };
      const PrepareReport r = prepare_token_shards(source, (d / "ids").string(), {.val_fraction = f},
                                                   {.vocab = 256, .tokenizer_json = "{}"});
      const auto sizes = prepare_split_sizes(n, f);
      EXPECT_EQ(r.n_train, sizes.first) << n << " " << f;
      EXPECT_EQ(r.n_val, sizes.second) << n << " " << f;
      for (const char* shard : {"train_000000.bin", "val_000000.bin"})
        EXPECT_EQ(read_shard_tokens((d / "ids" / shard).string()), read_shard_tokens((d / "bytes" / shard).string()))
            << shard << " " << n << " " << f;
    }
  }
  EXPECT_EQ(read_file_text((d / "ids" / "tokenizer.json").string()), "{}");
  // A byte-level prepare into that directory removes the tokenizer.json that no longer names its shards' ids.
  prepare_shards("hello, bytes", (d / "ids").string(), {.val_fraction = 0.1});
  EXPECT_FALSE(fs::exists(d / "ids" / "tokenizer.json"));
}

TEST(TokenShards, WideVocabIsVersion2AndTooFewIdsAreRefused) {
  const fs::path d = temp_dir("token_wide");
  std::vector<int32_t> ids(3000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(100000 - i);
  const TokenSource source = [&](const TokenSink& sink) { sink(ids); };
  prepare_token_shards(source, d.string(), {.val_fraction = 0.1}, {.vocab = 100001, .tokenizer_json = "{}"});
  std::vector<int32_t> back = read_shard_tokens((d / "train_000000.bin").string());
  const std::vector<int32_t> val = read_shard_tokens((d / "val_000000.bin").string());
  back.insert(back.end(), val.begin(), val.end());
  EXPECT_EQ(back, ids);  // a short stream: train, then its tail as val
  EXPECT_EQ(fs::file_size(d / "train_000000.bin"), 1024 + 4 * (ids.size() - val.size()));  // uint32
  EXPECT_NE(error_of([&] { read_shard((d / "train_000000.bin").string()); }).find("a version-2 shard"),
            std::string::npos);
  const TokenSource one = [&](const TokenSink& sink) { sink(std::span<const int32_t>(ids).first(1)); };
  EXPECT_NE(error_of([&] {
              prepare_token_shards(one, (d / "one").string(), {.val_fraction = 0.1},
                                   {.vocab = 100001, .tokenizer_json = "{}"});
            }).find("the text has 1 token; at least 2 are needed"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d / "one"));  // undone
}

TEST(Corpus, TextCutsSitWherePreTokensEndOnBothSides) {
  EXPECT_EQ(corpus_text_cut("ab\ncd\nef"), 6u);  // "X\nY": before Y
  EXPECT_EQ(corpus_text_cut("ab\n\ncd"), 3u);    // a run: before its last character
  EXPECT_EQ(corpus_text_cut("ab \t cd"), 4u);
  EXPECT_EQ(corpus_text_cut("ab\n c"), 3u);
  EXPECT_EQ(corpus_text_cut("ab cd\xc3\xa9"), 2u);   // "X Y": before the space
  EXPECT_EQ(corpus_text_cut("\xc3\xa9 cd"), 0u);     // not surely a whole pre-token before the space
  EXPECT_EQ(corpus_text_cut("ab\n\n\xc3\xa9"), 0u);  // not surely \S after the run
  EXPECT_EQ(corpus_text_cut("\xc3\xa9\nab"), 0u);    // not ASCII before the lone newline
  EXPECT_EQ(corpus_text_cut("ab\n\n<|endoftext|>x", {"<|endoftext|>"}), 0u);  // the special ends W's segment
  EXPECT_EQ(corpus_text_cut("ab\n\n<|endo", {"<|endoftext|>"}), 0u);          // and may go on past the text
  EXPECT_EQ(corpus_text_cut("ab\n\n<|endoftext|>x"), 3u);
  EXPECT_EQ(corpus_text_cut("a\nb"), 0u);  // only whole pieces on each side (a cut at the last byte is none)
  EXPECT_EQ(corpus_text_cut(""), 0u);
}

// However the text is cut and however many threads encode it, the ids are those of one serial encode.
TEST(Corpus, ParallelPiecesEncodeAsTheWhole) {
  const BpeTokenizer& tok = corpus_tokenizer();
  const fs::path d = temp_dir("corpus_parallel");
  std::string text = corpus_text();
  text += "\nThe end<|endoftext|>A new story.\nx\ny z\n\n<|endoftext|>\n\n  <|endoftext|>Tail \t\n\n";
  write_text(d / "c.txt", text);
  const std::vector<int32_t> whole = tok.encode(text, allow_all_specials());
  for (const int threads : {1, 3, 8})
    for (const size_t chunk : {size_t{1}, size_t{37}, size_t{4096}, size_t{1} << 22}) {
      std::vector<int32_t> got;
      size_t pieces = 0;
      encode_corpus(tok, {.files = {(d / "c.txt").string()}, .threads = threads, .chunk_bytes = chunk},
                    [&](std::span<const int32_t> ids) {
                      got.insert(got.end(), ids.begin(), ids.end());
                      ++pieces;
                    });
      EXPECT_EQ(got, whole) << threads << " threads, chunk " << chunk;
      if (chunk == 37) {
        EXPECT_GT(pieces, 100u);  // it was cut
      }
    }
}

// Random texts of the characters the cut rules look at, cut wherever they allow (chunks of a few bytes).
// (The tokenizer is trained on such texts, so that runs of whitespace are tokens: a cut inside one shows.)
TEST(Corpus, RandomTextsEncodeAsTheWholeWhereverCut) {
  const fs::path d = temp_dir("corpus_random");
  const char* atoms[] = {"a",   "the",  " ",  "  ", "\n", "\n\n",     "\t",           "\r\n",          "'s",
                         "'",   "1",    "23", ".",  "!?", "\xc3\xa9", "\xe2\x80\x83", "<|endoftext|>", "<|endo",
                         "Fox", " the", "\f"};
  std::mt19937 rng(11);
  auto random_text = [&] {
    std::string text;
    for (size_t n = rng() % 40; n > 0; --n) text += atoms[rng() % std::size(atoms)];
    return text;
  };
  std::string training;
  for (int i = 0; i < 500; ++i) training += random_text();
  BpeTrainParams tp;
  tp.vocab_size = 400;
  tp.special_tokens = {"<|endoftext|>"};
  tp.threads = 1;
  const BpeTokenizer tok(bpe_train_text(training, tp));
  ASSERT_GE(tok.encode_ordinary("  ").size(), 1u);
  EXPECT_EQ(tok.encode_ordinary("\n\n\n\n").size(), 1u);  // whitespace runs merged
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_text();
    write_text(d / "r.txt", text);
    const std::vector<int32_t> whole = tok.encode(text, allow_all_specials());
    std::vector<int32_t> got;
    encode_corpus(tok, {.files = {(d / "r.txt").string()}, .threads = 2, .chunk_bytes = 1 + rng() % 6},
                  [&](std::span<const int32_t> ids) { got.insert(got.end(), ids.begin(), ids.end()); });
    ASSERT_EQ(got, whole) << "text: " << ::testing::PrintToString(text);
  }
}

TEST(Corpus, DocumentsGetEndOfTextBetweenThem) {
  const BpeTokenizer& tok = corpus_tokenizer();
  const int32_t eot = corpus_separator(tok);
  ASSERT_GE(eot, 0);
  const fs::path d = temp_dir("corpus_docs");
  write_text(d / "a.jsonl",
             "{\"text\": \"The Fox\\nran.\"}\n{\"id\": 2, \"text\": \"A Lion \\u00e9\"}\r\n"
             "{\"text\": \"\"}\n{\"text\": \"last\"}");
  write_text(d / "b.txt", "Another file.");
  std::vector<int32_t> got;
  encode_corpus(tok, {.files = {(d / "a.jsonl").string(), (d / "b.txt").string()}, .threads = 2, .chunk_bytes = 8},
                [&](std::span<const int32_t> ids) { got.insert(got.end(), ids.begin(), ids.end()); });
  std::vector<int32_t> want;
  for (const char* doc : {"The Fox\nran.", "A Lion \xc3\xa9", "", "last", "Another file."}) {
    if (!want.empty() || std::string(doc) != "The Fox\nran.") want.push_back(eot);
    tok.encode(doc, allow_all_specials(), want, *std::make_unique<BpeEncodeState>());
  }
  EXPECT_EQ(got, want);
}

TEST(Corpus, BadRecordsNameFileAndLine) {
  const BpeTokenizer& tok = corpus_tokenizer();
  const fs::path d = temp_dir("corpus_bad");
  auto error = [&](const std::string& content, const std::string& field = "text") {
    write_text(d / "x.jsonl", content);
    return error_of([&] {
      encode_corpus(tok, {.files = {(d / "x.jsonl").string()}, .text_field = field, .threads = 2, .chunk_bytes = 4},
                    [](std::span<const int32_t>) {});
    });
  };
  const std::string f = (d / "x.jsonl").string();
  EXPECT_NE(error("{\"text\": \"a\"}\nnot json\n").find(f + ":2: not a JSON object"), std::string::npos);
  EXPECT_NE(error("{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n").find(f + ":2: not a JSON object (an empty line)"),
            std::string::npos);
  EXPECT_NE(error("{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"body\": \"c\"}\n")
                .find(f + ":3: the record has no field "
                          "\"text\""),
            std::string::npos);
  EXPECT_NE(error("{\"text\": 5}\n").find(f + ":1: the field \"text\" is number, not a string"), std::string::npos);
  EXPECT_NE(error("[1]\n").find(f + ":1: not a JSON object"), std::string::npos);
  EXPECT_EQ(error("{\"body\": \"c\"}\n", "body"), "");
  write_text(d / "bad.txt", "ok text\nmore\xff");
  EXPECT_NE(error_of([&] {
              encode_corpus(tok, {.files = {(d / "bad.txt").string()}}, [](std::span<const int32_t>) {});
            }).find("is not plain text (invalid UTF-8 at byte 12)"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
