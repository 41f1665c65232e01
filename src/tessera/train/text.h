// tessera/train/text.h — what counts as text for the byte-level tokenizer.
#pragma once
#include <cstddef>
#include <string_view>

namespace tessera {

// True when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF) and
// holds no NUL byte, which text does not contain and binaries nearly always do. On false, *bad (when given)
// is the offset of the first offending byte.
bool is_utf8_text(std::string_view s, size_t* bad = nullptr);

}  // namespace tessera
