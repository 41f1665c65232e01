// tessera/train/progress.h — a one-line progress bar on stderr (a line every 5% when stderr is not a TTY), for
// train's steps and bench attention's configurations.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace tessera {

// How the bar counts: "[#####...] step 40/1000 | <fields> | ETA 2m10s".
struct ProgressFormat {
  const char* unit = "step";
  // The time left from the mean time of the items so far; false: the time elapsed instead ("12s elapsed"), for
  // items of very different lengths, where that mean says nothing about the rest.
  bool eta = true;
};

class ProgressBar {
 public:
  ProgressBar(int64_t total, int64_t start, bool enabled, ProgressFormat format = {});
  // Ends the bar's line, so that an error unwinding through the loop starts on a line of its own.
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // `fields` is shown after the bar, e.g. "loss 2.31 | 41.2k tok/s".
  void update(int64_t done, const std::string& fields);
  void finish();

 private:
  int64_t total_, start_;
  bool enabled_, tty_;
  ProgressFormat format_;
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

// "42s", "3m05s", "2h07m": seconds rounded, at most 99999h59m (a run of 2^31 steps overflowed an int into
// "ETA -2147483648s"); a negative or NaN duration is "0s".
std::string format_duration(double seconds);

// The bar's line, "[####....] step 40/1000 | <fields> | <time>", fitted to `columns` (0: no limit): past them the
// bar narrows to 8 cells, then whole fields go from the end, so that the line stays short of the last column.
// A terminal wraps a line that reaches it, and the next \r then redraws only the wrapped row: at 80 columns the
// 91-character training line left one line per step.
std::string progress_line(int64_t done, int64_t total, const char* unit, const std::string& fields,
                          const std::string& time, int columns);

}  // namespace tessera
