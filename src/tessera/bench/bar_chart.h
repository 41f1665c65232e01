// tessera/bench/bar_chart.h — a grouped bar chart drawn with the project's own PNG writer (png.h), for
// `tessera bench compare`: one group per model size, one bar per series (tessera's step ms, PyTorch eager,
// torch.compile), each bar labelled with its value; a value that is missing (a peer that did not run, an OOM)
// has no bar and a "-" on the baseline. The y axis is linear from 0 to a round number above the largest value.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tessera/bench/png.h"

namespace tessera {

inline constexpr int kBarChartWidth = 1000, kBarChartHeight = 600;

// The colours bench compare draws its series with (for the tests).
inline constexpr Rgb kColorTessera{40, 90, 170}, kColorTorchEager{230, 140, 30}, kColorTorchCompile{60, 160, 80};

struct BarSeries {
  std::string label;
  Rgb color;
};

struct BarGroup {
  std::string label;
  std::vector<std::optional<double>> values;  // one per series; nullopt: no bar
};

// Where the bars sit, for tests that read pixels back.
struct BarChartLayout {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // plot area [x0, x1) x [y0, y1); y1 is the zero line
  double y_max = 0;                    // the value at y0
  int n_groups = 0, n_series = 0;
  int bar_w = 0;  // one bar's slot in pixels (the bar leaves a pixel free each side)
  int bar_left(int group, int series) const;
  int value_y(double v) const;
};

// kBarChartWidth x kBarChartHeight. Every group holds one value per series; values are >= 0.
Image bar_chart(const std::string& title, const std::string& y_label, const std::vector<BarSeries>& series,
                const std::vector<BarGroup>& groups, BarChartLayout* layout = nullptr);

}  // namespace tessera
