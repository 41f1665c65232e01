#include "tessera/bench/png.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {

namespace {

// 5 x 7 glyphs, one string of 7 rows of 5 cells each ('#' on).
struct Glyph {
  char c;
  const char* rows;
};
constexpr Glyph kFont[] = {
    {'0', ".###.#...##..###.#.###..##...#.###."}, {'1', "..#...##....#....#....#....#...###."},
    {'2', ".###.#...#....#...#...#...#...#####"}, {'3', "#####...#...#.....#.....##...#.###."},
    {'4', "...#...##..#.#.#..#.#####...#....#."}, {'5', "######....####.....#....##...#.###."},
    {'6', "..##..#...#....####.#...##...#.###."}, {'7', "#####....#...#...#...#....#....#..."},
    {'8', ".###.#...##...#.###.#...##...#.###."}, {'9', ".###.#...##...#.####....#...#..##.."},
    {'A', ".###.#...##...#######...##...##...#"}, {'B', "####.#...##...#####.#...##...#####."},
    {'C', ".###.#...##....#....#....#...#.###."}, {'D', "###..#..#.#...##...##...##..#.###.."},
    {'E', "######....#....####.#....#....#####"}, {'F', "######....#....####.#....#....#...."},
    {'G', ".###.#...##....#.####...##...#.####"}, {'H', "#...##...##...#######...##...##...#"},
    {'I', ".###...#....#....#....#....#...###."}, {'J', "..###...#....#....#....#.#..#..##.."},
    {'K', "#...##..#.#.#..##...#.#..#..#.#...#"}, {'L', "#....#....#....#....#....#....#####"},
    {'M', "#...###.###.#.##.#.##...##...##...#"}, {'N', "#...##...###..##.#.##..###...##...#"},
    {'O', ".###.#...##...##...##...##...#.###."}, {'P', "####.#...##...#####.#....#....#...."},
    {'Q', ".###.#...##...##...##.#.##..#..##.#"}, {'R', "####.#...##...#####.#.#..#..#.#...#"},
    {'S', ".#####....#.....###.....#....#####."}, {'T', "#####..#....#....#....#....#....#.."},
    {'U', "#...##...##...##...##...##...#.###."}, {'V', "#...##...##...##...##...#.#.#...#.."},
    {'W', "#...##...##...##.#.##.#.##.#.#.#.#."}, {'X', "#...##...#.#.#...#...#.#.#...##...#"},
    {'Y', "#...##...#.#.#...#....#....#....#.."}, {'Z', "#####....#...#...#...#...#....#####"},
    {'.', "..........................##...##.."}, {',', ".....................##....#...#..."},
    {'-', "...............#####..............."}, {':', "......##...##........##...##......."},
    {'(', "...#...#...#....#....#.....#.....#."}, {')', ".#.....#.....#....#....#...#...#..."},
    {'/', ".........#...#...#...#...#........."}, {'%', "##...##..#...#...#...#...#..##...##"},
    {'+', ".......#....#..#####..#....#......."}, {'=', "..........#####.....#####.........."},
    {'_', "..............................#####"}, {'x', "..........#...#.#.#...#...#.#.#...#"},
    {'*', ".......#..#.#.#.###.#.#.#..#......."}, {'>', ".#.....#.....#.....#...#...#...#..."},
    {';', "......##...##........##....#...#..."},

};

const char* glyph_rows(char c) {
  if (c >= 'a' && c <= 'z' && c != 'x') c = static_cast<char>(c - 'a' + 'A');
  for (const Glyph& g : kFont)
    if (g.c == c) return g.rows;
  return nullptr;  // space and anything unknown: blank
}

void put_u32be(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void put_chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32be(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32be(out, crc32(out.data() + start, out.size() - start));
}

}  // namespace

Image::Image(int width, int height, Rgb bg) : w_(width), h_(height) {
  TS_CHECK(width > 0 && height > 0 && width <= 16384 && height <= 16384, "image: bad size ", width, " x ", height);
  px_.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = bg.r;
    px_[i + 1] = bg.g;
    px_[i + 2] = bg.b;
  }
}

Rgb Image::at(int x, int y) const {
  TS_CHECK(x >= 0 && y >= 0 && x < w_ && y < h_, "image: pixel (", x, ", ", y, ") outside ", w_, " x ", h_);
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  return {px_[i], px_[i + 1], px_[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  px_[i] = c.r;
  px_[i + 1] = c.g;
  px_[i + 2] = c.b;
}

void Image::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(y0, 0); y < std::min(y1, h_); ++y)
    for (int x = std::max(x0, 0); x < std::min(x1, w_); ++x) set(x, y, c);
}

void Image::line(int x0, int y0, int x1, int y1, Rgb c, int thickness, int dash) {
  // Bresenham; the pen is a thickness x thickness square centred on each point.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  int err = dx + dy, step = 0;
  for (;;) {
    if (dash <= 0 || (step / dash) % 2 == 0)
      for (int oy = lo; oy <= hi; ++oy)
        for (int ox = lo; ox <= hi; ++ox) set(x0 + ox, y0 + oy, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
    ++step;
  }
}

void Image::text(int x, int y, const std::string& s, Rgb c, int scale) {
  for (size_t i = 0; i < s.size(); ++i) {
    const char* rows = glyph_rows(s[i]);
    if (!rows) continue;
    const int gx = x + static_cast<int>(i) * 6 * scale;
    for (int r = 0; r < 7; ++r)
      for (int col = 0; col < 5; ++col)
        if (rows[r * 5 + col] == '#')
          fill_rect(gx + col * scale, y + r * scale, gx + (col + 1) * scale, y + (r + 1) * scale, c);
  }
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a = (a + data[i]) % kMod;
    b = (b + a) % kMod;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& raw) {
  constexpr size_t kMaxBlock = 65535;
  std::vector<uint8_t> out = {0x78, 0x01};  // deflate, 32 KiB window; (0x78 << 8 | 0x01) % 31 == 0
  size_t pos = 0;
  do {
    const size_t len = std::min(kMaxBlock, raw.size() - pos);
    const bool last = pos + len == raw.size();
    out.push_back(last ? 1 : 0);  // BFINAL, BTYPE 00 (stored); the rest of the byte is padding to a byte boundary
    out.push_back(static_cast<uint8_t>(len & 0xff));
    out.push_back(static_cast<uint8_t>(len >> 8));
    out.push_back(static_cast<uint8_t>(~len & 0xff));
    out.push_back(static_cast<uint8_t>((~len >> 8) & 0xff));
    out.insert(out.end(), raw.begin() + static_cast<std::ptrdiff_t>(pos),
               raw.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  } while (pos < raw.size());
  put_u32be(out, adler32(raw.data(), raw.size()));
  return out;
}

std::vector<uint8_t> png_encode(const Image& img) {
  const int w = img.width(), h = img.height();
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(h) * (1 + 3 * static_cast<size_t>(w)));
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);  // filter: none
    const auto row = img.rgb().begin() + static_cast<std::ptrdiff_t>(y) * w * 3;
    raw.insert(raw.end(), row, row + static_cast<std::ptrdiff_t>(w) * 3);
  }
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32be(ihdr, static_cast<uint32_t>(w));
  put_u32be(ihdr, static_cast<uint32_t>(h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, RGB, deflate, adaptive filtering, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", zlib_stored(raw));
  put_chunk(out, "IEND", {});
  return out;
}

void write_png(const std::string& path, const Image& img) {
  const std::vector<uint8_t> bytes = png_encode(img);
  write_file_atomic(path, bytes.data(), bytes.size());
}

double nice_step(double x) {
  const double mag = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= x * (1 - 1e-12)) return m * mag;
  return 10 * mag;
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace tessera
