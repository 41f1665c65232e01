#include "tessera/bench/bar_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tessera/core/error.h"

namespace tessera {

namespace {

constexpr int kLeft = 110, kRight = 30, kTop = 80, kBottom = 130;

// A bar's label: three significant figures or the whole number.
std::string value_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f" : v < 100 ? "%.1f" : "%.0f", v);
  return buf;
}

// The larger of scales 2 and 1 at which `s` fits in `width` pixels (1 when neither does).
int text_scale(const std::string& s, int width) { return Image::text_width(s, 2) <= width ? 2 : 1; }

}  // namespace

int BarChartLayout::bar_left(int group, int series) const {
  const int group_w = (x1 - x0) / n_groups;
  return x0 + group * group_w + (group_w - n_series * bar_w) / 2 + series * bar_w;
}

int BarChartLayout::value_y(double v) const { return y1 - static_cast<int>(std::lround(v / y_max * (y1 - y0))); }

Image bar_chart(const std::string& title, const std::string& y_label, const std::vector<BarSeries>& series,
                const std::vector<BarGroup>& groups, BarChartLayout* layout_out) {
  TS_CHECK(!series.empty() && !groups.empty(), "bar chart: no series or no groups");
  double top = 0;
  for (const BarGroup& g : groups) {
    TS_CHECK(g.values.size() == series.size(), "bar chart: group ", g.label, " has ", g.values.size(), " values for ",
             series.size(), " series");
    for (const std::optional<double>& v : g.values) {
      TS_CHECK(!v || (std::isfinite(*v) && *v >= 0), "bar chart: ", g.label, " has a value that is not >= 0");
      if (v) top = std::max(top, *v);
    }
  }
  if (top <= 0) top = 1;
  const double step = nice_step(top * 1.1 / 5);

  BarChartLayout L;
  L.x0 = kLeft;
  L.x1 = kBarChartWidth - kRight;
  L.y0 = kTop;
  L.y1 = kBarChartHeight - kBottom;
  L.y_max = std::ceil(top * 1.1 / step) * step;
  L.n_groups = static_cast<int>(groups.size());
  L.n_series = static_cast<int>(series.size());
  const int group_w = (L.x1 - L.x0) / L.n_groups;
  L.bar_w = std::max(3, std::min(90, group_w * 3 / 4 / L.n_series));
  Image img(kBarChartWidth, kBarChartHeight, kPlotWhite);

  // Gridlines and y ticks.
  for (double v = 0; v <= L.y_max * (1 + 1e-9); v += step) {
    const int y = L.value_y(v);
    img.line(L.x0, y, L.x1 - 1, y, kPlotGrid, 1, /*dash=*/3);
    img.line(L.x0 - 8, y, L.x0, y, kPlotBlack);
    const std::string label = tick_label(v);
    img.text(L.x0 - 12 - Image::text_width(label, 2), y - 7, label, kPlotText, 2);
  }
  // The bars, each with its value above it (or "-" on the baseline), and the group's label below.
  for (int g = 0; g < L.n_groups; ++g) {
    for (int s = 0; s < L.n_series; ++s) {
      const int xa = L.bar_left(g, s), xc = xa + L.bar_w / 2;
      const std::optional<double>& v = groups[g].values[s];
      const std::string label = v ? value_label(*v) : "-";
      const int scale = text_scale(label, L.bar_w + 6);
      const int y = v ? L.value_y(*v) : L.y1;
      if (v) img.fill_rect(xa + 1, y, xa + L.bar_w - 1, L.y1, series[s].color);
      img.text(xc - Image::text_width(label, scale) / 2, y - 6 - 7 * scale, label, kPlotText, scale);
    }
    const std::string& label = groups[g].label;
    const int scale = text_scale(label, group_w - 4);
    img.text(L.x0 + g * group_w + (group_w - Image::text_width(label, scale)) / 2, L.y1 + 14, label, kPlotBlack, scale);
  }
  // Axes, the title, the axis label and the legend.
  img.line(L.x0, L.y0, L.x0, L.y1, kPlotBlack, 2);
  img.line(L.x0, L.y1, L.x1 - 1, L.y1, kPlotBlack, 2);
  img.text(L.x0, 18, title, kPlotBlack, 2);
  img.text(std::max(4, L.x0 - Image::text_width(y_label, 2) / 2), L.y0 - 34, y_label, kPlotText, 2);
  int lx = L.x0, ly = L.y1 + 56;
  for (const BarSeries& s : series) {
    const int w = 28 + Image::text_width(s.label, 2) + 30;
    if (lx + w > kBarChartWidth - kRight) {
      lx = L.x0;
      ly += 28;
    }
    img.fill_rect(lx, ly, lx + 18, ly + 14, s.color);
    img.text(lx + 26, ly, s.label, kPlotText, 2);
    lx += w;
  }
  if (layout_out) *layout_out = L;
  return img;
}

}  // namespace tessera
