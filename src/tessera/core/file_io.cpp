#include "tessera/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tessera/core/error.h"

namespace tessera {

namespace fs = std::filesystem;

std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TS_CHECK(f, what, ": cannot read ", path, ": ", std::strerror(errno));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool err = std::ferror(f);
  std::fclose(f);
  TS_CHECK(!err, what, ": error reading ", path);
  return out;
}

std::string read_file_text(const std::string& path, const char* what) {
  const auto bytes = read_file_bytes(path, what);
  return std::string(bytes.begin(), bytes.end());
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TS_CHECK(f, "cannot write ", path, ": ", std::strerror(errno));
  bool ok = true;
  try {
    write(f);
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    TS_THROW("cannot write ", path, ": ", std::strerror(saved_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    TS_THROW("cannot write ", path, ": ", std::strerror(e));
  }
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  write_file_atomic(path, [&](std::FILE* f) {
    TS_CHECK(size == 0 || std::fwrite(data, 1, size, f) == size, "cannot write ", path, ": ", std::strerror(errno));
  });
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TS_CHECK(!ec, "cannot create output directory ", dir, ": ", ec.message());
  TS_CHECK(fs::is_directory(dir), "output path ", dir, " is not a directory");
  TS_CHECK(::access(dir.c_str(), W_OK) == 0, "output directory ", dir, " is not writable: ", std::strerror(errno));
}

}  // namespace tessera
