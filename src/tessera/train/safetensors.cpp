#include "tessera/train/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/json_fields.h"

namespace tessera {

using json = nlohmann::json;

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}
}  // namespace

void SafetensorsWriter::add_entry(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                                  Fill fill) {
  TS_CHECK(!entries_.count(name), "safetensors: duplicate tensor name ", name);
  SafetensorsEntry e;
  e.dtype = dtype;
  e.shape = std::move(shape);
  const size_t bytes = static_cast<size_t>(e.numel()) * dtype_size(dtype);
  e.begin = data_bytes_;
  e.end = e.begin + bytes;
  data_bytes_ = e.end;
  if (fill) temp_bytes_ = std::max(temp_bytes_, bytes);
  entries_[name] = e;
  order_.push_back({name, data, std::move(fill)});
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  add_entry(name, dtype, std::move(shape), data, nullptr);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, Fill fill) {
  add_entry(name, dtype, std::move(shape), nullptr, std::move(fill));
}

void SafetensorsWriter::write(const std::string& path) const {
  json header = json::object();
  for (const auto& src : order_) {
    const auto& e = entries_.at(src.name);
    header[src.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                        {"shape", e.shape},
                        {"data_offsets", {e.begin, e.end}}};
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // keeps the data section 8-byte aligned
  const uint64_t n = text.size();
  write_file_atomic(path, [&](std::FILE* f) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    bool ok = std::fwrite(len, 1, 8, f) == 8;
    ok = ok && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    std::vector<uint8_t> temp;  // for Fill tensors only, sized to the largest
    for (size_t i = 0; ok && i < order_.size(); ++i) {
      const Source& src = order_[i];
      const SafetensorsEntry& e = entries_.at(src.name);
      const size_t bytes = e.end - e.begin;
      if (bytes == 0) continue;
      const void* p = src.data;
      if (src.fill) {
        if (temp.empty()) temp.resize(temp_bytes_);
        src.fill(temp.data());
        p = temp.data();
      }
      ok = std::fwrite(p, 1, bytes, f) == bytes;
    }
    TS_CHECK(ok, "cannot write ", path, ": ", std::strerror(errno));
  });
}

namespace {
uint64_t g_load_count = 0;
}  // namespace

uint64_t SafetensorsFile::load_count() { return g_load_count; }

SafetensorsFile SafetensorsFile::load(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.file_ = MappedFile(path, "safetensors");
  ++g_load_count;
  const uint8_t* bytes = f.file_.data();
  const size_t size = f.file_.size();
  TS_CHECK(size >= 8, "safetensors: ", path, ": file is truncated (", size, " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  // A header that starts with '{' is what a safetensors file holds; other bytes here are most likely another
  // kind of file (a config.json, a token shard given as a checkpoint).
  const bool json_next = size > 8 && bytes[8] == '{';
  // Said first when the bytes are not a safetensors header: "header length 8031924123371070824 exceeds the file
  // size 25" for a text file would read as a fault in a checkpoint, not as the wrong file.
  TS_CHECK(n <= size - 8 || json_next, "safetensors: ", path,
           " is not a safetensors file (its first 8 bytes give a "
           "header length of ",
           n, " bytes, beyond the file size ", size, ")");
  // Past the end of the file, a length no writer would give is a corrupt length field, not a cut-short file:
  // 18446744073709551615 would say "the file is truncated" of a file of full length. Hugging Face's safetensors refuses
  // headers over 100 MB, so a longer one cannot have been written as one.
  constexpr uint64_t kMaxHeader = 100'000'000;
  TS_CHECK(n <= size - 8 || n <= kMaxHeader, "safetensors: ", path,
           ": its header length is corrupt (the first 8 "
           "bytes give ",
           n, ", beyond the file size ", size, " and the format's limit of ", kMaxHeader, " bytes)");
  TS_CHECK(n <= size - 8, "safetensors: ", path, ": header length ", n, " exceeds the file size ", size,
           " (the file is truncated)");
  f.data_offset_ = 8 + n;
  const size_t data_size = size - f.data_offset_;
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + n);
  } catch (const json::exception&) {
    TS_THROW("safetensors: ", path, ": header is not valid JSON");
  }
  TS_CHECK(header.is_object(), "safetensors: ", path, ": header is not a JSON object");
  // Every field is checked before it is read, so that a malformed header is named in the message (which tensor,
  // which field) and the JSON library's own exception text never reaches the user.
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      TS_CHECK(v.is_object(), "safetensors: ", path, ": __metadata__ is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        TS_CHECK(m.value().is_string(), "safetensors: ", path, ": metadata '", m.key(), "' is ", json_kind(m.value()),
                 ", not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TS_CHECK(v.is_object(), "safetensors: ", path, ": tensor '", name, "' is ", json_kind(v),
             ", not an object of dtype, shape and data_offsets");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      TS_CHECK(v.contains(field), "safetensors: ", path, ": tensor '", name, "' has no ", field);
    TS_CHECK(v["dtype"].is_string(), "safetensors: ", path, ": tensor '", name, "' has a dtype that is ",
             json_kind(v["dtype"]), ", not a string");
    // Integers only: nlohmann's get<> would truncate 164864.5 to 164864.
    for (const char* field : {"shape", "data_offsets"}) {
      const json& list = v[field];
      TS_CHECK(list.is_array(), "safetensors: ", path, ": tensor '", name, "' has a ", field, " that is not a list");
      for (const json& x : list)
        TS_CHECK(x.is_number_integer(), "safetensors: ", path, ": tensor '", name, "' has a ", field,
                 " entry that is not an integer: ", x.dump());
    }
    SafetensorsEntry e;
    try {
      e.dtype = dtype_from_name(v["dtype"].get<std::string>());
    } catch (const Error& ex) {
      TS_THROW("safetensors: ", path, ": tensor '", name, "': ", ex.what());
    }
    // The byte count of the shape, checked for overflow: dims whose product wraps would pass the size check.
    size_t nbytes = dtype_size(e.dtype);
    for (const json& x : v["shape"]) {
      TS_CHECK(x.is_number_unsigned(), "safetensors: ", path, ": tensor '", name, "' has a negative dim");
      const uint64_t dim = x.get<uint64_t>();
      TS_CHECK(dim <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(nbytes, dim, &nbytes),
               "safetensors: ", path, ": tensor '", name, "' has a shape whose size overflows (dim ", x.dump(), ")");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = v["data_offsets"];
    TS_CHECK(off.size() == 2, "safetensors: ", path, ": tensor '", name, "' has ", off.size(),
             " data_offsets, not two (begin, end)");
    for (const json& x : off)
      TS_CHECK(x.is_number_unsigned(), "safetensors: ", path, ": tensor '", name, "' has a negative data offset");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    TS_CHECK(e.begin <= e.end, "safetensors: ", path, ": tensor '", name, "' has data offsets [", e.begin, ", ", e.end,
             "]: its end before its begin (a corrupt header)");
    // A file cut short (a copy that stopped) reaches here with a whole header: say that, not only the offsets.
    TS_CHECK(e.end <= data_size, "safetensors: ", path, ": tensor '", name,
             "' has data offsets outside the file (the "
             "file is truncated, or its header wrong: its data section holds ",
             data_size, " bytes, the tensor ends at ", e.end, ")");
    TS_CHECK(e.end - e.begin == nbytes, "safetensors: ", path, ": tensor '", name, "' has ", e.end - e.begin,
             " bytes for shape ", shape_str(e.shape), " of dtype ", dtype_name(e.dtype), " (", nbytes, " bytes)");
    f.entries_[name] = e;
  }
  // Tensors share no bytes (the format's rule): two names over the same bytes are a corrupt or forged file.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_begin;
  for (const auto& [name, e] : f.entries_)
    if (e.end > e.begin) by_begin.emplace_back(&name, &e);
  std::stable_sort(by_begin.begin(), by_begin.end(),  // ties in name order (the map's)
                   [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i)
    TS_CHECK(by_begin[i].second->begin >= by_begin[i - 1].second->end, "safetensors: ", path, ": tensors '",
             *by_begin[i - 1].first, "' and '", *by_begin[i].first, "' overlap in the data (bytes ",
             by_begin[i].second->begin, " to ", std::min(by_begin[i].second->end, by_begin[i - 1].second->end), ")");
  // And they cover the data exactly, as the format asks (Hugging Face's loader refuses holes and trailing bytes):
  // bytes that no tensor owns are a damaged file (two files run together, an append), never a checkpoint.
  size_t covered = 0;
  for (const auto& [name, e] : by_begin) {
    TS_CHECK(e->begin == covered, "safetensors: ", path, ": bytes ", covered, " to ", e->begin,
             " of the data belong to no tensor (a corrupt file)");
    covered = e->end;
  }
  TS_CHECK(covered == data_size, "safetensors: ", path, ": ", data_size - covered,
           " bytes after the last tensor's "
           "data (a corrupt file, or one with something appended)");
  return f;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  TS_CHECK(it != entries_.end(), "safetensors: ", path_, ": missing tensor '", name, "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

const std::string& SafetensorsFile::meta(const std::string& key) const {
  auto it = metadata_.find(key);
  TS_CHECK(it != metadata_.end(), "safetensors: ", path_, ": missing metadata '", key, "'");
  return it->second;
}

const SafetensorsEntry& SafetensorsFile::checked_float_entry(const std::string& name,
                                                             const std::vector<int64_t>& shape) const {
  const SafetensorsEntry& e = entry(name);
  TS_CHECK(e.shape == shape, "safetensors: ", path_, ": tensor '", name, "' has shape ", shape_str(e.shape),
           ", the model expects ", shape_str(shape));
  TS_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16, "safetensors: ", path_,
           ": tensor '", name, "' has dtype ", dtype_name(e.dtype), ", expected a float");
  return e;
}

namespace {
// Element i of a float tensor of dtype `dt` at `src` (unaligned), as f32.
inline float load_f32(const uint8_t* src, DType dt, int64_t i) {
  if (dt == DType::F32) {
    float x;
    std::memcpy(&x, src + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, src + 2 * i, 2);
  return dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
}  // namespace

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  const SafetensorsEntry& e = checked_float_entry(name, shape);
  const uint8_t* src = data(name);
  const int64_t n = e.numel();
  if (e.dtype == DType::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(src, e.dtype, i);
}

void SafetensorsFile::read_f32_transposed(const std::string& name, int64_t rows, int64_t cols, float* dst) const {
  const SafetensorsEntry& e = checked_float_entry(name, {rows, cols});
  const uint8_t* src = data(name);
  // dst (cols, rows) row by row: reads stride through the mapping, writes are contiguous.
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * rows + r] = load_f32(src, e.dtype, r * cols + c);
}

}  // namespace tessera
