// tessera/core/error.h — the one failure path of the engine.
//
// Every precondition and every library call that can fail goes through TS_CHECK / TS_CHECK_CUDA and throws
// tessera::Error, which carries the file, the line and a message a user can act on. The CLI catches it,
// prints one line and exits with code 2.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& msg) : std::runtime_error(msg), file_(file), line_(line) {}
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* file_;
  int line_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace tessera

#define TS_THROW(...) throw ::tessera::Error(__FILE__, __LINE__, ::tessera::detail::concat(__VA_ARGS__))

#define TS_CHECK(cond, ...) \
  do { \
    if (!(cond)) { \
      TS_THROW(__VA_ARGS__); \
    } \
  } while (0)
