#include "tessera/train/progress.h"

#include <unistd.h>

#include <cstdio>

namespace tessera {

std::string format_duration(double s) {
  char buf[32];
  const int t = static_cast<int>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ds", t);
  return buf;
}

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
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * done / total_);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  const std::string time = format_.eta ? "ETA " + format_duration(eta) : format_duration(elapsed) + " elapsed";
  std::fprintf(stderr, "%s[%s] %s %lld/%lld | %s | %s%s", tty_ ? "\r" : "", bar.c_str(), format_.unit,
               static_cast<long long>(done), static_cast<long long>(total_), fields.c_str(), time.c_str(),
               tty_ ? "\033[K" : "\n");
  std::fflush(stderr);
  last_printed_ = done;
}

void ProgressBar::finish() {
  if (enabled_ && tty_ && last_printed_ >= 0) std::fprintf(stderr, "\n");
  last_printed_ = -1;  // once
}

}  // namespace tessera
