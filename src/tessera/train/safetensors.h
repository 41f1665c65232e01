// tessera/train/safetensors.h — the safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}, then the raw data.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"

namespace tessera {

struct SafetensorsEntry {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte range inside the data section
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

class SafetensorsWriter {
 public:
  // Copies the bytes of a tensor; names must be unique.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes atomically (temp file, then rename).
  void write(const std::string& path) const;

 private:
  std::vector<std::string> order_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::vector<uint8_t> data_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsFile {
 public:
  // Reads and validates the whole file. Throws Error "safetensors: <path>: <reason>" for a missing, truncated
  // or corrupt file (bad header length, bad JSON, unknown dtype, offsets outside the data or not matching
  // the shape).
  static SafetensorsFile load(const std::string& path);

  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  const uint8_t* data(const std::string& name) const { return data_.data() + data_offset_ + entry(name).begin; }
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A metadata value, or throws naming the missing key.
  const std::string& meta(const std::string& key) const;
  // Copies tensor `name` into dst (numel floats), converting BF16/F16 to f32. Checks the shape.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<uint8_t> data_;
  size_t data_offset_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera
