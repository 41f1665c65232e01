// GPT-2's pre-tokenizer against Python's `regex` module (tests/tokenizer/pretokenize_oracle.py): the class table on
// every code point, and the cuts of tricky and random byte strings, invalid UTF-8 included.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tessera/tokenizer/pretokenize.h"
#include "tessera/tokenizer/unicode_classes.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Runs the oracle with `args`; false (and the test skipped) where it exits 77 for a missing `regex`.
bool run_oracle(const std::string& args) {
  const std::string cmd = std::string(TESSERA_PYTHON) + " " + TESSERA_SOURCE_DIR +
                          "/tests/tokenizer/pretokenize_oracle.py " + args;
  const int status = std::system(cmd.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return false;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  return true;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<size_t> cut(std::string_view text) {
  std::vector<size_t> lens;
  while (!text.empty()) {
    const size_t n = gpt2_pretoken_length(text);
    if (n == 0 || n > text.size()) {
      ADD_FAILURE() << "pre-token length " << n << " with " << text.size() << " bytes left";
      break;
    }
    lens.push_back(n);
    text.remove_prefix(n);
  }
  return lens;
}

TEST(Pretokenize, ClassesMatchRegexOnEveryCodePoint) {
  const fs::path d = test::temp_dir("pretok_classes");
  if (!run_oracle("--classes " + (d / "classes.bin").string())) GTEST_SKIP() << "Python's regex is not installed";
  const std::vector<uint8_t> want = read_file_bytes((d / "classes.bin").string());
  ASSERT_EQ(want.size(), 0x110000u);
  size_t wrong = 0;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    const auto got = static_cast<uint8_t>(cp_class(cp));
    if (got != want[cp] && ++wrong <= 10)
      ADD_FAILURE() << "U+" << std::hex << cp << ": " << int(got) << " vs regex " << int(want[cp]);
  }
  EXPECT_EQ(wrong, 0u);
  fs::remove_all(d);
}

// The decoder reads back every scalar value, and a lone code point is one pre-token whatever its class.
TEST(Pretokenize, Utf8DecodesEveryScalarValue) {
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string s = utf8(cp);
    uint32_t got = 0;
    ASSERT_EQ(utf8_decode(reinterpret_cast<const uint8_t*>(s.data()), s.size(), &got), s.size()) << cp;
    ASSERT_EQ(got, cp);
    ASSERT_EQ(gpt2_pretoken_length(s), s.size()) << cp;
  }
  // Overlong forms, surrogates, values above U+10FFFF, truncations and stray continuations stand alone.
  for (const std::string bad : {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80",
                                "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\x80", "\xE2\x82", "\xF0\x9F\x98"}) {
    uint32_t got = 0;
    EXPECT_EQ(utf8_decode(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), &got), 1u);
    EXPECT_EQ(got, kInvalidCodePoint);
  }
}

std::vector<std::string> tricky_cases() {
  return {"",
          " ",
          "  ",
          "a",
          " a",
          "  a",
          "   a",
          "a ",
          "a  ",
          "\n",
          "\n\n",
          " \n",
          "\n ",
          " \n a",
          "a\n\nb",
          "\t\tx",
          "\r\n",
          "hello world",
          "Hello, World!",
          "I'm you're we've he'll she'd it's 'tis",
          "'S 'T 'RE 'Ve",
          "''s",
          "!'s",
          " 's",
          "x's",
          "'",
          "''",
          "'re'",
          "don't",
          "12345",
          " 123abc",
          "a1b2",
          "3.14159",
          "$100,000",
          "...!!!???",
          " ...",
          "-- --",
          "😀",
          "😀😀 😀",
          "你好世界",
          " 你好",
          "日本語のテキスト",
          "e\xCC\x81",
          "cafe\xCC\x81 ",
          "\xCC\x81\xCC\x81",
          "Ⅻ ²³ ١٢٣",
          "\xC2\xA0"
          "a",
          "\xC2\xA0\xC2\xA0"
          "a",
          "\xE3\x80\x80x",
          "a\xE2\x80\xA8"
          "b",
          "\x1C\x1D\x1E\x1F",
          "\x0B\x0C",
          "\xC2\x85x",
          "\xE2\x80\x8B",
          "\xEF\xBB\xBF"
          "hi",
          "\xFF\xFE",
          "a\x80"
          "b",
          " \x80",
          "\xED\xA0\x80x",
          "\xF0\x9F\x98 x",
          "\xC0\xAF",
          "tab\there",
          "trailing   ",
          "mixed \t\n spaces\n\n\n",
          std::string("nul\0byte", 8)};
}

// Code points of every class and the boundaries of the pattern, for random strings.
const std::vector<uint32_t>& alphabet() {
  static const std::vector<uint32_t> a = {'a',     'Z',    'q',    '0',    '9',    ' ',      ' ',    ' ',    '\t',
                                          '\n',    '\r',   0x0B,   0x0C,   0x1C,   '\'',     's',    't',    'r',
                                          'e',     'v',    'l',    'm',    'd',    '.',      ',',    '!',    '-',
                                          '_',     '$',    0x85,   0xA0,   0xE9,   0x301,    0x1680, 0x2000, 0x2028,
                                          0x202F,  0x3000, 0x200B, 0x4E2D, 0x6587, 0x0661,   0x00B2, 0x216B, 0x1F600,
                                          0x1F44D, 0xFEFF, 0xAC00, 0x0915, 0x093F, 0x10FFFF, 0xFFFD};
  return a;
}

std::string random_case(std::mt19937_64& rng) {
  std::string s;
  const int kind = int(rng() % 3);
  const size_t n = rng() % 40;
  for (size_t i = 0; i < n; ++i) {
    if (kind == 0) {
      s += char(rng() & 0xFF);  // random bytes
    } else if (kind == 1 || rng() % 4) {
      s += utf8(alphabet()[rng() % alphabet().size()]);
    } else {
      uint32_t cp = uint32_t(rng() % 0x110000);  // any scalar value, or a stray byte
      if (cp >= 0xD800 && cp <= 0xDFFF) s += char(0x80 | (rng() & 0x7F));
      else s += utf8(cp);
    }
  }
  return s;
}

TEST(Pretokenize, CutsMatchRegexOnTrickyAndRandomStrings) {
  const fs::path d = test::temp_dir("pretok_split");
  std::mt19937_64 rng(test::test_seed());
  std::vector<std::string> cases = tricky_cases();
  // Every ASCII byte beside each class (the splitter reads ASCII through a table of its own).
  for (int c = 0; c < 128; ++c) {
    const std::string b(1, char(c));
    cases.push_back("a" + b + "1" + b + " " + b + "\xC3\xA9" + b + "!" + b + b + "\n" + b);
  }
  for (int i = 0; i < 4000; ++i) cases.push_back(random_case(rng));
  std::string blob;
  for (const std::string& c : cases) {
    const auto n = static_cast<uint32_t>(c.size());
    for (int b = 0; b < 4; ++b) blob += char((n >> (8 * b)) & 0xFF);
    blob += c;
  }
  write_file_atomic((d / "cases.bin").string(), blob);
  if (!run_oracle("--split " + (d / "cases.bin").string() + " --out " + (d / "cuts.txt").string()))
    GTEST_SKIP() << "Python's regex is not installed";
  std::ifstream in(d / "cuts.txt");
  std::string line;
  size_t k = 0, wrong = 0;
  for (; k < cases.size() && std::getline(in, line); ++k) {
    std::vector<size_t> want;
    std::istringstream ls(line);
    for (size_t v; ls >> v;) want.push_back(v);
    if (cut(cases[k]) != want && ++wrong <= 10) {
      std::string hex;
      for (unsigned char c : cases[k]) hex.append(" ").append(std::to_string(int(c)));
      ADD_FAILURE() << "case " << k << " (bytes" << hex << "): regex cuts " << line << " (seed " << test::test_seed()
                    << ")";
    }
  }
  EXPECT_EQ(k, cases.size());
  EXPECT_EQ(wrong, 0u);
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
