#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <limits>
#include <set>
#include <thread>

#include "tessera/core/context.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/mmap_file.h"
#include "tessera/core/philox.h"
#include "tessera/core/tensor.h"
#include "tessera/core/units.h"
#include "test_util.h"

namespace tessera {

// Prints the seed of this run's random inputs once, so a failure can be repeated with TESSERA_TEST_SEED.
class SeedEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("random inputs seeded with %llu (set TESSERA_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(test::test_seed()));
  }
};
const auto* const kSeedEnvironment = ::testing::AddGlobalTestEnvironment(new SeedEnvironment);

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, KnownAnswers) {
  Philox4 r = philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Philox, UniformAndKeepRate) {
  const uint64_t seed = test::test_seed();
  double sum = 0;
  int kept = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = philox_uniform(seed, 3, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    kept += philox_keep(seed, 4, i, 0.25f);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.75, 0.005);
  // Streams are independent draws: stream 3 and 4 differ.
  int same = 0;
  for (int i = 0; i < 1000; ++i) same += philox_u32(seed, 3, i) == philox_u32(seed, 4, i);
  EXPECT_LT(same, 3);
}

// A dropout element takes 16 bits: element i is half i % 2 (low first) of word i / 2, and the keep rule compares
// that half / 2^16 with p, so p = k / 2^16 keeps exactly the halves >= k.
TEST(Philox, DropoutDrawsAreHalfWords) {
  const uint64_t seed = test::test_seed();
  for (uint64_t i = 0; i < 4096; ++i) {
    const uint32_t w = philox_u32(seed, 9, i / 2), half = i % 2 ? w >> 16 : w & 0xffffu;
    ASSERT_EQ(philox_u16(seed, 9, i), half) << "element " << i;
    ASSERT_EQ(philox_keep(seed, 9, i, 1000.0f / 65536.0f), half >= 1000u) << "element " << i;
  }
}

TEST(Philox, NormalMoments) {
  double s = 0, s2 = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double x = philox_normal(test::test_seed(), 1, i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.02);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_from_name("F64"), DType::F64);
  EXPECT_THROW(dtype_from_name("F8_E4M3"), Error);
}

TEST(DType, Bf16RoundTrip) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  std::mt19937_64 rng(test::test_seed());
  for (float x : test::randn<float>(1000, rng, 100.0)) EXPECT_NEAR(bf16_to_f32(f32_to_bf16(x)), x, std::fabs(x) / 256);
}

TEST(DType, F16RoundTrip) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                   // overflow to inf
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half round-trips exactly
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
}

TEST(Tensor, ShapeAndStrides) {
  float buf[24];
  Tensor t(buf, DType::F32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_str(), "(2, 3, 4)");
  EXPECT_TRUE(t.device().is_cpu());
}

TEST(Error, CarriesLocationAndMessage) {
  try {
    TS_CHECK(1 == 2, "value ", 42, " is wrong");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "value 42 is wrong");
    EXPECT_GT(e.line(), 0);
  }
}

// Whole-file reads and atomic writes, on a file larger than the read chunk and on a /proc file that reports
// no size; the atomic write leaves no temporary behind.
TEST(FileIo, AtomicWriteAndWholeReads) {
  namespace fs = std::filesystem;
  const fs::path d = test::temp_dir("fileio");
  std::string text(200 * 1024 + 7, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
  const std::string p = (d / "f.txt").string();
  write_file_atomic(p, text);
  write_file_atomic(p, text);  // over an existing file
  EXPECT_EQ(read_file_text(p), text);
  const auto bytes = read_file_bytes(p);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), text);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1);  // only f.txt
  EXPECT_NE(read_file_text("/proc/self/status").find("Pid:"), std::string::npos);
  EXPECT_NE(test::error_of([&] { read_file_text((d / "none").string(), "corpus"); }).find("corpus: cannot read"),
            std::string::npos);
  EXPECT_NO_THROW(fsync_dir(d.string()));
  fs::remove_all(d);
}

// An endless input (prepare --text /dev/zero) read until memory ran out, Ctrl-C or not: the signal's flag is
// checked between the reads, and a set flag ends the read with an error at once.
TEST(FileIo, ReadingStopsWhenTheSignalFlagIsSet) {
  volatile std::sig_atomic_t stop = SIGINT;
  namespace fs = std::filesystem;
  const std::string msg = test::error_of([&] { (void)read_file_text("/dev/zero", "text", &stop); });
  EXPECT_EQ(msg, "text: reading /dev/zero was interrupted");
  stop = 0;  // unset: a file is read whole
  const fs::path d = test::temp_dir("readstop");
  write_file_atomic((d / "t.txt").string(), std::string("abc"));
  EXPECT_EQ(read_file_text((d / "t.txt").string(), "text", &stop), "abc");
  fs::remove_all(d);
}

// An output that is a symlink or a FIFO: the atomic rename put a regular file in its place (as root, `--trace
// /dev/full` replaced the system's /dev/full). A symlink's file is replaced and the link stays (a relative link is
// taken from its own directory, through a symlinked one too), a dangling one's target is made, a loop is refused; a
// FIFO, or a path under /proc (/proc/self/fd/N of a regular file: a redirected stdout), is written in place,
// appended, and a FIFO with no reader is refused at once. A FIFO or a directory where a mapped file belongs
// blocked in open() forever or read as a file; a FIFO given as text is read from its writer, as `cat` would.
TEST(FileIo, WritesThroughSymlinksAndIntoFifosAndReadsWithoutBlocking) {
  namespace fs = std::filesystem;
  const fs::path d = test::temp_dir("fileio_links");
  const fs::path target = d / "target.md", link = d / "link.md", dangling = d / "dangling.md", fifo = d / "fifo";
  write_file_atomic(target.string(), std::string("old"));
  fs::create_symlink("target.md", link);
  EXPECT_NO_THROW(check_file_writable(link.string(), "--out"));
  write_file_atomic(link.string(), std::string("new"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_file_text(target.string()), "new");
  fs::create_symlink("made.md", dangling);
  write_file_atomic(dangling.string(), std::string("made"));
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(read_file_text((d / "made.md").string()), "made");
  // runs -> real/runs, and runs/r.md -> ../shared/r.md: the kernel reads real/shared/r.md, not shared/r.md.
  fs::create_directories(d / "real" / "runs");
  fs::create_directories(d / "real" / "shared");
  fs::create_directory_symlink("real/runs", d / "runs");
  fs::create_symlink("../shared/r.md", d / "real" / "runs" / "r.md");
  write_file_atomic((d / "runs" / "r.md").string(), std::string("through"));
  EXPECT_EQ(read_file_text((d / "real" / "shared" / "r.md").string()), "through");
  EXPECT_FALSE(fs::exists(d / "shared"));
  fs::create_symlink("loop_b", d / "loop_a");
  fs::create_symlink("loop_a", d / "loop_b");
  EXPECT_NE(test::error_of([&] {
              write_file_atomic((d / "loop_a").string(), std::string("x"));
            }).find("Too many levels of symbolic links"),
            std::string::npos);
  // /proc/self/fd/N of a regular file: appended to that file, which stays the same file.
  const fs::path log = d / "log.txt";
  write_file_atomic(log.string(), std::string("before;"));
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(log_fd, 0);
  struct stat was {
  }, now{};
  ASSERT_EQ(::stat(log.c_str(), &was), 0);
  write_file_atomic("/proc/self/fd/" + std::to_string(log_fd), std::string("after"));
  ::close(log_fd);
  ASSERT_EQ(::stat(log.c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, was.st_ino);
  EXPECT_EQ(read_file_text(log.string()), "before;after");
  // A FIFO: refused at once with no reader (the check only asks), written in place with one.
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NE(test::error_of([&] {
              write_file_atomic(fifo.string(), std::string("x"));
            }).find("cannot write " + fifo.string() + ": No such device or address"),
            std::string::npos);
  EXPECT_NO_THROW(check_file_writable(fifo.string(), "--out"));
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  write_file_atomic(fifo.string(), std::string("through"));
  char buf[16] = {};
  EXPECT_EQ(::read(reader, buf, sizeof buf), 7);
  EXPECT_EQ(std::string(buf, 7), "through");
  ::close(reader);
  EXPECT_TRUE(fs::is_fifo(fifo));
  // Mapped on another thread: should it block in open(), a writer opened here lets it go and the test fails.
  auto refused =
      std::async(std::launch::async, [&] { return test::error_of([&] { MappedFile(fifo.string(), "shard"); }); });
  if (refused.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "mapping a FIFO blocked";
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  EXPECT_NE(refused.get().find("not a regular file"), std::string::npos);
  // Read as text, it waits for its writer and reads what that writes.
  std::thread feeder([&] {  // its write is refused (no reader) until the read below has opened the FIFO
    for (int tries = 0; tries < 1000; ++tries) {
      try {
        write_file_atomic(fifo.string(), std::string("fed"));
        return;
      } catch (const Error&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  });
  const std::string fed = read_file_text(fifo.string());
  feeder.join();
  EXPECT_EQ(fed, "fed");
  EXPECT_NE(test::error_of([&] {
              read_file_text(d.string(), "text");
            }).find("text: cannot read " + d.string() + ": is a directory"),
            std::string::npos);
  fs::remove_all(d);
}

TEST(MappedFile, MapsMovesAndRefusesWhatItCannotMap) {
  namespace fs = std::filesystem;
  const fs::path d = test::temp_dir("mmap");
  const std::string p = (d / "f.bin").string();
  write_file_atomic(p, std::string("tessera"));
  MappedFile a(p, "shard");
  ASSERT_EQ(a.size(), 7u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.data()), a.size()), "tessera");
  const uint8_t* data = a.data();
  MappedFile b(std::move(a));
  EXPECT_EQ(b.data(), data);  // moved, not copied
  EXPECT_EQ(a.data(), nullptr);
  a = std::move(b);
  EXPECT_EQ(a.data(), data);
  write_file_atomic((d / "empty").string(), std::string());
  const MappedFile e((d / "empty").string());
  EXPECT_EQ(e.size(), 0u);
  EXPECT_NE(test::error_of([&] { MappedFile((d / "none").string(), "shard"); }).find("shard: cannot read"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { MappedFile(d.string(), "shard"); }).find("is a directory"), std::string::npos);
  fs::remove_all(d);
}

TEST(Context, CpuIsAlwaysThere) {
  // best_available() is the CPU exactly when no GPU is visible (this test also runs on the GPU machine).
  Context ctx = Context::best_available();
  const GpuInfo info = probe_gpu();
  EXPECT_EQ(ctx.device().is_cpu(), !info.available);
  EXPECT_EQ(info.available, info.count > 0);
  EXPECT_TRUE(Context(Device::cpu()).device().is_cpu());
}

// Command-line numbers are decimal: strtod alone read "0x10" as 16 (`--lr 0x10` trained at lr 16) and took
// "inf", "nan" and leading blanks.
TEST(Units, DecimalOnly) {
  size_t used = 99;
  EXPECT_DOUBLE_EQ(parse_decimal_prefix("3e-4", &used), 3e-4);
  EXPECT_EQ(used, 4u);
  EXPECT_DOUBLE_EQ(parse_decimal_prefix("-1.5MB", &used), -1.5);
  EXPECT_EQ(used, 4u);
  for (const char* v : {"0x10", "0X1p4", "inf", "nan", " 3", "", "e5", "."}) {
    const double x = parse_decimal_prefix(v, &used);
    // "0x10" and "0X1p4" stop after the "0": short of the whole text, so a flag refuses them.
    EXPECT_TRUE(used == 0 || used < std::string(v).size()) << v;
    if (used == 0) {
      EXPECT_EQ(x, 0.0) << v;
    }
  }
  EXPECT_EQ(parse_decimal_prefix("0x10", &used), 0.0);
  EXPECT_EQ(used, 1u);
}

// A decimal past its type's range is out of range, not a number that becomes inf: `--rope-theta 1e300` said
// "got inf" of a float, and `--lr 1e999` that it was no number. One too close to zero underflows.
TEST(Units, DecimalsPastTheirTypesRangeAreOutOfRange) {
  float f = 7;
  double d = 7;
  EXPECT_EQ(parse_decimal("1e300", &f), DecimalStatus::OutOfRange);
  EXPECT_EQ(parse_decimal("-1e39", &f), DecimalStatus::OutOfRange);
  EXPECT_EQ(parse_decimal("3.40282357e38", &f), DecimalStatus::OutOfRange);  // rounds to inf as a float
  EXPECT_EQ(f, 7.0f) << "set although refused";
  EXPECT_EQ(parse_decimal("3.4028235e38", &f), DecimalStatus::Ok);  // rounds to FLT_MAX
  EXPECT_EQ(f, std::numeric_limits<float>::max());
  EXPECT_EQ(parse_decimal("1e300", &d), DecimalStatus::Ok);
  EXPECT_EQ(d, 1e300);
  EXPECT_EQ(parse_decimal("1e999", &d), DecimalStatus::OutOfRange);
  EXPECT_EQ(parse_decimal("-1e999", &d), DecimalStatus::OutOfRange);
  EXPECT_EQ(parse_decimal("-2.5e-3", &f), DecimalStatus::Ok);
  EXPECT_EQ(f, -2.5e-3f);
  // A nonzero decimal that would be 0, or subnormal, in its type underflows: as a float, `--lr 1e-50` was 0.
  f = 7;
  d = 7;
  EXPECT_EQ(parse_decimal("1e-50", &f), DecimalStatus::Underflow);
  EXPECT_EQ(parse_decimal("-1e-40", &f), DecimalStatus::Underflow);  // a subnormal float
  EXPECT_EQ(parse_decimal("0.00000000000000000000000000000000000000001", &f), DecimalStatus::Underflow);
  EXPECT_EQ(f, 7.0f) << "set although refused";
  EXPECT_EQ(parse_decimal("1e-400", &d), DecimalStatus::Underflow);
  EXPECT_EQ(d, 7.0) << "set although refused";
  EXPECT_EQ(parse_decimal("1e-40", &d), DecimalStatus::Ok);
  EXPECT_EQ(d, 1e-40);
  EXPECT_EQ(parse_decimal("1.2e-38", &f), DecimalStatus::Ok);  // just above FLT_MIN
  EXPECT_EQ(f, 1.2e-38f);
  for (const char* zero : {"0", "-0", "0.000", "0e-50", "00.0e999"}) {
    f = 7;
    EXPECT_EQ(parse_decimal(zero, &f), DecimalStatus::Ok) << zero;
    EXPECT_EQ(f, 0.0f) << zero;
  }
  EXPECT_EQ(decimal_range_note<float>(DecimalStatus::OutOfRange), "is out of range (-3.40282e+38 to 3.40282e+38)");
  EXPECT_EQ(counted(1, "token"), "1 token");
  EXPECT_EQ(counted(0, "token"), "0 tokens");
  EXPECT_EQ(counted(18446744073709551615ull, "byte"), "18446744073709551615 bytes");
  EXPECT_EQ(decimal_range_note<float>(DecimalStatus::Underflow),
            "is too close to zero (the smallest magnitude it takes is 1.17549e-38)");
  for (const char* v : {"inf", "nan", "0x10", " 3", "", "1e3x", "e5"}) {
    EXPECT_EQ(parse_decimal(v, &f), DecimalStatus::NotANumber) << v;
    EXPECT_EQ(parse_decimal(v, &d), DecimalStatus::NotANumber) << v;
  }
}

// Two decimals in the largest binary unit up to PiB: info's estimate for a trillion parameters read "1570.01 TiB".
TEST(Units, HumanBytesReachesPiB) {
  EXPECT_EQ(human_bytes(1023), "1023.00 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(1.5 * 1024.0 * 1024 * 1024 * 1024 * 1024), "1.50 PiB");      // was "1536.00 TiB"
  EXPECT_EQ(human_bytes(2048.0 * 1024 * 1024 * 1024 * 1024 * 1024), "2048.00 PiB");  // the largest unit
}

TEST(Units, ByteSizes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096.0);
  EXPECT_EQ(parse_byte_size("12B"), 12.0);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1.5e9);
  EXPECT_EQ(parse_byte_size("10MB"), 1e7);
  EXPECT_EQ(parse_byte_size("64KiB"), 65536.0);
  EXPECT_EQ(parse_byte_size("512MiB"), 512.0 * 1048576);
  EXPECT_EQ(parse_byte_size("2GiB"), 2.0 * 1073741824);
  EXPECT_EQ(parse_byte_size("1TB"), 1e12);
  EXPECT_EQ(parse_byte_size("1e3KB"), 1e6);
  for (const char* v : {"", "MB", "12XB", "1 MB", "1MB junk", "0x10MB", "inf", "nanGB", "1e999GB", "1mb", "1KiBs"})
    EXPECT_FALSE(parse_byte_size(v).has_value()) << v;
}

}  // namespace tessera
