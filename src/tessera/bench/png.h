// tessera/bench/png.h — an RGB image, a few raster primitives, and a PNG encoder with no library behind it.
//
// PNG (ISO/IEC 15948): the 8-byte signature, then chunks (length, type, data, CRC-32 over type and data, all
// big-endian): IHDR (width, height, bit depth 8, colour type 2 = RGB, no interlace), one IDAT holding a zlib
// stream (RFC 1950) of the scanlines, each preceded by filter byte 0 (none), and IEND. The zlib stream is the
// header 0x78 0x01, deflate (RFC 1951) blocks of type 0 (stored, uncompressed: a header byte, LEN and ~LEN
// little-endian, then at most 65535 bytes), and the Adler-32 of the raw data, big-endian. Stored blocks make the
// file about as large as the raw pixels (1200 x 600 RGB: 2.1 MB), which is what a plot written once per run can
// afford; any PNG reader decodes it.
//
// The text is a built-in 5 x 7 bitmap font of the ASCII upper case, digits and some punctuation (lower case is
// drawn as upper case), scaled by whole pixels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

class Image {
 public:
  Image(int width, int height, Rgb background);
  int width() const { return w_; }
  int height() const { return h_; }
  const std::vector<uint8_t>& rgb() const { return px_; }  // row-major, 3 bytes per pixel, top row first
  Rgb at(int x, int y) const;

  // Drawing clips to the image. Rectangles are [x0, x1) x [y0, y1).
  void set(int x, int y, Rgb c);
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);
  // A line from (x0, y0) to (x1, y1), inclusive, `thickness` pixels wide (a square pen); with dash > 0, on for
  // dash pixels and off for dash pixels along the line.
  void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1, int dash = 0);
  // Text with its top-left corner at (x, y); each glyph is 5 x 7 pixels times `scale`, advancing 6 x scale.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  static int text_width(const std::string& s, int scale = 1) { return static_cast<int>(s.size()) * 6 * scale - scale; }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);  // the PNG/zlib CRC-32 (polynomial 0xedb88320)
uint32_t adler32(const uint8_t* data, size_t n);
// The zlib stream of `raw` in stored deflate blocks.
std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& raw);
// The PNG file of the image.
std::vector<uint8_t> png_encode(const Image& img);
// png_encode written atomically to `path`.
void write_png(const std::string& path, const Image& img);

// A plot axis's tick step: 1, 2 or 5 times a power of ten, at least x (> 0).
double nice_step(double x);
// A tick label: v in printf's %g.
std::string tick_label(double v);
// The plots' common colours: background, axes, grid lines, text.
inline constexpr Rgb kPlotWhite{255, 255, 255}, kPlotBlack{0, 0, 0}, kPlotGrid{170, 170, 170}, kPlotText{60, 60, 60};

}  // namespace tessera
