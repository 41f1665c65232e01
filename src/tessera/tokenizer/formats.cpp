// Readers and writers of tokenizer.json, vocab.json + merges.txt and .tiktoken (formats.h).
#include "tessera/tokenizer/formats.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/tokenizer/bpe.h"
#include "tessera/tokenizer/unicode_classes.h"

namespace tessera {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace {

std::array<uint32_t, 256> make_byte_to_code_point() {
  std::array<uint32_t, 256> m{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) m[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
  return m;
}

void append_utf8(uint32_t cp, std::string& s) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// "'text'", with bytes that would break the one line escaped.
std::string in_quotes(std::string_view s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "'";
}

nlohmann::json parse_json(const std::string& path, const char* what) {
  const std::string text = read_file_text(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    TS_THROW(path, ": not JSON, so not ", what, " (", e.what(), ")");
  }
}

// The ids must be 0..n-1, each once.
void check_dense(const std::vector<int>& count_by_id, const std::string& path) {
  for (size_t id = 0; id < count_by_id.size(); ++id)
    TS_CHECK(count_by_id[id] != 0, path, ": a gap in the ids: no token has id ", id, " (the largest is ",
             count_by_id.size() - 1, ")");
}

// vocab: token text (through bytes_to_unicode) -> id. Fills model.tokens (dense ids), leaving the entries whose
// text `overrides` gives (added tokens, by id) to those.
void fill_vocab(const nlohmann::json& vocab, const std::string& path, const std::map<int64_t, std::string>& overrides,
                BpeModel& model) {
  TS_CHECK(vocab.is_object(), path, ": the vocab is not an object of token -> id");
  int64_t max_id = -1;
  for (const auto& [text, id] : vocab.items()) {
    TS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, path, ": token ", in_quotes(text), " has id ", id.dump(),
             ", not an integer >= 0");
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (const auto& [id, text] : overrides) max_id = std::max(max_id, id);
  TS_CHECK(max_id < (int64_t{1} << 31) - 1, path, ": token id ", max_id, " is too large");
  std::vector<int> count(static_cast<size_t>(max_id + 1), 0);
  model.tokens.assign(count.size(), std::string());
  std::vector<std::string_view> first_text(count.size());
  for (const auto& [text, j] : vocab.items()) {
    const auto id = static_cast<size_t>(j.get<int64_t>());
    TS_CHECK(count[id] == 0, path, ": a duplicate id: tokens ", in_quotes(first_text[id]), " and ", in_quotes(text),
             " both have id ", id);
    count[id] = 1;
    first_text[id] = text;
    const auto o = overrides.find(static_cast<int64_t>(id));
    if (o != overrides.end()) continue;
    TS_CHECK(gpt2_unicode_to_bytes(text, &model.tokens[id]), path, ": token ", in_quotes(text), " (id ", id,
             ") holds a character that GPT-2's bytes_to_unicode does not map: not a byte-level vocab");
  }
  for (const auto& [id, text] : overrides) {
    count[static_cast<size_t>(id)] = 1;
    model.tokens[static_cast<size_t>(id)] = text;
  }
  check_dense(count, path);
}

// The id of each merge's two halves, by their text; merges[r] is "a b" or ["a", "b"].
void fill_merges(const std::vector<std::pair<std::string, std::string>>& merges, const nlohmann::json& vocab,
                 const std::string& path, BpeModel& model) {
  model.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab.find(a), ib = vocab.find(b);
    TS_CHECK(ia != vocab.end(), path, ": merge ", r, " (", in_quotes(a + " " + b), ") merges ", in_quotes(a),
             ", which is not in the vocab");
    TS_CHECK(ib != vocab.end(), path, ": merge ", r, " (", in_quotes(a + " " + b), ") merges ", in_quotes(b),
             ", which is not in the vocab");
    model.merges.emplace_back(ia->get<int32_t>(), ib->get<int32_t>());
  }
}

std::pair<std::string, std::string> split_merge_line(std::string_view line, const std::string& path, size_t where,
                                                     const char* what) {
  const size_t sp = line.find(' ');
  TS_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
               line.find(' ', sp + 1) == std::string_view::npos,
           path, ": ", what, " ", where, " is ", in_quotes(line), ", not two tokens joined by one space");
  return {std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))};
}

// Runs BpeTokenizer's checks with the path in the message; returns the model.
BpeModel checked(BpeModel model, const std::string& path) {
  BpeTokenizer check(std::move(model), path);
  return check.model();
}

// The tokens of `model` that are neither single bytes nor the result of a merge: GPT-2's <|endoftext|>.
std::vector<int32_t> unmade_tokens(const BpeModel& model) {
  std::vector<bool> made(model.tokens.size(), false);
  std::unordered_map<std::string, int32_t> by_bytes;
  for (size_t id = 0; id < model.tokens.size(); ++id) by_bytes.emplace(model.tokens[id], static_cast<int32_t>(id));
  for (const auto& [l, r] : model.merges) {
    if (l < 0 || r < 0 || static_cast<size_t>(l) >= model.tokens.size() ||
        static_cast<size_t>(r) >= model.tokens.size())
      continue;  // BpeTokenizer's check names it
    const auto f = by_bytes.find(model.tokens[l] + model.tokens[r]);
    if (f != by_bytes.end()) made[f->second] = true;
  }
  std::vector<int32_t> out;
  for (size_t id = 0; id < model.tokens.size(); ++id)
    if (model.tokens[id].size() > 1 && !made[id]) out.push_back(static_cast<int32_t>(id));
  return out;
}

const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; --k) out += kB64[(v >> (6 * k)) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool base64_decode(std::string_view in, std::string* out) {
  if (in.empty() || in.size() % 4 != 0) return false;
  out->clear();
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      uint32_t d = 0;
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        ++pad;
      } else if (pad > 0) {
        return false;
      } else {
        const char* f = std::strchr(kB64, c);
        if (c == 0 || !f) return false;
        d = static_cast<uint32_t>(f - kB64);
      }
      v = v << 6 | d;
    }
    *out += char(v >> 16);
    if (pad < 2) *out += char((v >> 8) & 0xFF);
    if (pad < 1) *out += char(v & 0xFF);
  }
  return true;
}

// The merges a rank-ordered vocabulary implies (formats.h): ranks[token bytes] = id, tokens by id.
void derive_merges(const std::unordered_map<std::string, int32_t>& ranks, BpeModel& model, const std::string& path) {
  std::vector<std::string> parts;
  for (size_t id = 0; id < model.tokens.size(); ++id) {
    const std::string& tok = model.tokens[id];
    if (tok.size() < 2) continue;
    parts.clear();
    for (char c : tok) parts.emplace_back(1, c);
    while (parts.size() > 2) {
      int32_t best = INT32_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const auto f = ranks.find(parts[i] + parts[i + 1]);
        if (f != ranks.end() && f->second < best) best = f->second, at = i;
      }
      if (best >= static_cast<int32_t>(id)) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    const auto l = parts.size() == 2 ? ranks.find(parts[0]) : ranks.end();
    const auto r = parts.size() == 2 ? ranks.find(parts[1]) : ranks.end();
    TS_CHECK(l != ranks.end() && r != ranks.end() && l->second < static_cast<int32_t>(id) &&
                 r->second < static_cast<int32_t>(id),
             path, ": token ", id, " (", in_quotes(base64_encode(tok)),
             " in base64) cannot be made by merging two "
             "tokens of lower rank");
    model.merges.emplace_back(l->second, r->second);
  }
}

}  // namespace

const std::array<uint32_t, 256>& gpt2_byte_to_code_point() {
  static const std::array<uint32_t, 256> m = make_byte_to_code_point();
  return m;
}

std::string gpt2_bytes_to_unicode(std::string_view bytes) {
  const auto& m = gpt2_byte_to_code_point();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(m[b], out);
  return out;
}

bool gpt2_unicode_to_bytes(std::string_view text, std::string* out) {
  static const std::array<int16_t, 0x144> inverse = [] {
    std::array<int16_t, 0x144> inv{};
    inv.fill(-1);
    const auto& m = gpt2_byte_to_code_point();
    for (int b = 0; b < 256; ++b) inv[m[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  std::string bytes;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    i += utf8_decode(p + i, text.size() - i, &cp);
    if (cp >= inverse.size() || inverse[cp] < 0) return false;
    bytes += static_cast<char>(inverse[cp]);
  }
  *out = std::move(bytes);
  return true;
}

const char* tokenizer_format_name(TokenizerFormat f) {
  switch (f) {
    case TokenizerFormat::HuggingFace: return "huggingface";
    case TokenizerFormat::Gpt2: return "gpt2";
    case TokenizerFormat::Tiktoken: return "tiktoken";
  }
  return "?";
}

// Checks that the pre-tokenizer or decoder `j` is ByteLevel (alone, or inside a Sequence).
static void check_byte_level(const nlohmann::json& j, const char* what, const std::string& path) {
  TS_CHECK(j.is_object(), path, ": the ", what, " is ", j.dump(), ", not ByteLevel: not a byte-level BPE tokenizer");
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    const char* key = std::string(what) == "decoder" ? "decoders" : "pretokenizers";
    const auto list = j.find(key);
    TS_CHECK(list != j.end() && list->is_array() && list->size() == 1, path, ": the ", what,
             " is a Sequence of other than one ByteLevel, which tessera does not run");
    return check_byte_level((*list)[0], what, path);
  }
  TS_CHECK(type == "ByteLevel", path, ": the ", what, " is ", type.empty() ? j.dump() : type,
           ", not ByteLevel: not a byte-level BPE tokenizer");
  TS_CHECK(!j.value("add_prefix_space", false), path, ": the ", what,
           " has add_prefix_space true, which tessera does not do");
  TS_CHECK(std::string(what) == "decoder" || j.value("use_regex", true), path,
           ": the pre_tokenizer has use_regex false, which tessera does not do");
}

BpeModel read_hf_tokenizer_json(const std::string& path) {
  const nlohmann::json j = parse_json(path, "a Hugging Face tokenizer.json");
  TS_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), path,
           ": not a Hugging Face tokenizer.json (it has no \"model\" object)");
  const nlohmann::json& m = j["model"];
  const std::string type = m.value("type", "BPE");
  TS_CHECK(type == "BPE", path, ": the model is ", type, ", not BPE");
  TS_CHECK(m.contains("vocab") && m.contains("merges"), path, ": the BPE model has no vocab or no merges");
  TS_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(), path,
           ": the tokenizer has a normalizer, which tessera does not run");
  check_byte_level(j.value("pre_tokenizer", nlohmann::json()), "pre_tokenizer", path);
  if (j.contains("decoder") && !j["decoder"].is_null()) check_byte_level(j["decoder"], "decoder", path);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    TS_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", path, ": the BPE model has a ", key,
             ", which a byte-level BPE has not");
  TS_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"] == 0, path,
           ": the BPE model has dropout, which tessera does not do");

  std::map<int64_t, std::string> added;  // id -> content
  std::vector<int32_t> special_ids;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    TS_CHECK(j["added_tokens"].is_array(), path, ": added_tokens is not a list");
    for (const auto& a : j["added_tokens"]) {
      TS_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                   a.contains("content") && a["content"].is_string() && !a["content"].get<std::string>().empty(),
               path, ": added token ", a.dump(), " has no id >= 0 or no content");
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        TS_CHECK(!a.value(key, false), path, ": added token ", in_quotes(a["content"].get<std::string>()), " has ", key,
                 " true, which tessera does not do");
      const int64_t id = a["id"].get<int64_t>();
      TS_CHECK(id < (int64_t{1} << 31) - 1 && !added.count(id), path, ": a duplicate id: added tokens share id ", id);
      added[id] = a["content"].get<std::string>();
      special_ids.push_back(static_cast<int32_t>(id));
    }
  }
  BpeModel model;
  const nlohmann::json& vocab = m["vocab"];
  fill_vocab(vocab, path, added, model);
  // An added token that the vocab also holds (GPT-2's <|endoftext|>) must be the same text there.
  for (const auto& [id, content] : added)
    for (const auto& [text, vid] : vocab.items())
      if (vid.get<int64_t>() == id) {
        std::string bytes;
        TS_CHECK(gpt2_unicode_to_bytes(text, &bytes) && bytes == content, path, ": id ", id, " is ", in_quotes(text),
                 " in the vocab but added token ", in_quotes(content));
      }
  const nlohmann::json& merges = m["merges"];
  TS_CHECK(merges.is_array(), path, ": merges is not a list");
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& e = merges[r];
    if (e.is_string()) {
      pairs.push_back(split_merge_line(e.get<std::string>(), path, r, "merge"));
    } else {
      TS_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), path, ": merge ", r, " is ",
               e.dump(), ", not \"a b\" or [\"a\", \"b\"]");
      pairs.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  fill_merges(pairs, vocab, path, model);
  std::sort(special_ids.begin(), special_ids.end());
  model.special_ids = special_ids;
  return checked(std::move(model), path);
}

BpeModel read_gpt2_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
  const nlohmann::json vocab = parse_json(vocab_path, "a GPT-2 vocab.json");
  BpeModel model;
  fill_vocab(vocab, vocab_path, {}, model);
  const std::string text = read_file_text(merges_path, "GPT-2 merges");
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    pairs.push_back(split_merge_line(line, merges_path, line_no, "line"));
  }
  fill_merges(pairs, vocab, merges_path, model);
  model.special_ids = unmade_tokens(model);
  return checked(std::move(model), vocab_path + " + " + merges_path);
}

BpeModel read_tiktoken(const std::string& path, const std::vector<std::string>& specials) {
  const std::string text = read_file_text(path, "tiktoken file");
  std::vector<std::pair<int64_t, std::string>> entries;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    std::string bytes;
    int64_t rank = -1;
    const char* rank_end = line.data() + line.size();
    const bool ok = sp != std::string_view::npos && base64_decode(line.substr(0, sp), &bytes) &&
                    std::from_chars(line.data() + sp + 1, rank_end, rank).ptr == rank_end && rank >= 0 &&
                    rank < (int64_t{1} << 31) - 1;
    TS_CHECK(ok, path, ": line ", line_no, " is ", in_quotes(line.substr(0, 60)),
             ", not '<base64 bytes> <rank>': not a .tiktoken file");
    entries.emplace_back(rank, std::move(bytes));
  }
  TS_CHECK(!entries.empty(), path, ": empty, not a .tiktoken file");
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  BpeModel model;
  std::unordered_map<std::string, int32_t> ranks;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [rank, bytes] = entries[i];
    TS_CHECK(rank >= static_cast<int64_t>(i), path, ": a duplicate id: rank ", rank, " is given twice");
    TS_CHECK(rank == static_cast<int64_t>(i), path, ": a gap in the ids: no token has rank ", i);
    const auto [it, fresh] = ranks.emplace(bytes, static_cast<int32_t>(rank));
    TS_CHECK(fresh, path, ": ranks ", it->second, " and ", rank, " are the same bytes");
    model.tokens.push_back(bytes);
  }
  for (int b = 0; b < 256; ++b)
    TS_CHECK(ranks.count(std::string(1, static_cast<char>(b))), path, ": byte 0x", "0123456789abcdef"[b >> 4],
             "0123456789abcdef"[b & 15], " is missing from the base vocab");
  derive_merges(ranks, model, path);
  for (const std::string& s : specials) {
    model.special_ids.push_back(static_cast<int32_t>(model.tokens.size()));
    model.tokens.push_back(s);
  }
  return checked(std::move(model), path);
}

namespace {

std::string json_dump(const ordered_json& j, const std::string& path, int indent) {
  try {
    return j.dump(indent) + "\n";
  } catch (const nlohmann::json::type_error& e) {
    TS_THROW(path, ": cannot write a special token that is not valid UTF-8 as JSON text (", e.what(), ")");
  }
}

std::vector<bool> special_mask(const BpeModel& model) {
  std::vector<bool> special(model.tokens.size(), false);
  for (int32_t id : model.special_ids) special.at(static_cast<size_t>(id)) = true;
  return special;
}

}  // namespace

void write_hf_tokenizer_json(const BpeModel& model, const std::string& path) {
  const std::vector<bool> special = special_mask(model);
  ordered_json added = ordered_json::array();
  std::vector<int32_t> sids = model.special_ids;
  std::sort(sids.begin(), sids.end());
  for (int32_t id : sids)
    added.push_back({{"id", id},
                     {"content", model.tokens[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < model.tokens.size(); ++id)
    vocab[special[id] ? model.tokens[id] : gpt2_bytes_to_unicode(model.tokens[id])] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [l, r] : model.merges)
    merges.push_back(gpt2_bytes_to_unicode(model.tokens[l]) + " " + gpt2_bytes_to_unicode(model.tokens[r]));
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
  ordered_json j = {
      {"version", "1.0"},      {"truncation", nullptr},       {"padding", nullptr},           {"added_tokens", added},
      {"normalizer", nullptr}, {"pre_tokenizer", byte_level}, {"post_processor", byte_level}, {"decoder", byte_level}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  write_file_atomic(path, json_dump(j, path, 2));
}

void write_gpt2_vocab_merges(const BpeModel& model, const std::string& vocab_path, const std::string& merges_path) {
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < model.tokens.size(); ++id) vocab[gpt2_bytes_to_unicode(model.tokens[id])] = id;
  std::string merges = "#version: 0.2\n";
  for (const auto& [l, r] : model.merges)
    merges += gpt2_bytes_to_unicode(model.tokens[l]) + " " + gpt2_bytes_to_unicode(model.tokens[r]) + "\n";
  // A special token is read back as one because no merge makes it; a single-byte one would read as a byte.
  for (int32_t id : model.special_ids)
    TS_CHECK(model.tokens[id].size() > 1, vocab_path, ": cannot hold the one-byte special token ",
             in_quotes(model.tokens[id]), " (GPT-2's files tell specials by their not being made by a merge)");
  write_file_atomic(vocab_path, json_dump(vocab, vocab_path, -1));
  write_file_atomic(merges_path, merges);
}

void write_tiktoken(const BpeModel& model, const std::string& path) {
  const std::vector<bool> special = special_mask(model);
  const size_t ordinary = model.tokens.size() - model.special_ids.size();
  for (int32_t id : model.special_ids)
    TS_CHECK(static_cast<size_t>(id) >= ordinary, path, ": the special token ", in_quotes(model.tokens[id]), " has id ",
             id, ", among the ordinary tokens: a .tiktoken file holds ranks 0..", ordinary - 1,
             " with the specials after them");
  std::string out;
  for (size_t id = 0; id < ordinary; ++id) out += base64_encode(model.tokens[id]) + " " + std::to_string(id) + "\n";
  write_file_atomic(path, out);
}

LoadedTokenizer load_tokenizer(const std::string& path, const std::vector<std::string>& tiktoken_specials) {
  TS_CHECK(!path.empty(), "the tokenizer path is empty");
  TS_CHECK(fs::exists(path), "tokenizer ", path, " does not exist", dangling_link_note(path));
  const auto gpt2_pair = [](const fs::path& dir, const char* v, const char* m, LoadedTokenizer* out) {
    if (!fs::exists(dir / v) || !fs::exists(dir / m)) return false;
    *out = {read_gpt2_vocab_merges((dir / v).string(), (dir / m).string()), TokenizerFormat::Gpt2,
            (dir / v).string() + " + " + (dir / m).string()};
    return true;
  };
  LoadedTokenizer t;
  const fs::path p(path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / "tokenizer.json"))
      return {read_hf_tokenizer_json((p / "tokenizer.json").string()), TokenizerFormat::HuggingFace,
              (p / "tokenizer.json").string()};
    if (gpt2_pair(p, "vocab.json", "merges.txt", &t) || gpt2_pair(p, "encoder.json", "vocab.bpe", &t)) return t;
    std::vector<fs::path> tik;
    for (const auto& e : fs::directory_iterator(p))
      if (e.path().extension() == ".tiktoken") tik.push_back(e.path());
    TS_CHECK(tik.size() == 1, "tokenizer directory ", path, tik.empty() ? " holds no" : " holds more than one",
             " tokenizer (tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe, or one .tiktoken file)");
    return {read_tiktoken(tik[0].string(), tiktoken_specials), TokenizerFormat::Tiktoken, tik[0].string()};
  }
  const std::string name = p.filename().string();
  if (p.extension() == ".tiktoken") return {read_tiktoken(path, tiktoken_specials), TokenizerFormat::Tiktoken, path};
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (name == "vocab.json" || name == "merges.txt") {
    TS_CHECK(gpt2_pair(dir, "vocab.json", "merges.txt", &t), "tokenizer ", path,
             ": GPT-2's vocab.json needs merges.txt beside it (and merges.txt vocab.json)");
    return t;
  }
  if (name == "encoder.json" || name == "vocab.bpe") {
    TS_CHECK(gpt2_pair(dir, "encoder.json", "vocab.bpe", &t), "tokenizer ", path,
             ": GPT-2's encoder.json needs vocab.bpe beside it (and vocab.bpe encoder.json)");
    return t;
  }
  TS_CHECK(p.extension() == ".json", "tokenizer ", path,
           ": cannot tell its format from its name (tokenizer.json "
           "or another .json, vocab.json + merges.txt, encoder.json + vocab.bpe, or *.tiktoken)");
  return {read_hf_tokenizer_json(path), TokenizerFormat::HuggingFace, path};
}

}  // namespace tessera
