// tessera/train/corpus.h — the documents of text and JSON Lines files, encoded by a BPE tokenizer in parallel, for
// `tessera prepare --tokenizer`.
//
// Documents: a .jsonl file holds one a line (a JSON object whose string field `text_field` is the document); any
// other file is one document (an empty one is none). The separator id (corpus_separator) goes between documents,
// those of one file and those of the next alike, never before the first or after the last.
//
// Encoding: each document is encoded apart (no token spans two), with every special token allowed: a special
// token's text inside a document (TinyStories' "<|endoftext|>" between its stories) is that token.
//
// Parallel, in order, in bounded memory: the files are read a piece at a time (about chunk_bytes each: whole lines
// of a .jsonl, or a stretch of one text document cut where the cut cannot change its ids, corpus_text_cut), `threads`
// pieces are encoded at once, and their ids are handed to the sink in the files' order before the next pieces are
// read. The pieces do not depend on the thread count, and a cut piece encodes as the whole would: the ids are the
// same for every thread count and chunk size.
#pragma once
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/tokenizer/bpe.h"
#include "tessera/train/data.h"

namespace tessera {

struct CorpusParams {
  std::vector<std::string> files;
  std::string text_field = "text";
  int threads = 1;
  size_t chunk_bytes = size_t{4} << 20;  // the input one thread encodes at a time (a longer line grows it)
  // Polled as the files are read: nonzero (a signal number) throws PrepareInterrupted.
  const volatile std::sig_atomic_t* stop = nullptr;
  // Told the input bytes read and encoded so far, after each round of pieces.
  std::function<void(size_t done)> progress = nullptr;
};

// The id put between documents: <|endoftext|>'s where the tokenizer has that special token, else -1 (none: the
// documents' ids follow each other directly).
int32_t corpus_separator(const BpeTokenizer& tok);

// Whether a text document may be cut at all: not where a special token's text holds ASCII whitespace, which the
// cuts below sit in.
bool corpus_can_cut(const BpeTokenizer& tok);

// The last position i in (0, text.size()) at which text may be cut without changing its encoding, or 0 where there
// is none. GPT-2's pattern cuts a run of whitespace W followed by a non-space Y as W minus its last character (by
// \s+(?!\S), whether or not the text goes on after it), then that last character alone or with Y (" Y"); and no
// pre-token holds a non-space followed by whitespace. So, with c = text[i] and d = text[i+1] printable non-space
// ASCII (surely \S) that no special token starts at (a special cuts W's segment short):
//   - where c is ASCII whitespace and text[i-1] is too (a run of two or more): before the run's last character;
//   - where c is ASCII whitespace and text[i-1] printable non-space ASCII (a run of one, "X Y"): before it, where
//     X's pre-token ends (none takes a non-space and the whitespace after it);
//   - where text[i-1] is a lone newline between printable non-spaces ("X\nY"): before Y.
// No special token can span either cut (corpus_can_cut: none holds whitespace).
size_t corpus_text_cut(std::string_view text, const std::vector<std::string>& specials = {});

// Encodes the corpus (above) and calls sink with its ids, a piece at a time, in order. A file that cannot be read,
// a text file that is not UTF-8 (or holds a NUL byte), and a .jsonl line that is not a JSON object with a string
// `text_field` are one-line errors naming the file (and the line).
void encode_corpus(const BpeTokenizer& tok, const CorpusParams& params, const TokenSink& sink);

}  // namespace tessera
