#include <string>

#include "tessera/train/text.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(Text, Utf8Validity) {
  size_t bad = 99;
  EXPECT_TRUE(is_utf8_text(""));
  EXPECT_TRUE(is_utf8_text("plain ASCII\n\ttext"));
  EXPECT_TRUE(
      is_utf8_text("caf\xC3\xA9 \xE2\x80\x94 \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));  // é, em dash, emoji, U+10FFFF
  EXPECT_FALSE(is_utf8_text("ab\xFF", &bad));
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(is_utf8_text(std::string("a\0b", 3), &bad));  // NUL: binary, not text
  EXPECT_EQ(bad, 1u);
  EXPECT_FALSE(is_utf8_text("\xC3", &bad));        // truncated sequence
  EXPECT_FALSE(is_utf8_text("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(is_utf8_text("\xE0\x80\xAF"));      // overlong, 3 bytes
  EXPECT_FALSE(is_utf8_text("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(is_utf8_text("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_utf8_text("\xE2\x28\xA1"));      // bad continuation
  EXPECT_FALSE(is_utf8_text("\x80"));              // lone continuation byte
  EXPECT_FALSE(
      is_utf8_text(std::string("\x7F"
                               "ELF\x02\x01\x01\x00",
                               8)));  // an ELF header
}

// The messages' reason: a NUL byte is valid UTF-8, so it is named as what it is.
TEST(Text, NotTextNamesANulByteApart) {
  size_t bad = 0;
  const std::string nul("hello\0world", 11);
  ASSERT_FALSE(is_utf8_text(nul, &bad));
  EXPECT_EQ(not_text_at(nul, bad), "a NUL byte at byte 5");
  ASSERT_FALSE(is_utf8_text("ab\xFF", &bad));
  EXPECT_EQ(not_text_at("ab\xFF", bad), "invalid UTF-8 at byte 2");
}

}  // namespace
}  // namespace tessera
