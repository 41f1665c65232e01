// tessera/train/text.h — what counts as text for the byte-level tokenizer.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace tessera {

// True when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF) and
// holds no NUL byte, which text does not contain and binaries nearly always do. On false, *bad (when given)
// is the offset of the first offending byte.
bool is_utf8_text(std::string_view s, size_t* bad = nullptr);

// What is wrong at s[bad] (is_utf8_text's offset), for a message: "a NUL byte at byte 5" (NUL is valid UTF-8, so
// "invalid UTF-8" misled there) or "invalid UTF-8 at byte 5".
std::string not_text_at(std::string_view s, size_t bad);

}  // namespace tessera
