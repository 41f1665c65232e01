// tessera/bench/memory_timeline.h — the CS336 assignment's memory-profile figure for one training step, drawn
// without Python: one point per op of the step (the events of gpt_plan.h; the last, the end of the step, is where
// AdamW runs), the phases forward / backward / optimizer shaded, and as series
//   - static: parameters, master weights and AdamW's moments, held for the whole step, and the gradients when they
//     have a buffer of their own (filled grey);
//   - planned: static + the bytes the plan has live at the op (the step line, dark blue): the activations, and the
//     gradients when they are planned in the arena (GradMemory::Planned, training without accumulation), which
//     then rise through the backward as each range is born;
//   - allocated: static + the activation arena (the plan's peak, dashed red): what tessera holds;
//   - measured (GPU only): the device memory in use above the baseline at the end of each phase (green).
// The CSV beside the PNG has one line per point with every series in bytes.
#pragma once
#include <string>
#include <vector>

#include "tessera/bench/model.h"
#include "tessera/bench/png.h"
#include "tessera/train/memory_record.h"

namespace tessera {

// Where the plot area sits in the image and what its y axis spans, for tests that read pixels back.
struct PlotLayout {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;          // plot area [x0, x1) x [y0, y1); y1 is the zero line
  double y_max = 0;                            // bytes at y0
  int event_x(int event, int n_events) const;  // the left edge of an event's slot
  int bytes_y(double bytes) const;
};

// The colours, for the tests.
inline constexpr Rgb kColorForward{219, 233, 246}, kColorBackward{253, 230, 204}, kColorOptimizer{220, 242, 220},
    kColorStatic{200, 200, 200}, kColorPlanned{31, 60, 150}, kColorAllocated{200, 40, 40}, kColorMeasured{20, 140, 60};

std::string memory_timeline_csv(const std::vector<MemoryTimelinePoint>& points);
// `title` as one line, or as two where it is wider than `max_width` pixels at the plot's text scale: broken after the
// last ", " or before the last " (" that fits, else mid-word. The second line is not wrapped again.
std::vector<std::string> wrap_title(const std::string& title, int max_width);

Image memory_timeline_plot(const std::vector<MemoryTimelinePoint>& points, const std::string& title,
                           PlotLayout* layout = nullptr);
// Both files, each written atomically.
void write_memory_timeline(const std::string& png_path, const std::string& csv_path,
                           const std::vector<MemoryTimelinePoint>& points, const std::string& title);

}  // namespace tessera
