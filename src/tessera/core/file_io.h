// tessera/core/file_io.h — whole-file reads and atomic writes (temp file, fsync, rename).
#pragma once
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/error.h"

namespace tessera {

// Opens `path` for reading, as a blocking descriptor. A directory is refused ("is a directory"). A FIFO: with
// wait_for_writer, open() waits for a writer, as `cat` does (a producer started after tessera is the usual way to
// feed one, and reading it as empty would race it); without, it does not wait (a FIFO where a checkpoint or a shard
// belongs hung in open() forever) and the caller refuses what is not a regular file. Throws Error
// "<what>: cannot read <path>: <reason>".
int open_for_reading(const std::string& path, const char* what, bool wait_for_writer = false);
// Reads a whole file; throws Error "<what>: cannot read <path>: <reason>" when missing or unreadable.
std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what = "file");
// `stop`: a signal flag (ScopedSignals) checked between the reads; once it is set the read ends with an Error, so
// that an endless input (a pipe from `yes`) cannot hold off Ctrl-C until memory runs out. `stop_at_nul`: the read
// ends after the first block (at most 64 KiB past the file's reported size) that holds a NUL byte, which no text
// has: the caller's text check then refuses the input at that byte. Without it --text /dev/zero and /dev/urandom
// would be read until memory ran out, to be refused for their first byte.
std::string read_file_text(const std::string& path, const char* what = "file",
                           const volatile std::sig_atomic_t* stop = nullptr, bool stop_at_nul = false);

// What to add to "<path> does not exist" when `path`, or a directory on it, is a symbolic link whose target does not
// resolve: " (<link> is a symbolic link to <target>, which does not resolve)", a relative target shown from the
// working directory; else "" (a link loop included: fs::exists throws ELOOP before this is asked). fs::exists
// follows links, so a dangling one would read as a plain missing path while ls shows it there.
std::string dangling_link_note(const std::string& path);

// Writes `path` atomically: the bytes go to a temporary file beside it, which is flushed to disk and then
// renamed over `path`, so a reader sees the old file or the new one, never a half-written one. The directory
// is synced after the rename, so the new name survives a power loss too. A symlink's target is written so (the
// link stays); a device, a FIFO or a path under /dev or /proc is written in place, appended (file_io.cpp,
// output_target). `write` receives the open FILE* it writes.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write);
void write_file_atomic(const std::string& path, const void* data, size_t size);
void write_file_atomic(const std::string& path, const std::string& text);

// Checks, before any work, that write_file_atomic(path) could write: creates and removes the temporary file it
// would use beside `path` (for an in-place target, asks access(W_OK) without opening it). Throws Error "<what>
// <path>: cannot write there: <reason>" where the file system refuses (a directory that root may "access" but that
// takes no files, such as /proc; a read-only mount; a full disk of inodes).
void check_file_writable(const std::string& path, const std::string& what);

// The files a command will write, one per flag. claim() throws Error "<flag> <path> is also <owner>" when `path`
// names a file already claimed or protected (resolved against the working directory: "x", "./x" and "d/../x"
// alike), else records it under `flag`; an empty path is skipped. protect() records a file the command reads or
// writes itself (train's metrics.jsonl, its data) under a description of what it is; protect_dir() every file in a
// directory (train's checkpoints).
class OutputFiles {
 public:
  void claim(const std::string& flag, const std::string& path);
  void protect(const std::string& path, const std::string& what);
  void protect_dir(const std::string& dir, const std::string& what);

 private:
  struct Taken {
    std::filesystem::path path;
    std::string owner;
    bool dir = false;
  };
  std::vector<Taken> taken_;
};

// What DirectoryLock throws when another process holds the lock (and only then).
class DirectoryInUse : public Error {
 public:
  using Error::Error;
};

// An advisory lock (flock) on a directory, held while the object lives and released by the kernel when the process
// ends however it ends. Exclusive: one train writes a run directory (two wrote its checkpoints and metrics, and died
// with errors about each other's temporary files), and one prepare writes a shard directory. Shared: the trains
// that read a shard directory, so that a prepare cannot replace the shards under them. Throws DirectoryInUse
// "<what> <dir> is in use by another tessera process <busy>" when a conflicting one is held; on a file system that
// cannot lock a directory (NFS, Lustre without flock) it holds nothing.
class DirectoryLock {
 public:
  enum class Mode { Exclusive, Shared };
  // busy: who may hold the lock and what to do, for the message ("(a train into it): wait for it to end").
  DirectoryLock(const std::string& dir, const std::string& what, const std::string& busy, Mode mode = Mode::Exclusive);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  // Exclusive to shared, on the same descriptor (train holds its OUT/data exclusively while it prepares the text
  // there, then shared while it reads it). flock converts by dropping the lock first: a prepare that takes it in
  // that instant gets DirectoryInUse thrown here.
  void share();

 private:
  [[noreturn]] void throw_in_use() const;

  int fd_ = -1;
  std::string dir_, what_, busy_;
};

// fsync of a directory: makes the renames and creations done in it durable.
void fsync_dir(const std::string& dir);

// Creates `dir` (and parents) if needed and checks that a file can be created in it.
void ensure_writable_dir(const std::string& dir);

// ensure_writable_dir, returning the directories on dir's path that this call's own mkdir made, outermost first, for
// a command to remove again if it fails (*made_dir, when given: whether dir itself is among them; "new/../old" makes
// only new). When it throws, what it made is removed again. Not "each that did not exist a moment
// before": two runs started at once into the same new directory would both see it missing, and the one refused by
// the other would remove the directory the other works in; and a symbolic link to nothing does not "exist" either,
// so a failed prepare into one would remove the user's link.
std::vector<std::filesystem::path> create_dirs_recorded(const std::string& dir, bool* made_dir = nullptr);

// The one-line error for a path that the file system refuses (a name too long, a directory not searchable), as
// std::filesystem reports it: "cannot access PATH: File name too long", without the library's "filesystem error:
// status: ..." wording. The CLI prints it as bad input, in one process (main) and under mpirun (run_collectively).
std::string filesystem_error_message(const std::filesystem::filesystem_error& e);

}  // namespace tessera
