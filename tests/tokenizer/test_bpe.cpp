// Byte-level BPE (tokenizer/bpe.h) on random small vocabularies: the fast encoder against a plain reference that
// merges strings by rank, special tokens, round trips of any bytes, and the streaming decoder.
#include <algorithm>
#include <map>
#include <set>

#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/pretokenize.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::error_of;

// The reference: each pre-token as a list of byte strings; the adjacent pair of lowest rank (the leftmost of
// equals) is joined until no pair is a merge.
std::vector<int32_t> reference_encode(const BpeModel& m, std::string_view text) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < m.merges.size(); ++r)
    rank.emplace(std::make_pair(m.tokens[m.merges[r].first], m.tokens[m.merges[r].second]), r);
  std::map<std::string, int32_t> id;
  std::vector<bool> special(m.tokens.size());
  for (int32_t s : m.special_ids) special[s] = true;
  for (size_t i = 0; i < m.tokens.size(); ++i)
    if (!special[i]) id[m.tokens[i]] = static_cast<int32_t>(i);
  std::vector<int32_t> out;
  while (!text.empty()) {
    const size_t len = gpt2_pretoken_length(text);
    std::vector<std::string> parts;
    for (char c : text.substr(0, len)) parts.emplace_back(1, c);
    text.remove_prefix(len);
    for (;;) {
      size_t best = SIZE_MAX, at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const auto f = rank.find({parts[i], parts[i + 1]});
        if (f != rank.end() && f->second < best) best = f->second, at = i;
      }
      if (best == SIZE_MAX) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const auto& p : parts) out.push_back(id.at(p));
  }
  return out;
}

// 256 bytes at shuffled ids, `n_merges` merges of random pairs over a small alphabet (so that they apply often,
// long runs included), and the given specials after them.
BpeModel random_model(std::mt19937_64& rng, int n_merges, const std::vector<std::string>& specials) {
  BpeModel m;
  std::vector<int> order(256);
  for (int b = 0; b < 256; ++b) order[b] = b;
  std::shuffle(order.begin(), order.end(), rng);
  for (int b : order) m.tokens.emplace_back(1, static_cast<char>(b));
  std::map<std::string, int32_t> id;
  for (size_t i = 0; i < m.tokens.size(); ++i) id[m.tokens[i]] = static_cast<int32_t>(i);
  std::vector<int32_t> pool;  // tokens over "ab c!é"
  for (unsigned char c : std::string("ab c!\xC3\xA9")) pool.push_back(id[std::string(1, char(c))]);
  std::set<std::pair<int32_t, int32_t>> used;
  for (int k = 0; k < n_merges * 4 && static_cast<int>(m.merges.size()) < n_merges; ++k) {
    const int32_t l = pool[rng() % pool.size()], r = pool[rng() % pool.size()];
    const std::string joined = m.tokens[l] + m.tokens[r];
    if (joined.size() > 12 || !used.insert({l, r}).second) continue;
    if (!id.count(joined)) {
      id[joined] = static_cast<int32_t>(m.tokens.size());
      m.tokens.push_back(joined);
      pool.push_back(id[joined]);
    }
    m.merges.emplace_back(l, r);
  }
  for (const auto& s : specials) {
    m.special_ids.push_back(static_cast<int32_t>(m.tokens.size()));
    m.tokens.push_back(s);
  }
  return m;
}

std::string random_text(std::mt19937_64& rng, size_t max_len) {
  static const std::vector<std::string> bits = {"a",  "b",  " ",  "c", "!",    "\xC3\xA9", "aa",    "ab",
                                                "\n", "  ", "'s", "9", "\xFF", "<|a|>",    "<|a|>b"};
  std::string s;
  const size_t n = rng() % max_len;
  if (rng() % 4 == 0) {  // one long pre-token of letters (over 64 bytes: the heap path)
    std::string w(65 + rng() % 300, 'a');
    for (char& c : w) c = "aab"[rng() % 3];
    return w;
  }
  while (s.size() < n) s += bits[rng() % bits.size()];
  return s;
}

TEST(Bpe, EncodeMatchesReferenceOnRandomVocabs) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    const BpeModel m = random_model(rng, 1 + int(rng() % 80), {"<|a|>"});
    const BpeTokenizer tok(m);
    BpeEncodeState state;  // shared over the texts: later ones hit the cache
    for (int i = 0; i < 60; ++i) {
      const std::string text = random_text(rng, i % 10 == 0 ? 400 : 60);
      std::vector<int32_t> got;
      tok.encode_ordinary(text, got, state);
      ASSERT_EQ(got, reference_encode(m, text))
          << "trial " << trial << " text '" << text << "' seed " << test::test_seed();
      ASSERT_EQ(tok.decode(got), text);
    }
  }
}

TEST(Bpe, AnyBytesRoundTrip) {
  std::mt19937_64 rng(test::test_seed() + 1);
  const BpeTokenizer tok(random_model(rng, 60, {"<|a|>"}));
  BpeEncodeState state;
  for (int i = 0; i < 300; ++i) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>(rng() & 0xFF);
    std::vector<int32_t> ids;
    tok.encode(text, allow_all_specials(), ids, state);
    ASSERT_EQ(tok.decode(ids), text);
  }
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.decode(std::vector<int32_t>{}), "");
  EXPECT_NE(error_of([&] { tok.decode(std::vector<int32_t>{int32_t(tok.vocab_size())}); }).find("outside the vocab"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode(std::vector<int32_t>{-1}); }).find("token id -1"), std::string::npos);
}

TEST(Bpe, SpecialTokensLongestMatchNeverSplit) {
  std::mt19937_64 rng(test::test_seed() + 2);
  const BpeModel m = random_model(rng, 30, {"<|a|>", "<|a|>b", "<|eot|>"});
  const BpeTokenizer tok(m);
  const int32_t a = tok.special_id("<|a|>"), ab = tok.special_id("<|a|>b"), eot = tok.special_id("<|eot|>");
  ASSERT_GE(a, 0);
  ASSERT_GE(ab, 0);
  ASSERT_GE(eot, 0);
  // Adjacent and overlapping: the longest that starts at a position wins.
  std::vector<int32_t> want = reference_encode(m, "x");
  want.insert(want.end(), {ab});
  const auto y = reference_encode(m, "y");
  want.insert(want.end(), y.begin(), y.end());
  want.insert(want.end(), {a, a, eot, ab});
  EXPECT_EQ(tok.encode("x<|a|>by<|a|><|a|><|eot|><|a|>b", allow_all_specials()), want);
  EXPECT_EQ(tok.encode("<|eot|>", AllowedSpecial{.all = false, .texts = {"<|eot|>"}}), std::vector<int32_t>{eot});
  // Not allowed: an error naming the token; ordinary encoding reads it as text.
  const std::string msg = error_of([&] { tok.encode("hi <|eot|>"); });
  EXPECT_NE(msg.find("special token '<|eot|>' at byte 3, which is not allowed"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { tok.encode("<|a|>b", AllowedSpecial{.all = false, .texts = {"<|a|>"}}); }).find("'<|a|>b'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              tok.encode("z", AllowedSpecial{.all = false, .texts = {"<|zz|>"}});
            }).find("not a special token"),
            std::string::npos);
  EXPECT_EQ(tok.encode_ordinary("x<|a|>b"), reference_encode(m, "x<|a|>b"));
  EXPECT_EQ(tok.encode("<|a", allow_all_specials()), reference_encode(m, "<|a"));  // a prefix of one is text
  EXPECT_EQ(tok.decode(tok.encode("q<|a|>b<|eot|>", allow_all_specials())), "q<|a|>b<|eot|>");
}

TEST(Bpe, ModelChecksNameWhatIsWrong) {
  std::mt19937_64 rng(test::test_seed() + 3);
  const BpeModel good = random_model(rng, 10, {"<|a|>"});
  auto bad = [&](auto edit) {
    BpeModel m = good;
    edit(m);
    return error_of([&] { BpeTokenizer t(m, "src"); });
  };
  EXPECT_NE(bad([](BpeModel& m) { m.tokens[int(uint8_t('q'))] = "qq"; }).find("byte 0x"), std::string::npos);
  EXPECT_NE(bad([](BpeModel& m) {
              m.merges.push_back({0, int32_t(m.tokens.size())});
            }).find("outside the vocab"),
            std::string::npos);
  EXPECT_NE(bad([](BpeModel& m) { m.merges.push_back(m.merges[0]); }).find("repeats merge 0"), std::string::npos);
  EXPECT_NE(bad([](BpeModel& m) { m.merges.push_back({m.special_ids[0], 0}); }).find("special"), std::string::npos);
  EXPECT_NE(bad([](BpeModel& m) { m.tokens.push_back(m.tokens[300 % m.tokens.size()]); }).find("same bytes"),
            std::string::npos);
  EXPECT_NE(bad([](BpeModel& m) { m.special_ids.push_back(m.special_ids[0]); }).find("listed twice"),
            std::string::npos);
  const std::string unmade = bad([](BpeModel& m) {
    const auto at = [&](const char* t) {
      return int32_t(std::find(m.tokens.begin(), m.tokens.end(), t) - m.tokens.begin());
    };
    m.merges.push_back({at("q"), at("z")});  // "qz" is no token: merges are over "ab c!é"
  });
  EXPECT_NE(unmade.find("makes 'qz', which is not in the vocab"), std::string::npos) << unmade;
  EXPECT_EQ(bad([](BpeModel&) {}), "");
}

// Every prefix of a text cut anywhere decodes, in pieces, to whole characters that concatenate to the text.
TEST(Bpe, StreamDecoderEmitsWholeCharacters) {
  std::mt19937_64 rng(test::test_seed() + 4);
  // Single-byte tokens cut every character; a merge or two joins some of their bytes.
  BpeModel m;
  for (int b = 0; b < 256; ++b) m.tokens.emplace_back(1, static_cast<char>(b));
  const BpeTokenizer tok(m);
  const std::string text = "h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80!";
  for (int trial = 0; trial < 50; ++trial) {
    std::string s = text;
    if (trial % 2) s.insert(rng() % s.size(), 1, static_cast<char>(0x80 | (rng() & 0x7F)));  // a stray byte
    const std::vector<int32_t> ids = tok.encode_ordinary(s);
    StreamDecoder d(tok);
    std::string all;
    for (int32_t id : ids) {
      const std::string part = d.push(id);
      if (trial % 2 == 0) {
        // Valid text: each part is whole characters, so it is a prefix boundary of the text.
        ASSERT_TRUE(part.empty() || (static_cast<unsigned char>(part[0]) & 0xC0) != 0x80) << part;
        ASSERT_TRUE(all.size() + part.size() == s.size() ||
                    (static_cast<unsigned char>(s[all.size() + part.size()]) & 0xC0) != 0x80);
      }
      all += part;
    }
    all += d.finish();
    ASSERT_EQ(all, s);
  }
  StreamDecoder d(tok);
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push(0xBD), "");
  EXPECT_EQ(d.push(0xA0), "\xE4\xBD\xA0");
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push('x'), "\xF0x");  // can never complete: handed out as it is
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.finish(), "\xE4");
}

}  // namespace
}  // namespace tessera
