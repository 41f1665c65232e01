#include "tessera/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>

#include "tessera/core/error.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {
// Bytes (std::vector<uint8_t>) or text (std::string): read straight into the result, without a second copy.
template <typename Bytes>
Bytes read_whole_file(const std::string& path, const char* what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  TS_CHECK(f, what, ": cannot read ", path, ": ", std::strerror(errno));
  Bytes out;
  // Sized once from the file's length (then grown only if the file grew meanwhile or reports no size, as
  // /proc files do), so reading does not reallocate as it goes.
  struct stat st {};
  size_t len = 0;
  try {
    if (::fstat(::fileno(f), &st) == 0 && st.st_size > 0) out.resize(static_cast<size_t>(st.st_size));
    for (;;) {
      if (len == out.size()) {
        const int c = std::fgetc(f);  // at the expected end: grow only if there is more
        if (c == EOF) break;
        out.resize(out.size() + (1 << 16));
        out[len++] = static_cast<typename Bytes::value_type>(c);
      }
      const size_t n = std::fread(out.data() + len, 1, out.size() - len, f);
      if (n == 0) break;
      len += n;
    }
  } catch (const std::bad_alloc&) {
    // Said as what failed: a caller's generic hint ("try a smaller model, --batch or --seq" in train) would point
    // at the wrong thing. Starts with "out of memory", as is_out_of_memory expects.
    std::fclose(f);
    const size_t bytes = std::max(out.size(), static_cast<size_t>(std::max<off_t>(st.st_size, 0)));
    char size[32];
    std::snprintf(size, sizeof size, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
    TS_THROW("out of memory reading ", what, " ", path, " whole (", size, ")");
  }
  out.resize(len);
  const bool err = std::ferror(f);
  std::fclose(f);
  TS_CHECK(!err, what, ": error reading ", path);
  return out;
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what) {
  return read_whole_file<std::vector<uint8_t>>(path, what);
}

std::string read_file_text(const std::string& path, const char* what) {
  return read_whole_file<std::string>(path, what);
}

namespace {
// The temporary file write_file_atomic writes before renaming it over `path`: ".<name>.tmp.<pid>" beside it.
std::string atomic_temp_path(const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // Built by appending: GCC 12 warns (-Wrestrict, a false positive) on `"." + std::string&&`.
  std::string tmp_name = ".";
  tmp_name += target.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(::getpid());
  return (dir / tmp_name).string();
}
}  // namespace

void check_file_writable(const std::string& path, const std::string& what) {
  const std::string tmp = atomic_temp_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TS_CHECK(fd >= 0 || errno == EEXIST, what, " ", path, ": cannot write there: ", std::strerror(errno));
  if (fd >= 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
  }
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const std::string tmp = atomic_temp_path(path);
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
  const fs::path target(path);
  fsync_dir((target.has_parent_path() ? target.parent_path() : fs::path(".")).string());
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  write_file_atomic(path, [&](std::FILE* f) {
    TS_CHECK(size == 0 || std::fwrite(data, 1, size, f) == size, "cannot write ", path, ": ", std::strerror(errno));
  });
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TS_CHECK(fd >= 0, "cannot open directory ", dir, ": ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // EINVAL: the file system cannot sync a directory (some network and FUSE ones); nothing more can be done.
  TS_CHECK(rc == 0 || e == EINVAL, "cannot sync directory ", dir, ": ", std::strerror(e));
}

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TS_CHECK(!ec, "cannot create output directory ", dir, ": ", ec.message());
  TS_CHECK(fs::is_directory(dir), "output path ", dir, " is not a directory");
  TS_CHECK(::access(dir.c_str(), W_OK) == 0, "output directory ", dir, " is not writable: ", std::strerror(errno));
}

std::string filesystem_error_message(const std::filesystem::filesystem_error& e) {
  if (e.path1().empty()) return e.code().message();
  return "cannot access " + e.path1().string() + ": " + e.code().message();
}

}  // namespace tessera
