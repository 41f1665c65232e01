// The grouped bar chart of bench compare read back pixel by pixel: each bar's top at the height of its value and
// nothing of its colour above it, a missing value without a bar, the groups side by side in their order, and bad
// input refused.
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/bench/bar_chart.h"
#include "tessera/core/error.h"

namespace tessera {
namespace {

TEST(BarChart, EachBarReachesItsValueAndAMissingOneHasNone) {
  const std::vector<BarSeries> series = {{"tessera", kColorTessera},
                                         {"torch eager", kColorTorchEager},
                                         {"torch compile", kColorTorchCompile}};
  const std::vector<BarGroup> groups = {{"tiny", {2.5, 10.0, 5.0}},
                                        {"gpt2-124m", {40.0, std::nullopt, 80.0}},
                                        {"cs336-small", {0.0, 60.0, 30.0}}};
  BarChartLayout L;
  const Image img = bar_chart("title", "step ms", series, groups, &L);
  ASSERT_EQ(img.width(), kBarChartWidth);
  ASSERT_EQ(img.height(), kBarChartHeight);
  EXPECT_GE(L.y_max, 80.0);
  EXPECT_LT(L.y_max, 80.0 * 1.5);
  int prev_left = -1;
  for (int g = 0; g < 3; ++g)
    for (int s = 0; s < 3; ++s) {
      const int left = L.bar_left(g, s), xc = left + L.bar_w / 2;
      EXPECT_GT(left, prev_left) << g << "," << s;  // groups in order, series in order within each
      prev_left = left + L.bar_w - 1;
      const std::optional<double>& v = groups[g].values[s];
      const Rgb c = series[s].color;
      int top = -1;  // the highest pixel of the bar's colour in its middle column
      for (int y = 0; y < L.y1 && top < 0; ++y)
        if (img.at(xc, y) == c) top = y;
      if (!v || *v == 0) {
        EXPECT_EQ(top, -1) << "no bar for group " << g << " series " << s;
        continue;
      }
      EXPECT_EQ(top, L.value_y(*v)) << g << "," << s;
      // Filled down to the zero line.
      for (int y = top; y < L.y1; ++y) ASSERT_EQ(img.at(xc, y), c) << g << "," << s << " y " << y;
    }
}

TEST(BarChart, RefusesValuesThatDoNotFitTheSeries) {
  const std::vector<BarSeries> series = {{"tessera", kColorTessera}};
  EXPECT_THROW(bar_chart("t", "ms", series, {{"tiny", {1.0, 2.0}}}), Error);
  EXPECT_THROW(bar_chart("t", "ms", series, {{"tiny", {-1.0}}}), Error);
  EXPECT_THROW(bar_chart("t", "ms", series, {}), Error);
  // Nothing but missing values: an empty chart, not a division by zero.
  const Image img = bar_chart("t", "ms", series, {{"tiny", {std::nullopt}}});
  EXPECT_EQ(img.width(), kBarChartWidth);
}

}  // namespace
}  // namespace tessera
