#include "tessera/train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera {

std::string format_duration(double s) {
  char buf[32];
  const long long t = s > 0 ? std::llround(std::min(s, 99999.0 * 3600 + 59 * 60)) : 0;  // NaN: not > 0
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

std::string progress_line(int64_t done, int64_t total, const char* unit, const std::string& fields,
                          const std::string& time, int columns) {
  constexpr int kWidth = 24, kMinWidth = 8;
  const std::string count = std::string(unit) + " " + std::to_string(done) + "/" + std::to_string(total);
  std::string f = fields;
  auto compose = [&](int width) {
    const int filled = total > 0 ? static_cast<int>(width * std::clamp<int64_t>(done, 0, total) / total) : 0;
    std::string line = "[";  // appended: GCC 12 warns (-Wrestrict, a false positive) on "[" + std::string(...)
    line.append(filled, '#').append(width - filled, '.').append("] ").append(count);
    if (!f.empty()) line += " | " + f;
    return line + " | " + time;
  };
  std::string line = compose(kWidth);
  if (columns <= 0) return line;
  const size_t room = static_cast<size_t>(columns) - 1;  // never the last column
  if (line.size() <= room) return line;
  const int width = std::max(kMinWidth, kWidth - static_cast<int>(line.size() - room));
  line = compose(width);
  // Then whole fields from the end (" | " apart: a cut inside one left "... | lr 3.0 | | ETA"), the first one last.
  while (line.size() > room && !f.empty()) {
    const size_t bar = f.rfind(" | ");
    f = bar == std::string::npos ? "" : f.substr(0, bar);
    line = compose(width);
  }
  // A very narrow terminal: then the bar goes, then the time, then the unit. Each goes whole: a cut at the last
  // column had left "ETA 0" of "ETA 0m45s", a time off by its unit, or "step 5" of "step 500/1000".
  if (line.size() > room) line = count + " | " + time;
  if (line.size() > room) line = count;
  if (line.size() > room) line = count.substr(count.find(' ') + 1);  // the unit is one word
  if (line.size() > room) line.clear();
  return line;
}

namespace {
// stderr's width in columns, or 0 when it is not a terminal that says.
int terminal_columns() {
  winsize w{};
  return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 ? w.ws_col : 0;
}
}  // namespace

ProgressBar::ProgressBar(int64_t total, int64_t start, bool enabled, ProgressFormat format)
    : total_(total), start_(start), enabled_(enabled), tty_(::isatty(STDERR_FILENO)), format_(format),
      t0_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t done, const std::string& fields) {
  if (!enabled_ || total_ <= 0) return;
  const int64_t every = total_ >= 20 ? total_ / 20 : 1;
  if (!tty_ && done != total_ && done % every != 0) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const int64_t since = done - start_;
  const double eta = since > 0 ? elapsed / since * (total_ - done) : 0.0;
  const std::string time = format_.eta ? "ETA " + format_duration(eta) : format_duration(elapsed) + " elapsed";
  const std::string line = progress_line(done, total_, format_.unit, fields, time, tty_ ? terminal_columns() : 0);
  std::fprintf(stderr, "%s%s%s", tty_ ? "\r" : "", line.c_str(), tty_ ? "\033[K" : "\n");
  std::fflush(stderr);
  last_printed_ = done;
}

void ProgressBar::finish() {
  if (enabled_ && tty_ && last_printed_ >= 0) std::fprintf(stderr, "\n");
  last_printed_ = -1;  // once
}

}  // namespace tessera
