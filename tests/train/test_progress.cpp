// The progress bar's line: fitted to the terminal's width, and durations that do not overflow.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tessera/train/progress.h"

namespace tessera {
namespace {

const std::string kFields = "loss 1.4405 | lr 3.00e-04 | 4.6k tok/s";

TEST(Progress, LineIsWholeWithoutAWidth) {
  EXPECT_EQ(progress_line(1000, 1000, "step", kFields, "ETA 0s", 0),
            "[########################] step 1000/1000 | loss 1.4405 | lr 3.00e-04 | 4.6k tok/s | ETA 0s");
  EXPECT_EQ(progress_line(10, 40, "config", "", "3s elapsed", 0),
            "[######..................] config 10/40 | 3s elapsed");
  // Wide enough: unchanged.
  EXPECT_EQ(progress_line(1000, 1000, "step", kFields, "ETA 0s", 200),
            progress_line(1000, 1000, "step", kFields, "ETA 0s", 0));
}

// The training line is 91 characters: at 80 columns it wrapped, and each \r redrew only the wrapped row, leaving a
// line per step. It must stay short of the last column, keep its count and its time, and narrow the bar first.
TEST(Progress, LineFitsShortOfTheLastColumn) {
  const std::string full = progress_line(500, 1000, "step", kFields, "ETA 1m05s", 0);
  ASSERT_GT(full.size(), 80u);
  for (int columns : {200, 91, 90, 80, 79, 60, 40, 30, 20, 5, 1}) {
    SCOPED_TRACE(columns);
    const std::string line = progress_line(500, 1000, "step", kFields, "ETA 1m05s", columns);
    EXPECT_LT(line.size(), static_cast<size_t>(columns));
    if (columns > 40) {
      EXPECT_NE(line.find("] step 500/1000 | "), std::string::npos) << line;
      EXPECT_TRUE(line.ends_with(" | ETA 1m05s")) << line;
    }
  }
  // At 80 columns the bar narrows by the 14 characters too many, to 10 cells (half of them filled), and the
  // fields are whole: 79 characters.
  const std::string at80 = progress_line(500, 1000, "step", kFields, "ETA 1m05s", 80);
  EXPECT_EQ(at80, "[#####.....] step 500/1000 | " + kFields + " | ETA 1m05s");
  // Narrower, the bar is at its narrowest and whole fields go from the end (a cut inside one left a dangling " |").
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 65),
            "[####....] step 500/1000 | loss 1.4405 | lr 3.00e-04 | ETA 1m05s");
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 64),
            "[####....] step 500/1000 | loss 1.4405 | ETA 1m05s");
  // At 40 no field fits: they go, with their separator.
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 40), "[####....] step 500/1000 | ETA 1m05s");
  // Narrower still, the bar goes, then the time, then the unit, each whole: a cut at the last column had shown
  // "ETA 1m0" for "ETA 1m05s" at 34 columns.
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 36), "step 500/1000 | ETA 1m05s");
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 26), "step 500/1000 | ETA 1m05s");
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 25), "step 500/1000");
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 10), "500/1000");
  EXPECT_EQ(progress_line(500, 1000, "step", kFields, "ETA 1m05s", 5), "");
}

TEST(Progress, DurationsDoNotOverflow) {
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(2147483648.0), "99999h59m");  // 2^31 s: an int's "ETA -2147483648s" before
  EXPECT_EQ(format_duration(1e300), "99999h59m");
  EXPECT_EQ(format_duration(INFINITY), "99999h59m");
  EXPECT_EQ(format_duration(-5), "0s");
  EXPECT_EQ(format_duration(NAN), "0s");
}

}  // namespace
}  // namespace tessera
