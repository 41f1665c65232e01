// tessera/tokenizer/pretokenize.h — GPT-2's pre-tokenization: text is cut into pre-tokens, and BPE merges act only
// within one pre-token. The pattern (tiktoken's r50k_base is equivalent), with Unicode's letter and number classes:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Special tokens are cut out before this runs (they are never pre-tokenized).
#pragma once
#include <cstddef>
#include <string_view>

namespace tessera {

// The length in bytes of the pre-token that starts at text[0]: at least 1 for non-empty text, 0 for empty text.
// Successive calls over the rest cut the whole text. A byte that does not start valid UTF-8 is one code point of
// none of the classes (as [^\s\p{L}\p{N}]), so any byte string is cut and the pieces concatenate to the input.
size_t gpt2_pretoken_length(std::string_view text);

}  // namespace tessera
