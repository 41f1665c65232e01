// tessera/train/safetensors.h — the safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}, then the raw data.
//
// Both sides avoid holding a copy of the data: the writer streams each tensor from the caller's buffer into
// the file, and a loaded file is memory-mapped, its tensors read in place.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/mmap_file.h"

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
  // Adds a tensor by reference: `data` is not copied, and must stay valid and unchanged until write().
  // Names must be unique.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // Adds a tensor made at write time: `fill` writes its bytes into a temporary of the tensor's size (one
  // temporary, reused, for all such tensors). For tensors stored in another layout, such as a transpose.
  using Fill = std::function<void(void* dst)>;
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, Fill fill);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes atomically (temp file, then rename): the header, then each tensor's bytes straight from its source.
  void write(const std::string& path) const;
  // Bytes of the one temporary write() allocates: the largest tensor added with a Fill (0 if none).
  size_t temp_bytes() const { return temp_bytes_; }

 private:
  struct Source {
    std::string name;
    const void* data = nullptr;
    Fill fill;
  };
  void add_entry(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, Fill fill);

  std::vector<Source> order_;
  std::map<std::string, SafetensorsEntry> entries_;
  size_t data_bytes_ = 0, temp_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsFile {
 public:
  // Maps the file and validates its header. Throws Error "safetensors: <path>: <reason>" for a missing,
  // truncated or corrupt file (bad header length, bad JSON, a tensor without dtype, shape or data_offsets or
  // with one of the wrong type, unknown dtype, offsets outside the data or not matching the shape, metadata
  // that is not strings), naming the tensor and the field. The data is read from the mapping as it is used.
  static SafetensorsFile load(const std::string& path);

  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  const uint8_t* data(const std::string& name) const { return file_.data() + data_offset_ + entry(name).begin; }
  std::vector<std::string> names() const;
  size_t size() const { return entries_.size(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A metadata value, or throws naming the missing key.
  const std::string& meta(const std::string& key) const;
  // Copies tensor `name` into dst (numel floats), converting BF16/F16 to f32. Checks the shape.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  // Tensor `name` of shape (rows, cols) copied into dst as its transpose (cols, rows), converting to f32.
  void read_f32_transposed(const std::string& name, int64_t rows, int64_t cols, float* dst) const;
  // Checks that tensor `name` is a float of this shape, as the reads do, without reading it.
  void check_float_shape(const std::string& name, const std::vector<int64_t>& shape) const {
    checked_float_entry(name, shape);
  }
  const std::string& path() const { return path_; }

  // Number of files load() has opened in this process (for tests that a path reads a file once).
  static uint64_t load_count();

 private:
  const SafetensorsEntry& checked_float_entry(const std::string& name, const std::vector<int64_t>& shape) const;

  std::string path_;
  MappedFile file_;
  size_t data_offset_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera
