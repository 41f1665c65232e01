// The tracer on the CPU context: nested slices timed by the host clock, counters, and the Chrome trace JSON.
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/trace.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

void busy(int us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

TEST(Tracer, NestedSlicesCountersAndChromeJson) {
  Context ctx(Device::cpu());
  Tracer t(ctx);
  {
    TraceScope outer(&t, "outer");
    busy(200);
    {
      TraceScope inner(&t, "inner");
      t.counter("memory", 42);
      busy(1000);
    }
    t.begin("second");
    EXPECT_EQ(t.depth(), 2);
    busy(300);
    t.end();
  }
  EXPECT_EQ(t.depth(), 0);
  const auto s = t.slices();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "outer");
  EXPECT_EQ(s[0].depth, 0);
  EXPECT_EQ(s[1].name, "inner");
  EXPECT_EQ(s[1].depth, 1);
  EXPECT_EQ(s[2].name, "second");
  EXPECT_EQ(s[2].depth, 1);
  EXPECT_EQ(s[0].start_us, 0.0);  // times count from the first mark
  // The host clock timed the sleeps: each slice at least as long as its sleep, children inside the parent and
  // in order.
  EXPECT_GE(s[1].dur_us, 1000.0);
  EXPECT_GE(s[2].dur_us, 300.0);
  EXPECT_GE(s[0].dur_us, 1500.0);
  EXPECT_GE(s[1].start_us, s[0].start_us + 200.0);
  EXPECT_GE(s[2].start_us, s[1].start_us + s[1].dur_us);
  EXPECT_LE(s[2].start_us + s[2].dur_us, s[0].start_us + s[0].dur_us);
  const auto c = t.counters();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].value, 42.0);
  EXPECT_GE(c[0].ts_us, s[1].start_us);
  EXPECT_LE(c[0].ts_us, s[1].start_us + s[1].dur_us);

  const fs::path path = fs::temp_directory_path() / ("tessera_trace_" + std::to_string(::getpid()) + ".json");
  t.write_chrome_json(path.string());
  const auto doc = nlohmann::json::parse(read_file_text(path.string()));
  fs::remove(path);
  const auto& ev = doc.at("traceEvents");
  int complete = 0, counters = 0;
  for (const auto& e : ev) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      const Tracer::Slice& want = s[complete++];
      EXPECT_EQ(e.at("name"), want.name);
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), want.start_us);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), want.dur_us);
    } else if (ph == "C") {
      ++counters;
      EXPECT_EQ(e.at("name"), "memory");
      EXPECT_EQ(e.at("args").at("value").get<double>(), 42.0);
    } else {
      EXPECT_EQ(ph, "M");  // the track's name
    }
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(counters, 1);
}

TEST(Tracer, RefusesUnbalancedRanges) {
  Context ctx(Device::cpu());
  Tracer t(ctx);
  EXPECT_THROW(t.end(), Error);
  t.begin("left open");
  EXPECT_THROW(t.slices(), Error);
  EXPECT_THROW(t.write_chrome_json("/nonexistent-dir/x.json"), Error);
  t.end();
  EXPECT_EQ(t.slices().size(), 1u);
  TraceScope no_tracer(nullptr, "nvtx only");  // no tracer: nothing recorded, nothing thrown
}

}  // namespace
}  // namespace tessera
