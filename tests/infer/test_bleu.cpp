// BLEU and exact match (infer/bleu.h) on cases worked by hand; tests/oracle/bleu_oracle.py checks the same code
// against the sacrebleu package on many corpora.
#include "tessera/infer/bleu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tessera/core/error.h"

namespace tessera::bleu {
namespace {

TEST(Bleu, TokenizersSplitAsSacrebleu) {
  // The expected strings are sacrebleu 2.4.3's _preprocess_segment of the same lines.
  const Options t13a{Tokenize::k13a, false}, intl{Tokenize::kIntl, false}, none{Tokenize::kNone, false};
  EXPECT_EQ(preprocess("Hello, world! It's 3.14 and 1,000-2.", t13a), "Hello , world ! It's 3.14 and 1,000 - 2 .");
  EXPECT_EQ(preprocess("He said &quot;yes&quot; &amp; left.<skipped>  ", t13a), "He said \" yes \" & left .");
  EXPECT_EQ(preprocess("a..b 5. x\u00a0y\u3000z", t13a), "a . . b 5 . x y z");
  EXPECT_EQ(preprocess("Hello, world! It's 3.14 and 1,000-2.", intl), "Hello , world ! It ' s 3.14 and 1,000-2.");
  EXPECT_EQ(preprocess("He said &quot;yes&quot; &amp; left.<skipped>  ", intl),
            "He said & quot ; yes & quot ; & amp ; left . < skipped >");
  EXPECT_EQ(preprocess("Hello, world! It's 3.14 and 1,000-2.", none), "Hello, world! It's 3.14 and 1,000-2.");
  EXPECT_EQ(preprocess("ÀB İ Straße", Options{Tokenize::k13a, true}), "àb i\u0307 straße");
}

TEST(Bleu, ScoreByTheFormula) {
  // 4 hypothesis tokens against 7: 4/4, 2/3, 1/2 match and 0/1 (smoothed to 1/(2*1)); BP = exp(1 - 7/4).
  const Score s = corpus_bleu({"The cat sat."}, {{"The cat sat on the mat."}});
  const double want = std::exp(1.0 - 7.0 / 4.0) *
                      std::exp((std::log(100.0) + std::log(200.0 / 3.0) + std::log(50.0) + std::log(50.0)) / 4.0);
  EXPECT_NEAR(s.score, want, 1e-12);
  EXPECT_EQ(format_score(s, signature({}, s.nrefs)),
            "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3 = 30.18 100.0/66.7/50.0/50.0 (BP = "
            "0.472 ratio = 0.571 hyp_len = 4 ref_len = 7)");
  EXPECT_EQ(signature(Options{Tokenize::kIntl, true}, 3), "nrefs:3|case:lc|eff:no|tok:intl|smooth:exp|version:2.4.3");
}

TEST(Bleu, EndsOfTheScale) {
  const std::vector<std::string> text = {"a b c d e", "f g h i"};
  EXPECT_DOUBLE_EQ(corpus_bleu(text, {text}).score, 100.0);
  EXPECT_EQ(corpus_bleu({"x y z w"}, {{"a b c d"}}).score, 0.0);
  EXPECT_EQ(corpus_bleu({""}, {{"a b"}}).score, 0.0);
}

TEST(Bleu, ClosestReferenceLengthAndClipping) {
  // Lengths 4 and 6 are equally near 5: the shorter counts. "the" is clipped to its largest count in one reference.
  const Score s = corpus_bleu({"the the the cat sat"}, {{"the cat sat on"}, {"the the cat sat on mat"}});
  EXPECT_EQ(s.ref_len, 4);
  EXPECT_EQ(s.counts[0], 4);
  EXPECT_EQ(s.totals[0], 5);
  EXPECT_EQ(s.nrefs, 2);
}

TEST(Bleu, ExactMatchIsByteForByte) {
  const ExactMatch m = exact_match({"a b", "c d ", "e"}, {{"a b", "c d", "x"}, {"y", "z", "e"}});
  EXPECT_EQ(m.matched, 2);
  EXPECT_EQ(m.lines, 3);
  EXPECT_DOUBLE_EQ(m.share(), 2.0 / 3.0);
}

TEST(Bleu, BadInputIsAnError) {
  EXPECT_THROW(corpus_bleu({"a", "b"}, {{"a"}}), Error);
  EXPECT_THROW(corpus_bleu({"a"}, {}), Error);
  EXPECT_THROW(corpus_bleu({"a\xff"}, {{"a"}}), Error);
  EXPECT_THROW(parse_tokenize("zh"), Error);
  EXPECT_EQ(invalid_utf8_at("ab\xc3"), 3u);
  EXPECT_EQ(invalid_utf8_at("\xed\xa0\x80"), 1u);  // a surrogate
  EXPECT_EQ(invalid_utf8_at("\xc0\xaf"), 1u);      // overlong
  EXPECT_EQ(invalid_utf8_at("ok \xe2\x82\xac"), 0u);
}

}  // namespace
}  // namespace tessera::bleu
