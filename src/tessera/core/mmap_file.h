// tessera/core/mmap_file.h — a read-only memory map of a whole file (RAII).
//
// Shards and safetensors files are mapped rather than read into memory: the kernel pages the bytes in as they
// are touched and can drop them again under pressure, so a corpus or a checkpoint larger than RAM can be read,
// and reading a file costs no heap allocation of its size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. Throws Error "<what>: cannot read <path>: <reason>" when it is missing, unreadable or
  // not a regular file. An empty file maps to size() == 0 and data() == nullptr.
  explicit MappedFile(const std::string& path, const char* what = "file");
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Tells the kernel the bytes will be read front to back (read-ahead on, pages dropped after use).
  void advise_sequential() const;

 private:
  void reset() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tessera
