// Shared helpers for tests: seeded random fills and a finite-difference gradient check in fp64.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cctype>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/models/config.h"

namespace tessera::test {

// Fresh inputs each run unless TESSERA_TEST_SEED pins them; the seed is printed on failure.
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("TESSERA_TEST_SEED")) return static_cast<uint64_t>(std::stoull(s));
    return static_cast<uint64_t>(std::random_device{}());
  }();
  return seed;
}

template <typename T>
std::vector<T> randn(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(rng));
  return v;
}

inline std::vector<int32_t> randint(size_t n, int hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <typename T>
std::vector<T> poisoned(size_t n) {
  return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

// ||a - b|| / max(||b||, tiny): the relative error of a whole tensor.
template <typename A, typename B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Central differences of `loss` w.r.t. each element of x (in place, restored).
inline std::vector<double> fd_gradient(const std::function<double()>& loss, std::vector<double>& x, double h = 1e-6) {
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    numeric[i] = (lp - lm) / (2 * h);
  }
  return numeric;
}

// fd_gradient compared with `analytic`: the relative error over the whole gradient.
inline double fd_rel_error(const std::function<double()>& loss, std::vector<double>& x,
                           const std::vector<double>& analytic, double h = 1e-6) {
  return rel_error(analytic, fd_gradient(loss, x, h));
}

// Random values to prefill an output the op ACCUMULATES into (+=), so that an op that overwrites it fails.
template <typename T>
std::vector<T> prefilled(size_t n, std::mt19937_64& rng) {
  return randn<T>(n, rng);
}

// What the op added to an accumulated output: result - prefill. Compared with the true gradient, this checks
// result = prefill + gradient.
template <typename T>
std::vector<T> added(const std::vector<T>& result, const std::vector<T>& prefill) {
  std::vector<T> d(result.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = result[i] - prefill[i];
  return d;
}

// Σ w ⊙ y: a scalar whose gradient w.r.t. y is w, used to drive backward passes with a random d_out.
inline double weighted_sum(const std::vector<double>& y, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
  return s;
}

// A small GPT-2-style config for tests (learned positions, LayerNorm, GELU, biases, tied embeddings).
inline ModelConfig small_config(int vocab, int d_model, int n_layers, int n_heads, int d_ff, int max_seq) {
  ModelConfig c;
  c.vocab = vocab;
  c.d_model = d_model;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.d_ff = d_ff;
  c.max_seq = max_seq;
  return c;
}

// `c` with Llama's shape: RMSNorm, SwiGLU, rotary positions, no biases, untied embeddings.
inline ModelConfig llama_shaped(ModelConfig c) {
  c.norm = NormKind::RmsNorm;
  c.mlp = Activation::Swiglu;
  c.positions = PositionKind::Rope;
  c.bias = false;
  c.tied = false;
  return c;
}

// `s` without its leading and trailing spaces.
inline std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The cells of one markdown table line "| a | b |" -> {"a", "b"}, trimmed.
inline std::vector<std::string> md_cells(const std::string& line) {
  std::vector<std::string> cells;
  for (size_t i = 1, j; (j = line.find('|', i)) != std::string::npos; i = j + 1)
    cells.push_back(trim(line.substr(i, j - i)));
  return cells;
}

// The cells of every row of the markdown table whose header line starts with `header_start`, the header first.
inline std::vector<std::vector<std::string>> md_table(const std::string& md, const std::string& header_start) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(md);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(header_start, 0) == 0) inside = true;
    else if (inside && (line.empty() || line[0] != '|')) break;
    if (!inside || line.rfind("|---", 0) == 0) continue;
    rows.push_back(md_cells(line));
  }
  return rows;
}

// First cell -> the row's cells, for every table line from the first header "| <key> |" on (later tables too);
// the header's cells go to *header.
inline std::map<std::string, std::vector<std::string>> table_rows(const std::string& md, const std::string& key,
                                                                  std::vector<std::string>* header) {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream in(md);
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| " + key + " |", 0) == 0) in_table = true;
    if (!in_table || line.empty() || line[0] != '|' || line.rfind("|---", 0) == 0) continue;
    std::vector<std::string> cells = md_cells(line);
    if (cells.at(0) == key) *header = cells;
    else rows[cells.at(0)] = cells;
  }
  return rows;
}

// A fresh, empty directory under the system temp dir, unique to this process and `name`.
inline std::filesystem::path temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The names of the entries in `d`, sorted: to compare a directory before and after.
inline std::vector<std::string> names_in(const std::filesystem::path& d) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(d)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Rewrites the JSON header of safetensors file `path` in place with `edit`. The data section stays as it is, except
// that the bytes of a tensor the edit erased are cut out (and the offsets after them moved down), as in a file
// written without that tensor: a reader refuses bytes that no tensor owns.
inline void edit_safetensors_header(const std::filesystem::path& path,
                                    const std::function<void(nlohmann::json&)>& edit) {
  const std::vector<uint8_t> bytes = read_file_bytes(path.string());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  const auto data = bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n);
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, data);
  const nlohmann::json before = header;
  edit(header);
  // [begin, end) of each erased tensor's bytes, unless the edit gave them to another name (a rename)
  std::vector<std::pair<uint64_t, uint64_t>> cut;
  for (const auto& [name, e] : before.items()) {
    if (name == "__metadata__" || header.contains(name)) continue;
    bool renamed = false;
    for (const auto& [other, o] : header.items())
      renamed = renamed || (o.is_object() && o.value("data_offsets", nlohmann::json()) == e["data_offsets"]);
    if (!renamed) cut.emplace_back(e["data_offsets"][0].get<uint64_t>(), e["data_offsets"][1].get<uint64_t>());
  }
  std::sort(cut.begin(), cut.end());
  const auto moved = [&](uint64_t at) {  // the offset `at` once the cut bytes before it are gone
    uint64_t down = 0;
    for (const auto& [b, e] : cut)
      if (e <= at) down += e - b;
    return at - down;
  };
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__" || !e.is_object() || !e.contains("data_offsets")) continue;
    auto& off = e["data_offsets"];
    if (off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned())
      off = {moved(off[0].get<uint64_t>()), moved(off[1].get<uint64_t>())};
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  uint64_t at = 0;
  for (const auto& [b, e] : cut) {
    out.insert(out.end(), data + static_cast<std::ptrdiff_t>(at), data + static_cast<std::ptrdiff_t>(b));
    at = e;
  }
  out.insert(out.end(), data + static_cast<std::ptrdiff_t>(at), bytes.end());
  write_file_atomic(path.string(), out.data(), out.size());
}

// The message of the tessera::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Per-dtype tolerances, in one place.
constexpr double kFdTolF64 = 1e-6;   // finite differences in fp64 with h = 1e-6
constexpr double kRefTolF32 = 1e-5;  // fp32 path against an fp64 or independent reference

// Each number ("12", "9.87", "0.0012", "9.99e-05") as one '#', to compare two runs' text with timings aside: one
// number may print as "10" in one run and "9.87" in the next, so digits, decimal point and exponent go as a whole.
inline std::string without_numbers(const std::string& text) {
  const auto digit = [&](size_t i) { return i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (!digit(i)) {
      out += text[i++];
      continue;
    }
    while (digit(i)) ++i;
    if (i + 1 < text.size() && text[i] == '.' && digit(i + 1))
      for (++i; digit(i);) ++i;
    // "9.99e-05" (%g) is one number too.
    const size_t sign = i + 1 < text.size() && (text[i + 1] == '-' || text[i + 1] == '+') ? 1 : 0;
    if (i < text.size() && text[i] == 'e' && digit(i + 1 + sign))
      for (i += 1 + sign; digit(i);) ++i;
    out += '#';
  }
  return out;
}

}  // namespace tessera::test
