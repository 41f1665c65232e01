#include "tessera/core/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
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

int open_for_reading(const std::string& path, const char* what, bool wait_for_writer) {
  struct stat before {};
  const bool fifo = ::stat(path.c_str(), &before) == 0 && S_ISFIFO(before.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (fifo && wait_for_writer ? 0 : O_NONBLOCK));
  TS_CHECK(fd >= 0, what, ": cannot read ", path, ": ", std::strerror(errno));
  struct stat st {};
  const int flags = ::fcntl(fd, F_GETFL);
  const bool ok = ::fstat(fd, &st) == 0 && flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0;
  const int e = errno;
  if (!ok || S_ISDIR(st.st_mode)) {
    ::close(fd);
    TS_THROW(what, ": cannot read ", path, ": ", ok ? "is a directory" : std::strerror(e));
  }
  return fd;
}

std::string dangling_link_note(const std::string& path) {
  // The path as given, not lexically normalized: through a link, "a/.." is not the directory that holds a.
  for (fs::path p(path); !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::is_symlink(p, ec)) {
      const bool resolves = fs::exists(p, ec);
      if (ec || resolves) return "";  // a loop (ELOOP) or a live link: not this note's case
      fs::path target = fs::read_symlink(p, ec);
      if (ec) return "";
      if (target.is_relative()) target = (p.parent_path() / target).lexically_normal();  // as the user would ls it
      return " (" + p.string() + " is a symbolic link to " + target.string() + ", which does not resolve)";
    }
    if (p == p.parent_path()) break;  // the root
  }
  return "";
}

namespace {
// Bytes (std::vector<uint8_t>) or text (std::string): read straight into the result, without a second copy.
template <typename Bytes>
Bytes read_whole_file(const std::string& path, const char* what, const volatile std::sig_atomic_t* stop = nullptr,
                      bool stop_at_nul = false) {
  const int fd = open_for_reading(path, what, /*wait_for_writer=*/true);
  std::FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    TS_THROW(what, ": cannot read ", path, ": ", std::strerror(e));
  }
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
      if (stop && *stop) {
        std::fclose(f);
        TS_THROW(what, ": reading ", path, " was interrupted");
      }
      const size_t n = std::fread(out.data() + len, 1, out.size() - len, f);
      if (n == 0) break;
      len += n;
      if (stop_at_nul && std::memchr(out.data() + len - n, 0, n) != nullptr) break;
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

std::string read_file_text(const std::string& path, const char* what, const volatile std::sig_atomic_t* stop,
                           bool stop_at_nul) {
  return read_whole_file<std::string>(path, what, stop, stop_at_nul);
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

// Where write_file_atomic puts the bytes for `path`. A regular file, or a new name: replaced by a rename. A symlink:
// the file it leads to (created when the link dangles), so that the link stays a link. Anything else (a character
// device such as /dev/null, a FIFO), and any path under /dev or /proc (/dev/stdout, /proc/self/fd/1: a
// redirected stdout may be a regular file, which a rename would replace): written in place, appended, as a shell's
// `>>` would; a rename put a regular file in its place, and as root `--out /dev/null` replaced the system's
// /dev/null. A block device is refused: tessera never means to write one.
struct OutputTarget {
  std::string path;
  bool in_place = false;
};
OutputTarget output_target(const std::string& path) {
  const auto special = [](const fs::path& p) {
    const std::string s = p.string();
    return s.starts_with("/dev/") || s.starts_with("/proc/");
  };
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  TS_CHECK(!exists || !S_ISBLK(st.st_mode), "cannot write ", path, ": it is a block device");
  if (exists && (!S_ISREG(st.st_mode) || special(fs::absolute(path)))) return {path, true};  // a directory: EISDIR
  // The end of the symlink chain, followed by hand: canonical() needs the target to exist, and weakly_canonical()
  // stops before a dangling link. A relative link is taken from the link's directory, as the kernel does; the
  // result is not normalized lexically (`dir/../x` through a symlinked dir is not `x`).
  fs::path p(path);
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    TS_CHECK(hops < 40, "cannot write ", path, ": ", std::strerror(ELOOP));
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
    if (special(to)) return {path, true};
  }
  return {p.string(), false};
}

// Opens an existing non-regular `path` for writing in place, appending. A FIFO with no reader is refused at once
// (O_NONBLOCK: ENXIO) instead of waiting for one; the descriptor is then made blocking for the writes.
std::FILE* open_in_place(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return nullptr;
  }
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    errno = e;
  }
  return f;
}
}  // namespace

namespace {
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}
}  // namespace

void OutputFiles::claim(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  const fs::path p = resolved(path);
  for (const Taken& t : taken_) {
    const fs::path rel = p.lexically_relative(t.path);
    const bool inside = t.dir && !rel.empty() && *rel.begin() != "..";
    TS_CHECK(p != t.path && !inside, flag, " ", path, " is ", t.dir ? "inside " : "also ", t.owner);
  }
  taken_.push_back({p, flag + "'s file", false});
}
void OutputFiles::protect(const std::string& path, const std::string& what) {
  if (!path.empty()) taken_.push_back({resolved(path), what, false});
}
void OutputFiles::protect_dir(const std::string& dir, const std::string& what) {
  if (!dir.empty()) taken_.push_back({resolved(dir), what, true});
}

void check_file_writable(const std::string& path, const std::string& what) {
  const OutputTarget target = output_target(path);
  if (target.in_place) {
    // Asked, not opened: opening and closing a FIFO's write end would end its reader's input before the write.
    TS_CHECK(::access(target.path.c_str(), W_OK) == 0, what, " ", path, ": cannot write there: ", std::strerror(errno));
    return;
  }
  const std::string tmp = atomic_temp_path(target.path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TS_CHECK(fd >= 0 || errno == EEXIST, what, " ", path, ": cannot write there: ", std::strerror(errno));
  if (fd >= 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
  }
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const OutputTarget target = output_target(path);
  const std::string tmp = target.in_place ? target.path : atomic_temp_path(target.path);
  std::FILE* f = target.in_place ? open_in_place(tmp) : std::fopen(tmp.c_str(), "wb");
  TS_CHECK(f, "cannot write ", path, ": ", std::strerror(errno));
  const auto discard = [&] {
    if (!target.in_place) std::remove(tmp.c_str());
  };
  bool ok = true;
  try {
    write(f);
  } catch (...) {
    std::fclose(f);
    discard();
    throw;
  }
  // A device or a pipe cannot be synced (EINVAL, EROFS); what it took is what it took.
  ok = std::fflush(f) == 0 && (::fsync(::fileno(f)) == 0 || (target.in_place && (errno == EINVAL || errno == EROFS)));
  int saved_errno = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    saved_errno = errno;  // the close's own reason (a deferred write error), not a tolerated fsync's
  }
  if (!ok) {
    discard();
    TS_THROW("cannot write ", path, ": ", std::strerror(saved_errno));
  }
  if (target.in_place) return;
  if (std::rename(tmp.c_str(), target.path.c_str()) != 0) {
    const int e = errno;
    discard();
    TS_THROW("cannot write ", path, ": ", std::strerror(e));
  }
  const fs::path written(target.path);
  fsync_dir((written.has_parent_path() ? written.parent_path() : fs::path(".")).string());
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  write_file_atomic(path, [&](std::FILE* f) {
    TS_CHECK(size == 0 || std::fwrite(data, 1, size, f) == size, "cannot write ", path, ": ", std::strerror(errno));
  });
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what, const std::string& busy, Mode mode)
    : dir_(dir), what_(what), busy_(busy) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TS_CHECK(fd_ >= 0, "cannot open ", what, " ", dir, ": ", std::strerror(errno));
  if (::flock(fd_, (mode == Mode::Shared ? LOCK_SH : LOCK_EX) | LOCK_NB) == 0) return;
  const int e = errno;
  ::close(fd_);
  fd_ = -1;
  if (e == EWOULDBLOCK) throw_in_use();
  // A file system that locks no directories (NFS: EBADF on one opened read-only; Lustre without -o flock: ENOSYS)
  // runs unlocked: refusing there would stop every run in a home or scratch directory.
  if (e == EBADF || e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP || e == EINVAL) return;
  TS_THROW("cannot lock ", what, " ", dir, ": ", std::strerror(e));
}

void DirectoryLock::share() {
  if (fd_ < 0) return;  // a file system without directory locks: nothing held
  if (::flock(fd_, LOCK_SH | LOCK_NB) == 0) return;
  const int e = errno;
  TS_CHECK(e == EWOULDBLOCK, "cannot lock ", what_, " ", dir_, ": ", std::strerror(e));
  throw_in_use();
}

void DirectoryLock::throw_in_use() const {
  throw DirectoryInUse(__FILE__, __LINE__, what_ + " " + dir_ + " is in use by another tessera process " + busy_);
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
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

std::vector<fs::path> create_dirs_recorded(const std::string& dir, bool* made_dir) {
  // Not lexically normalized: "link/../run" is run beside the link's target, as the kernel resolves it.
  fs::path target = fs::absolute(dir);
  while (target.has_parent_path() && target.filename().empty()) target = target.parent_path();  // "out/": out
  std::vector<fs::path> chain;  // target, its parent, ..., the root
  for (fs::path p = target; !p.empty(); p = p.parent_path()) {
    chain.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::vector<fs::path> made;
  bool target_made = false;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    if (::mkdir(it->c_str(), 0777) == 0) {
      made.push_back(*it);
      target_made = it + 1 == chain.rend();
    }
  try {
    ensure_writable_dir(dir);  // words the error of a mkdir that failed otherwise than EEXIST
  } catch (...) {
    // dir itself was not made (or is not writable): the parents made on the way go again, each only when empty.
    std::error_code ec;
    for (auto it = made.rbegin(); it != made.rend(); ++it) fs::remove(*it, ec);
    throw;
  }
  if (made_dir) *made_dir = target_made;
  return made;
}

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  // A file in its place is said as such, not in mkdir's words ("cannot create output directory F: Not a
  // directory"), as if making the directory had failed; the path is simply not a directory, as train's own check says.
  TS_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "output path ", dir, " is not a directory");
  fs::create_directories(dir, ec);
  // A symbolic link to nothing (the path or a directory above it): mkdir's "File exists" alone named a path that
  // `ls` shows empty.
  TS_CHECK(!ec, "cannot create output directory ", dir, ": ", ec.message(), dangling_link_note(dir));
  TS_CHECK(fs::is_directory(dir), "output path ", dir, " is not a directory");
  TS_CHECK(::access(dir.c_str(), W_OK) == 0, "output directory ", dir, " is not writable: ", std::strerror(errno));
}

std::string filesystem_error_message(const std::filesystem::filesystem_error& e) {
  if (e.path1().empty()) return e.code().message();
  return "cannot access " + e.path1().string() + ": " + e.code().message();
}

}  // namespace tessera
