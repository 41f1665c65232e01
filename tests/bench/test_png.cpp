// The PNG encoder's pieces against their standards' check values, the stored-deflate framing, and the memory
// timeline plot read back pixel by pixel: the planned line at the height of its bytes, the phases in their bands.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/bench/memory_timeline.h"
#include "tessera/bench/model.h"
#include "tessera/bench/png.h"
#include "tessera/core/memory.h"
#include "tessera/models/config.h"
#include "tessera/models/gpt.h"
#include "tessera/train/optimizer.h"

namespace tessera {
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t{b[at]} << 24 | uint32_t{b[at + 1]} << 16 | uint32_t{b[at + 2]} << 8 | b[at + 3];
}

TEST(Png, ChecksumsMatchTheirCheckValues) {
  const auto digits = bytes_of("123456789");
  EXPECT_EQ(crc32(digits.data(), digits.size()), 0xCBF43926u);  // the CRC-32 check value (ISO-HDLC)
  const auto wiki = bytes_of("Wikipedia");
  EXPECT_EQ(adler32(wiki.data(), wiki.size()), 0x11E60398u);  // RFC 1950's example, as Wikipedia gives it
  EXPECT_EQ(adler32(nullptr, 0), 1u);
  // CRC continued over two pieces equals the CRC of the whole.
  EXPECT_EQ(crc32(digits.data() + 4, 5, crc32(digits.data(), 4)), 0xCBF43926u);
}

TEST(Png, StoredDeflateBlocksFrameTheData) {
  std::vector<uint8_t> raw(70000);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<uint8_t> z = zlib_stored(raw);
  ASSERT_EQ(z.size(), 2 + (5 + 65535) + (5 + 4465) + 4u);
  EXPECT_EQ((z[0] << 8 | z[1]) % 31, 0);
  EXPECT_EQ(z[0] & 0x0f, 8);  // deflate
  // Block 1: not final, 65535 bytes; block 2: final, the rest. LEN little-endian, then its complement.
  EXPECT_EQ(z[2], 0);
  EXPECT_EQ(z[3] | z[4] << 8, 65535);
  EXPECT_EQ((z[5] | z[6] << 8) ^ 0xffff, 65535);
  EXPECT_TRUE(std::equal(raw.begin(), raw.begin() + 65535, z.begin() + 7));
  const size_t b2 = 7 + 65535;
  EXPECT_EQ(z[b2], 1);
  EXPECT_EQ(z[b2 + 1] | z[b2 + 2] << 8, 4465);
  EXPECT_EQ((z[b2 + 3] | z[b2 + 4] << 8) ^ 0xffff, 4465);
  EXPECT_TRUE(std::equal(raw.begin() + 65535, raw.end(), z.begin() + b2 + 5));
  EXPECT_EQ(be32(z, z.size() - 4), adler32(raw.data(), raw.size()));
  // Empty input: one final stored block of length 0.
  EXPECT_EQ(zlib_stored({}), (std::vector<uint8_t>{0x78, 0x01, 1, 0, 0, 0xff, 0xff, 0, 0, 0, 1}));
}

TEST(Png, FileHasHeaderChunksWithTheirCrcs) {
  Image img(3, 2, {10, 20, 30});
  img.set(2, 1, {200, 100, 50});
  const std::vector<uint8_t> f = png_encode(img);
  ASSERT_GE(f.size(), 8u + 25 + 12 + 12);
  EXPECT_EQ(std::vector<uint8_t>(f.begin(), f.begin() + 8),
            (std::vector<uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}));
  size_t pos = 8;
  std::vector<std::string> types;
  std::vector<uint8_t> idat;
  while (pos < f.size()) {
    const uint32_t len = be32(f, pos);
    types.emplace_back(f.begin() + static_cast<long>(pos) + 4, f.begin() + static_cast<long>(pos) + 8);
    EXPECT_EQ(be32(f, pos + 8 + len), crc32(f.data() + pos + 4, len + 4)) << types.back();
    if (types.back() == "IHDR") {
      EXPECT_EQ(be32(f, pos + 8), 3u);
      EXPECT_EQ(be32(f, pos + 12), 2u);
      EXPECT_EQ(f[pos + 16], 8);  // bit depth
      EXPECT_EQ(f[pos + 17], 2);  // RGB
    }
    if (types.back() == "IDAT")
      idat.assign(f.begin() + static_cast<long>(pos) + 8, f.begin() + static_cast<long>(pos + 8 + len));
    pos += 12 + len;
  }
  EXPECT_EQ(pos, f.size());
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  // The scanlines, each with filter byte 0, are the only stored block.
  const std::vector<uint8_t> raw = {0, 10, 20, 30, 10, 20, 30, 10, 20, 30, 0, 10, 20, 30, 10, 20, 30, 200, 100, 50};
  EXPECT_EQ(idat, zlib_stored(raw));
}

TEST(Png, LinesAndTextStayInsideTheImage) {
  Image img(20, 10, {255, 255, 255});
  img.line(-5, -5, 30, 30, {0, 0, 0}, 3);  // clipped, no crash
  img.text(15, 5, "MIB 0.5%", {0, 0, 0}, 2);
  EXPECT_EQ(img.at(0, 0), (Rgb{0, 0, 0}));
  EXPECT_EQ(img.at(9, 9), (Rgb{0, 0, 0}));
  EXPECT_EQ(img.at(19, 0), (Rgb{255, 255, 255}));
  EXPECT_THROW(img.at(20, 0), Error);
  // A horizontal line covers exactly its pixels, drawn with a 3 x 3 square pen centred on each point.
  Image h(10, 10, {255, 255, 255});
  h.line(2, 5, 7, 5, {1, 2, 3}, 3);
  for (int x = 0; x < 10; ++x)
    for (int y = 0; y < 10; ++y)
      EXPECT_EQ(h.at(x, y) == (Rgb{1, 2, 3}), x >= 1 && x <= 8 && y >= 4 && y <= 6) << x << "," << y;
}

TEST(MemoryTimeline, PlotPutsEachSeriesAtItsBytes) {
  // 10 forward events rising to a peak, 9 backward falling, and the optimizer.
  std::vector<MemoryTimelinePoint> pts;
  const size_t mib = 1 << 20;
  for (int e = 0; e < 20; ++e) {
    MemoryTimelinePoint p;
    p.event = e;
    p.phase = e < 10 ? "forward" : e < 19 ? "backward" : "optimizer";
    p.name = "op " + std::to_string(e);
    p.activations_live = (e < 10 ? e + 1 : e < 19 ? 19 - e : 0) * 2 * mib;
    p.static_bytes = 8 * mib;
    p.arena = 20 * mib;
    pts.push_back(p);
  }
  PlotLayout L;
  const Image img = memory_timeline_plot(pts, "test", &L);
  ASSERT_GT(L.y_max, 28.0 * mib);
  const int n = static_cast<int>(pts.size());
  int banded = 0;
  for (int e = 0; e < n; ++e) {
    const int xc = (L.event_x(e, n) + L.event_x(e + 1, n)) / 2;
    // The planned line crosses the middle of the event's slot at the height of static + live bytes (3 px pen).
    const int y = L.bytes_y(static_cast<double>(pts[e].planned_total()));
    bool found = false;
    for (int dy = -1; dy <= 1; ++dy) found |= img.at(xc, y + dy) == kColorPlanned;
    EXPECT_TRUE(found) << "event " << e << " at y " << y;
    // Nothing of the planned line far above or below it, in that column.
    for (int yy = L.y0; yy < L.y1; ++yy)
      if (std::abs(yy - y) > 2) {
        EXPECT_NE(img.at(xc, yy), kColorPlanned) << "event " << e << " y " << yy;
      }
    // The phase band just above the planned line, where the allocated line is not (one of two pixels, since a
    // 1-pixel gridline may cross either), and the static area below both.
    const Rgb band = e < 10 ? kColorForward : e < 19 ? kColorBackward : kColorOptimizer;
    const int y_alloc = L.bytes_y(28.0 * mib);
    if (y - y_alloc >= 8) {
      EXPECT_TRUE(img.at(xc, y - 4) == band || img.at(xc, y - 5) == band) << e;
      ++banded;
    }
    EXPECT_EQ(img.at(xc, L.bytes_y(4.0 * mib)), kColorStatic) << e;
  }
  EXPECT_GE(banded, 15);
  // The allocated line (dashed) sits at static + arena.
  int dashes = 0;
  for (int x = L.x0; x < L.x1; ++x) dashes += img.at(x, L.bytes_y(28.0 * mib)) == kColorAllocated;
  EXPECT_GT(dashes, (L.x1 - L.x0) / 3);
  EXPECT_LT(dashes, (L.x1 - L.x0) * 2 / 3 + 10);
}

// The grey band's legend said "params, grads, adamw state" also where the gradients are planned in the arena (train
// without --accum, bench model): they are then among the live activations, not in the band. It names what the
// static bytes hold.
TEST(MemoryTimeline, TheStaticBandSaysWhatItHolds) {
  for (const GradMemory grads : {GradMemory::Planned, GradMemory::Own}) {
    Gpt model(model_preset("tiny"));
    model.set_grad_memory(grads);
    model.reserve(2, 16);
    AdamW opt(model.params(), {}, model.context());
    const std::vector<MemoryTimelinePoint> pts = memory_timeline_points(model, opt.state_bytes(), {});
    ASSERT_FALSE(pts.empty());
    EXPECT_EQ(pts[0].static_bytes, model.params().bytes() + opt.state_bytes());
    EXPECT_EQ(pts.back().static_holds,
              grads == GradMemory::Planned ? "params, adamw m and v" : "params, grads, adamw m and v");
    // A forward-only timeline has no optimizer state.
    EXPECT_EQ(memory_timeline_points(model, 0, {})[0].static_holds,
              grads == GradMemory::Planned ? "params" : "params, grads");
  }
}

TEST(MemoryTimeline, LongTitleBreaksOntoASecondLineInsideTheImage) {
  // At scale 2 a glyph advances 12 px: 100 px hold 8 characters (the last one 10 px wide).
  EXPECT_EQ(wrap_title("short", 100), (std::vector<std::string>{"short"}));
  EXPECT_EQ(wrap_title("a, bc, defgh", 100), (std::vector<std::string>{"a, bc,", "defgh"}));
  EXPECT_EQ(wrap_title("ab (cd) (efghij)", 100), (std::vector<std::string>{"ab (cd)", "(efghij)"}));
  EXPECT_EQ(wrap_title("abcdefghijk", 100), (std::vector<std::string>{"abcdefgh", "ijk"}));
  // The trainer's title for a gpt2 run on a GPU: nothing drawn in the right margin, two lines above the plot.
  std::vector<MemoryTimelinePoint> pts(3);
  for (int e = 0; e < 3; ++e) {
    pts[e].event = e;
    pts[e].phase = "forward";
    pts[e].static_bytes = 1 << 20;
  }
  PlotLayout L;
  const Image img =
      memory_timeline_plot(pts, "gpt2-124m, B 16 x T 1024, step 2 (planned; measured at the phase ends)", &L);
  auto black_in = [&](int x0, int x1, int y0, int y1) {
    int n = 0;
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) n += img.at(x, y) == kPlotBlack;
    return n;
  };
  EXPECT_EQ(black_in(img.width() - 20, img.width(), 0, L.y0), 0);
  EXPECT_GT(black_in(0, img.width(), 8, 22), 0);   // the first line
  EXPECT_GT(black_in(0, img.width(), 28, 42), 0);  // the second
  EXPECT_EQ(black_in(0, img.width(), 42, L.y0 - 2), 0);
  // ';' is drawn, not left blank.
  Image semi(6, 7, kPlotWhite);
  semi.text(0, 0, ";", kPlotBlack, 1);
  int on = 0;
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 6; ++x) on += semi.at(x, y) == kPlotBlack;
  EXPECT_EQ(on, 8);
}

TEST(MemoryTimeline, CsvQuotesAndLeavesTheMeasurementEmptyWhenAbsent) {
  MemoryTimelinePoint a;
  a.phase = "forward";
  a.name = "x, y";
  a.activations_live = 5;
  a.static_bytes = 7;
  a.arena = 9;
  MemoryTimelinePoint b = a;
  b.event = 1;
  b.name = "z";
  b.measured = 42;
  EXPECT_EQ(memory_timeline_csv({a, b}),
            "event,phase,op,activations_live_bytes,static_bytes,planned_total_bytes,allocated_bytes,measured_bytes\n"
            "0,forward,\"x, y\",5,7,12,16,\n"
            "1,forward,z,5,7,12,16,42\n");
}

TEST(BenchModelUnits, OutOfMemoryErrorsAreRecognised) {
  EXPECT_TRUE(is_out_of_memory("out of GPU memory: activations needs 3 GiB, 1 GiB free"));
  EXPECT_TRUE(is_out_of_memory("out of memory: training this model needs 9 GiB, 2 GiB available"));
  EXPECT_FALSE(is_out_of_memory("bench model: --seq 300 exceeds max_seq 256"));
}

}  // namespace
}  // namespace tessera
