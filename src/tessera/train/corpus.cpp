#include "tessera/train/corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/train/text.h"

namespace tessera {

namespace {

// A printable ASCII character other than the space: no part of a multi-byte character, and not \s.
bool printable_non_space(char c) { return c > 0x20 && c < 0x7f; }
// ASCII whitespace: \s in every reading of it.
bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// One piece of the input: whole lines of a .jsonl file, or a stretch of one text document.
struct Piece {
  std::string text;
  bool jsonl = false;
  bool lead_separator = false;  // a document came before this piece's first one
  bool starts_document = true;  // text: the first stretch of its document (jsonl: every line is one)
  std::string file;
  size_t first_line = 1;  // jsonl: the line number of text's first line
  size_t offset = 0;      // text: where text starts in its file
};

// Reads one file a piece at a time.
class PieceReader {
 public:
  PieceReader(const std::string& path, const CorpusParams& p, bool can_cut, const std::vector<std::string>& specials)
      : path_(path), jsonl_(path.ends_with(".jsonl")), can_cut_(can_cut), p_(p), specials_(specials) {
    f_ = std::fopen(path.c_str(), "rb");                                   // a FIFO: waits for its writer, as cat does
    if (!f_ && p.stop && *p.stop != 0) throw PrepareInterrupted(*p.stop);  // that wait, interrupted (EINTR)
    TS_CHECK(f_, "text ", path, ": cannot open: ", std::strerror(errno));
  }
  ~PieceReader() { std::fclose(f_); }
  PieceReader(const PieceReader&) = delete;
  PieceReader& operator=(const PieceReader&) = delete;

  // The next piece, or false at the end of the file. bytes: the input it covers.
  bool next(Piece& piece) {
    size_t want = p_.chunk_bytes;
    for (;;) {
      while (!eof_ && buf_.size() < want) fill(want - buf_.size());
      const size_t cut = eof_ ? buf_.size() : find_cut();
      if (cut == 0 && !eof_) {  // no place to cut yet: one line (or stretch) longer than a chunk
        want = buf_.size() * 2;
        continue;
      }
      if (cut == 0) return false;
      piece.text.assign(buf_, 0, cut);
      buf_.erase(0, cut);
      piece.jsonl = jsonl_;
      piece.file = path_;
      piece.starts_document = offset_ == 0;
      piece.first_line = line_;
      piece.offset = offset_;
      offset_ += cut;
      if (jsonl_) line_ += static_cast<size_t>(std::count(piece.text.begin(), piece.text.end(), '\n'));
      return true;
    }
  }

 private:
  void fill(size_t n) {
    if (p_.stop && *p_.stop != 0) throw PrepareInterrupted(*p_.stop);
    const size_t old = buf_.size();
    buf_.resize(old + n);
    const size_t got = std::fread(buf_.data() + old, 1, n, f_);
    buf_.resize(old + got);
    if (got == n) return;
    if (std::ferror(f_)) {
      const int e = errno;
      if (p_.stop && *p_.stop != 0) throw PrepareInterrupted(*p_.stop);  // a read interrupted by the signal
      TS_CHECK(e == EINTR, "text ", path_, ": cannot read: ", std::strerror(e));
      std::clearerr(f_);
      return;
    }
    eof_ = true;
  }
  size_t find_cut() const {
    if (jsonl_) {
      const size_t nl = buf_.rfind('\n');
      return nl == std::string::npos ? 0 : nl + 1;
    }
    return can_cut_ ? corpus_text_cut(buf_, specials_) : 0;
  }

  std::string path_;
  bool jsonl_, can_cut_;
  const CorpusParams& p_;
  const std::vector<std::string>& specials_;
  std::FILE* f_ = nullptr;
  std::string buf_;
  bool eof_ = false;
  size_t offset_ = 0, line_ = 1;
};

// The ids of one piece, appended to out.
void encode_piece(const BpeTokenizer& tok, const Piece& piece, const std::string& field, int32_t sep,
                  std::vector<int32_t>& out, BpeEncodeState& state) {
  const AllowedSpecial all = allow_all_specials();
  bool lead = piece.lead_separator;
  auto document = [&](std::string_view text) {
    if (lead && sep >= 0) out.push_back(sep);
    lead = true;
    tok.encode(text, all, out, state);
  };
  if (!piece.jsonl) {
    size_t bad = 0;
    if (!is_utf8_text(piece.text, &bad))
      TS_THROW("text ", piece.file, " is not plain text (", piece.text[bad] == '\0' ? "a NUL byte" : "invalid UTF-8",
               " at byte ", piece.offset + bad, "); tessera prepare tokenizes text files only");
    if (piece.starts_document) document(piece.text);
    else tok.encode(piece.text, all, out, state);  // the rest of a document begun in an earlier piece
    return;
  }
  size_t line = piece.first_line;
  for (size_t at = 0; at < piece.text.size(); ++line) {
    size_t end = piece.text.find('\n', at);
    if (end == std::string::npos) end = piece.text.size();
    std::string_view rec(piece.text.data() + at, end - at);
    at = end + 1;
    if (rec.ends_with('\r')) rec.remove_suffix(1);
    const std::string where = piece.file + ":" + std::to_string(line);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(rec);
    } catch (const nlohmann::json::exception& e) {
      TS_THROW(where, ": not a JSON object", rec.empty() ? " (an empty line)" : "",
               " (a .jsonl file holds one "
               "document a line, {\"",
               field, "\": \"...\"})");
    }
    TS_CHECK(j.is_object(), where, ": not a JSON object (a .jsonl file holds one document a line, {\"", field,
             "\": \"...\"})");
    const auto it = j.find(field);
    TS_CHECK(it != j.end(), where, ": the record has no field \"", field,
             "\" (give the field that holds the text "
             "with --text-field)");
    TS_CHECK(it->is_string(), where, ": the field \"", field, "\" is ", it->type_name(), ", not a string");
    document(it->get_ref<const std::string&>());
  }
}

}  // namespace

int32_t corpus_separator(const BpeTokenizer& tok) { return tok.special_id("<|endoftext|>"); }

bool corpus_can_cut(const BpeTokenizer& tok) {
  for (const int32_t id : tok.model().special_ids)
    for (const char c : tok.model().tokens[static_cast<size_t>(id)])
      if (ascii_space(c)) return false;
  return true;
}

size_t corpus_text_cut(std::string_view text, const std::vector<std::string>& specials) {
  // Whether text[j] is printable non-space ASCII that starts no special token (nor, at the end of the text, what
  // may be the start of one).
  auto plain = [&](size_t j) {
    if (j >= text.size() || !printable_non_space(text[j])) return false;
    const std::string_view rest = text.substr(j);
    for (const std::string& s : specials)
      if (rest.starts_with(s) || std::string_view(s).starts_with(rest)) return false;
    return true;
  };
  for (size_t i = text.size() < 2 ? 0 : text.size() - 2; i >= 2; --i) {
    const bool run_end = ascii_space(text[i]) && plain(i + 1);  // c ends a run of whitespace before Y
    if (run_end && (ascii_space(text[i - 1]) || printable_non_space(text[i - 1]))) return i;
    if (text[i - 1] == '\n' && printable_non_space(text[i - 2]) && printable_non_space(text[i])) return i;
  }
  return 0;
}

void encode_corpus(const BpeTokenizer& tok, const CorpusParams& params, const TokenSink& sink) {
  const int32_t sep = corpus_separator(tok);
  const bool can_cut = corpus_can_cut(tok);
  std::vector<std::string> specials;
  for (const int32_t id : tok.model().special_ids) specials.push_back(tok.model().tokens[static_cast<size_t>(id)]);
  const int threads = std::max(1, params.threads);
  std::vector<std::unique_ptr<BpeEncodeState>> states;
  for (int t = 0; t < threads; ++t) states.push_back(std::make_unique<BpeEncodeState>());
  std::vector<Piece> round;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::exception_ptr> errors;
  bool any_document = false;
  size_t done = 0;
  auto run_round = [&] {
    ids.assign(round.size(), {});
    errors.assign(round.size(), nullptr);
    auto work = [&](size_t t) {
      for (size_t i = t; i < round.size(); i += static_cast<size_t>(threads)) {
        try {
          encode_piece(tok, round[i], params.text_field, sep, ids[i], *states[t]);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < std::min(round.size(), static_cast<size_t>(threads)); ++t) pool.emplace_back(work, t);
    work(0);
    for (std::thread& th : pool) th.join();
    for (size_t i = 0; i < round.size(); ++i) {  // in order: the first failing piece's error, whatever the threads
      if (errors[i]) std::rethrow_exception(errors[i]);
      sink(ids[i]);
      done += round[i].text.size();
    }
    round.clear();
    if (params.progress) params.progress(done);
  };
  for (const std::string& file : params.files) {
    PieceReader reader(file, params, can_cut, specials);
    Piece piece;
    while (reader.next(piece)) {
      piece.lead_separator = any_document;
      any_document = true;
      round.push_back(std::move(piece));
      piece = Piece{};
      if (round.size() == static_cast<size_t>(threads)) run_round();
    }
  }
  if (!round.empty()) run_round();
}

}  // namespace tessera
