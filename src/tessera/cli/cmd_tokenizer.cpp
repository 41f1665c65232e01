// tessera tokenizer encode | decode | info | convert: a BPE tokenizer's files (tokenizer/formats.h) from the command
// line. Text and ids come from a file or stdin and go to stdout or a file (written atomically).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/formats.h"

namespace tessera::cli {
namespace {

const char* kTokenizerUsage =
    "usage: tessera tokenizer <encode|decode|info|convert> --tokenizer PATH [flags]\n"
    "       tessera tokenizer train --text FILE... --vocab-size N --out DIR [flags]\n"
    "\n"
    "  train    train a byte-level BPE vocabulary on text files (CS336's rules) into DIR/tokenizer.json\n"
    "  encode   text (a file, or stdin) to token ids, one line of ids separated by spaces\n"
    "  decode   token ids (separated by spaces, commas or newlines; a file, or stdin) to text\n"
    "  info     the format, vocab size, merges and special tokens\n"
    "  convert  write the tokenizer in another format (--to huggingface|gpt2|tiktoken --out PATH)\n"
    "\n"
    "PATH: a tokenizer.json, GPT-2's vocab.json / encoder.json (with merges.txt / vocab.bpe beside it), a\n"
    ".tiktoken file, or a directory holding one of them. Run `tessera tokenizer encode --help` for the flags.\n";

void add_tokenizer_flags(Flags& a) {
  a.add("tokenizer", "PATH",
        "tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe, a .tiktoken file, "
        "or a directory holding one");
  a.add("tiktoken-special", "TEXT",
        "for a .tiktoken file: a special token, given the id after the ranks "
        "(GPT-2's is <|endoftext|>; default none)");
}

BpeTokenizer load_from_flags(const Flags& a, LoadedTokenizer* info = nullptr) {
  TS_CHECK(a.has("tokenizer"), "--tokenizer PATH is required (a tokenizer.json, vocab.json, .tiktoken or a directory)");
  std::vector<std::string> specials;
  if (a.has("tiktoken-special")) specials.push_back(a.str("tiktoken-special"));
  LoadedTokenizer t = load_tokenizer(a.str("tokenizer"), specials);
  TS_CHECK(specials.empty() || t.format == TokenizerFormat::Tiktoken, "--tiktoken-special is for a .tiktoken file; ",
           t.path, " is ", tokenizer_format_name(t.format), ", which names its special tokens itself");
  BpeTokenizer tok(t.model, t.path);
  if (info) *info = std::move(t);
  return tok;
}

// The input: --`flag` FILE, else stdin ("-" too).
std::string read_input(const Flags& a, const char* flag, const char* what) {
  const std::string path = a.str(flag, "-");
  TS_CHECK(!path.empty(), "--", flag, " is empty");
  return read_file_text(path == "-" ? "/dev/stdin" : path, what);
}

void write_output(const Flags& a, const std::string& bytes) {
  if (a.has("out")) {
    write_file_atomic(a.str("out"), bytes);
    return;
  }
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
}

int encode(int argc, char** argv) {
  Flags a("tokenizer encode", "Encodes text into token ids, printed on one line separated by spaces.");
  add_tokenizer_flags(a);
  a.add("text", "FILE", "the text to encode (default: stdin)");
  a.add("allow-special", "all|none|TEXT",
        "special tokens matched as themselves: all, none (default: the text must "
        "hold none, as tiktoken's default), or the text of one");
  a.add_switch("ordinary", "read special tokens' text as ordinary text");
  a.add("out", "FILE", "write the ids here (default: stdout)");
  if (!a.parse(argc, argv, 3)) return 0;
  TS_CHECK(!(a.has("ordinary") && a.has("allow-special")),
           "--ordinary reads special tokens as text, and "
           "--allow-special matches them: give one of them");
  const BpeTokenizer tok = load_from_flags(a);
  const std::string text = read_input(a, "text", "text");
  AllowedSpecial allowed;
  const std::string allow = a.str("allow-special", "none");
  if (allow == "all") {
    allowed.all = true;
  } else if (allow != "none") {
    TS_CHECK(tok.special_id(allow) >= 0, "--allow-special '", allow, "' is not a special token of ", a.str("tokenizer"),
             " (all, none, or the text of one)");
    allowed.texts.push_back(allow);
  }
  std::vector<int32_t> ids;
  BpeEncodeState state;
  if (a.has("ordinary")) {
    tok.encode_ordinary(text, ids, state);
  } else {
    try {
      tok.encode(text, allowed, ids, state);
    } catch (const Error& e) {
      TS_THROW(e.what(), "; pass --allow-special all, or --ordinary");
    }
  }
  std::string out;
  out.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += '\n';
  write_output(a, out);
  return 0;
}

int decode(int argc, char** argv) {
  Flags a("tokenizer decode", "Decodes token ids (separated by spaces, commas or newlines; [ ] are ignored) to text.");
  add_tokenizer_flags(a);
  a.add("ids", "FILE", "the ids to decode (default: stdin)");
  a.add("out", "FILE", "write the text here (default: stdout)");
  if (!a.parse(argc, argv, 3)) return 0;
  const BpeTokenizer tok = load_from_flags(a);
  const std::string text = read_input(a, "ids", "ids");
  std::string out;
  size_t count = 0;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    const std::string word = text.substr(i, std::max<size_t>(end, i + 1) - i);
    TS_CHECK(end > i && end - i <= 10, "ids: '", word.substr(0, 20), "' (item ", count, ") is not a token id");
    const long long id = std::stoll(word);
    TS_CHECK(id < static_cast<long long>(tok.vocab_size()), "ids: token id ", id, " (item ", count,
             ") is outside the vocab of ", tok.vocab_size());
    tok.decode_append(static_cast<int32_t>(id), out);
    ++count;
    i = end;
  }
  write_output(a, out);
  return 0;
}

int info(int argc, char** argv) {
  Flags a("tokenizer info", "Prints a tokenizer's format, vocab size, merges and special tokens.");
  add_tokenizer_flags(a);
  if (!a.parse(argc, argv, 3)) return 0;
  LoadedTokenizer t;
  const BpeTokenizer tok = load_from_flags(a, &t);
  std::printf("path        %s\n", t.path.c_str());
  std::printf("format      %s\n", tokenizer_format_name(t.format));
  std::printf("vocab size  %zu\n", tok.vocab_size());
  std::printf("merges      %zu\n", tok.model().merges.size());
  std::printf("specials    %zu\n", tok.model().special_ids.size());
  for (int32_t id : tok.model().special_ids) std::printf("  %-9d %s\n", id, tok.model().tokens[id].c_str());
  return 0;
}

int convert(int argc, char** argv) {
  Flags a("tokenizer convert", "Writes a tokenizer in another format.");
  add_tokenizer_flags(a);
  a.add("to", "huggingface|gpt2|tiktoken", "the format to write");
  a.add("out", "PATH",
        "tokenizer.json (huggingface), a directory for vocab.json + merges.txt (gpt2), or a "
        ".tiktoken file");
  if (!a.parse(argc, argv, 3)) return 0;
  const std::string to = a.str("to");
  TS_CHECK(to == "huggingface" || to == "gpt2" || to == "tiktoken", "--to must be huggingface, gpt2 or tiktoken, got '",
           to, "'");
  TS_CHECK(!a.str("out").empty(), "--out PATH is required");
  const BpeTokenizer tok = load_from_flags(a);
  const std::string out = a.str("out");
  if (to == "huggingface") {
    write_hf_tokenizer_json(tok.model(), out);
  } else if (to == "tiktoken") {
    write_tiktoken(tok.model(), out);
  } else {
    ensure_writable_dir(out);
    write_gpt2_vocab_merges(tok.model(), out + "/vocab.json", out + "/merges.txt");
  }
  std::printf("wrote %s (%s, vocab %zu)\n", out.c_str(), to.c_str(), tok.vocab_size());
  return 0;
}

}  // namespace

int cmd_tokenizer(int argc, char** argv) {
  const std::string which = argc > 2 ? argv[2] : "";
  if (which.empty() || which == "--help" || which == "-h") {
    std::fputs(kTokenizerUsage, stdout);
    return 0;
  }
  if (which == "encode") return encode(argc, argv);
  if (which == "decode") return decode(argc, argv);
  if (which == "info") return info(argc, argv);
  if (which == "convert") return convert(argc, argv);
  if (which == "train") return tokenizer_train_command(argc, argv);
  const std::string near = nearest_name(which, {"encode", "decode", "info", "convert", "train"});
  TS_THROW("tokenizer: unknown subcommand '", which, "' (",
           near.empty() ? "encode, decode, info, convert or train" : "did you mean " + near + "?", ")");
}

}  // namespace tessera::cli
