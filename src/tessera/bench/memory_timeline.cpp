#include "tessera/bench/memory_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {

namespace {

constexpr int kWidth = 1200, kHeight = 660, kScale = 2;
constexpr int kLeft = 140, kRight = 30, kTop = 60, kBottom = 170;

Rgb phase_color(const std::string& phase) {
  return phase == "forward" ? kColorForward : phase == "backward" ? kColorBackward : kColorOptimizer;
}

// A CSV field, quoted when it holds a comma, a quote or a newline (RFC 4180).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

int PlotLayout::event_x(int event, int n_events) const {
  return x0 + static_cast<int>(std::lround(static_cast<double>(event) * (x1 - x0) / n_events));
}

int PlotLayout::bytes_y(double bytes) const { return y1 - static_cast<int>(std::lround(bytes / y_max * (y1 - y0))); }

std::string memory_timeline_csv(const std::vector<MemoryTimelinePoint>& points) {
  std::string csv =
      "event,phase,op,activations_live_bytes,static_bytes,planned_total_bytes,allocated_bytes,"
      "measured_bytes\n";
  for (const MemoryTimelinePoint& p : points) {
    csv += std::to_string(p.event) + "," + p.phase + "," + csv_field(p.name) + "," +
           std::to_string(p.activations_live) + "," + std::to_string(p.static_bytes) + "," +
           std::to_string(p.planned_total()) + "," + std::to_string(p.static_bytes + p.arena) + "," +
           (p.measured ? std::to_string(*p.measured) : "") + "\n";
  }
  return csv;
}

std::vector<std::string> wrap_title(const std::string& title, int max_width) {
  // Characters that fit: a glyph advances 6 x scale, the last one is 5 x scale wide.
  const size_t fit = static_cast<size_t>(std::max(1, (max_width + kScale) / (6 * kScale)));
  if (title.size() <= fit) return {title};
  size_t cut = fit, next = fit;  // no break point: cut mid-word
  for (size_t i = 1; i + 1 < title.size() && i < fit; ++i) {
    if (title.compare(i, 2, ", ") == 0) cut = i + 1, next = i + 2;  // keep the comma on the first line
    else if (title.compare(i, 2, " (") == 0) cut = i, next = i + 1;
  }
  return {title.substr(0, cut), title.substr(next)};
}

Image memory_timeline_plot(const std::vector<MemoryTimelinePoint>& points, const std::string& title,
                           PlotLayout* layout_out) {
  TS_CHECK(!points.empty(), "memory timeline: no points");
  const int n = static_cast<int>(points.size());
  double top = 0;
  for (const MemoryTimelinePoint& p : points) {
    top = std::max({top, static_cast<double>(p.planned_total()), static_cast<double>(p.static_bytes + p.arena),
                    p.measured ? static_cast<double>(*p.measured) : 0.0});
  }
  top = std::max(top, 1.0);
  const double unit = top >= 1024.0 * 1024 * 1024 ? 1024.0 * 1024 * 1024
                      : top >= 1024.0 * 1024      ? 1024.0 * 1024
                                                  : 1024.0;
  const char* unit_name = unit > 1024.0 * 1024 ? " GIB" : unit > 1024.0 ? " MIB" : " KIB";
  const double step = nice_step(top * 1.05 / unit / 5) * unit;

  PlotLayout L;
  L.x0 = kLeft;
  L.x1 = kWidth - kRight;
  L.y0 = kTop;
  L.y1 = kHeight - kBottom;
  L.y_max = std::ceil(top * 1.05 / step) * step;
  Image img(kWidth, kHeight, kPlotWhite);

  // Phase bands, then the static part as a filled area.
  for (int e = 0; e < n; ++e)
    img.fill_rect(L.event_x(e, n), L.y0, L.event_x(e + 1, n), L.y1, phase_color(points[e].phase));
  for (int e = 0; e < n; ++e)
    img.fill_rect(L.event_x(e, n), L.bytes_y(static_cast<double>(points[e].static_bytes)), L.event_x(e + 1, n), L.y1,
                  kColorStatic);
  // Gridlines and y ticks.
  for (double v = 0; v <= L.y_max * (1 + 1e-9); v += step) {
    const int y = L.bytes_y(v);
    img.line(L.x0, y, L.x1 - 1, y, kPlotGrid, 1, /*dash=*/3);
    img.line(L.x0 - 8, y, L.x0, y, kPlotBlack);
    const std::string label = tick_label(v / unit) + unit_name;
    img.text(L.x0 - 12 - Image::text_width(label, kScale), y - 7, label, kPlotText, kScale);
  }
  // x ticks at event indices.
  const int xstep = static_cast<int>(nice_step(std::max(1.0, n / 10.0)));
  for (int e = 0; e < n; e += xstep) {
    const int x = (L.event_x(e, n) + L.event_x(e + 1, n)) / 2;
    img.line(x, L.y1, x, L.y1 + 8, kPlotBlack);
    const std::string label = std::to_string(e);
    img.text(x - Image::text_width(label, kScale) / 2, L.y1 + 14, label, kPlotText, kScale);
  }

  // The series: allocated (dashed), measured, planned (on top).
  auto step_line = [&](auto value, Rgb c, int thickness, int dash) {
    int prev_y = -1;
    for (int e = 0; e < n; ++e) {
      const double v = value(points[e]);
      if (v < 0) {
        prev_y = -1;
        continue;
      }
      const int y = L.bytes_y(v), xa = L.event_x(e, n), xb = L.event_x(e + 1, n) - 1;
      if (prev_y >= 0 && prev_y != y) img.line(xa, prev_y, xa, y, c, thickness);
      img.line(xa, y, std::max(xa, xb), y, c, thickness, dash);
      prev_y = y;
    }
  };
  step_line([](const MemoryTimelinePoint& p) { return static_cast<double>(p.static_bytes + p.arena); }, kColorAllocated,
            2, 8);
  step_line([](const MemoryTimelinePoint& p) { return p.measured ? static_cast<double>(*p.measured) : -1.0; },
            kColorMeasured, 3, 0);
  step_line([](const MemoryTimelinePoint& p) { return static_cast<double>(p.planned_total()); }, kColorPlanned, 3, 0);

  // Axes, phase names in their bands where they fit, the title, the axis label and the legend.
  img.line(L.x0, L.y0, L.x0, L.y1, kPlotBlack, 2);
  img.line(L.x0, L.y1, L.x1 - 1, L.y1, kPlotBlack, 2);
  for (const char* phase : {"forward", "backward", "optimizer"}) {
    int first = -1, last = -1;
    for (int e = 0; e < n; ++e)
      if (points[e].phase == phase) {
        if (first < 0) first = e;
        last = e;
      }
    if (first < 0) continue;
    const std::string label = phase;
    const int xa = L.event_x(first, n), xb = L.event_x(last + 1, n);
    if (Image::text_width(label, kScale) + 8 <= xb - xa)
      img.text((xa + xb - Image::text_width(label, kScale)) / 2, L.y0 + 8, label, kPlotText, kScale);
  }
  // The title from the left edge, on two lines above the plot where one is too wide for the image.
  const std::vector<std::string> title_lines = wrap_title("memory over one training step: " + title, kWidth - 40);
  for (size_t i = 0; i < title_lines.size(); ++i)
    img.text(20, (title_lines.size() == 1 ? 18 : 8) + static_cast<int>(i) * 20, title_lines[i], kPlotBlack, kScale);
  const std::string xlabel = "op of the step (event of the activation plan)";
  img.text((L.x0 + L.x1 - Image::text_width(xlabel, kScale)) / 2, L.y1 + 40, xlabel, kPlotText, kScale);
  const bool any_measured =
      std::any_of(points.begin(), points.end(), [](const auto& p) { return p.measured.has_value(); });
  struct Entry {
    Rgb c;
    const char* label;
  };
  const std::string static_label = points.empty() || points[0].static_holds.empty() ? "static buffers"
                                                                                    : points[0].static_holds;
  std::vector<Entry> legend = {{kColorForward, "forward"},
                               {kColorBackward, "backward"},
                               {kColorOptimizer, "optimizer (adamw)"},
                               {kColorStatic, static_label.c_str()},
                               {kColorPlanned, "planned: static + live activations"},
                               {kColorAllocated, "allocated: static + arena"}};
  if (any_measured) legend.push_back({kColorMeasured, "measured on the device"});
  int lx = L.x0, ly = L.y1 + 76;
  for (const Entry& en : legend) {
    const int w = 28 + Image::text_width(en.label, kScale) + 30;
    if (lx + w > kWidth - kRight) {
      lx = L.x0;
      ly += 28;
    }
    img.fill_rect(lx, ly, lx + 18, ly + 14, en.c);
    img.text(lx + 26, ly, en.label, kPlotText, kScale);
    lx += w;
  }
  if (layout_out) *layout_out = L;
  return img;
}

void write_memory_timeline(const std::string& png_path, const std::string& csv_path,
                           const std::vector<MemoryTimelinePoint>& points, const std::string& title) {
  write_png(png_path, memory_timeline_plot(points, title));
  write_file_atomic(csv_path, memory_timeline_csv(points));
}

}  // namespace tessera
