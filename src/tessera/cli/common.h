// tessera/cli/common.h — helpers shared by the subcommands.
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/cli/flags.h"
#include "tessera/core/error.h"
#include "tessera/core/units.h"  // human_bytes
#include "tessera/infer/sampler.h"
#include "tessera/models/config.h"
#include "tessera/train/progress.h"

namespace tessera::cli {

// --preset plus one flag per ModelConfig field.
void add_model_flags(Flags& f);
// The names add_model_flags adds.
std::vector<std::string> model_flag_names();
// The preset with the given overrides, validated.
ModelConfig model_from_flags(const Flags& f);

// A training run's own files in `dir` (metrics.jsonl, checkpoint/, checkpoint.old/, best/). checkpoint.old alone
// is a run whose checkpoint swap was cut short between its renames (the only checkpoint left, which --resume finds).
bool holds_run(const std::filesystem::path& dir);

// The lines of text file `path` (named by --flag in errors), as Python iterates a file opened with newline="\n":
// cut at each '\n', the last kept whether or not a '\n' ends it. Each must be valid UTF-8 without a NUL byte.
std::vector<std::string> read_text_lines(const std::string& flag, const std::string& path);

// Where an inference command runs and in what dtype, from --device (cpu, cuda or auto: the GPU where one is
// visible) and --precision (bf16 by default on the GPU, f32 on the CPU, which computes only in f32). Each bad
// setting is one TS_CHECK line.
struct InferenceDevice {
  bool gpu = false;
  DType dtype = DType::F32;
};
InferenceDevice read_inference_device(const Flags& a);

// One number in a printf format ("%.4f"), for the bench tables.
std::string fmt(const char* printf_format, double v);
// The current time as "YYYY-MM-DD HH:MM UTC", for the bench tables' headers.
std::string utc_now();
// A bench's markdown: printed without its title line (the title is for the file), and written atomically to
// `out` when given.
void print_bench_markdown(const std::string& md, const std::string& out);
// Fails now, before minutes of timing, when `path` (the value of --`flag`) cannot be written: its directory is
// missing or not writable, or it names a directory. Creates nothing.
void check_output_path(const std::string& flag, const std::string& path);
std::string human_count(double n);
// How a stop by signal is told: "terminated" (SIGTERM), "hung up" (SIGHUP), "stopped: output closed" (SIGPIPE), else
// "interrupted".
const char* stop_word(int sig);
// What generate_streamed throws when a write to standard output fails: a caller whose work was done before (train's
// sample, after the run is saved) adds kOutputLostNote, without reading the message.
class OutputLost : public Error {
 public:
  using Error::Error;
};
// Added to "cannot write standard output: ..." where the command's work was done before its output was lost
// (prepare's shards, a training run before its sample): exit 2 alone would read as nothing written.
inline constexpr const char* kOutputLostNote = " (the command had finished: only what it printed was lost)";
// Byte-level tokens of `prompt`; each must be below `vocab`.
std::vector<int32_t> encode_prompt(const std::string& prompt, int vocab);
// Prints the prompt, then each generated token's text as it is drawn (stdout flushed each time, so a long sample
// shows as it comes and an interrupt loses nothing printed before it), then a newline.
void generate_streamed(Model& model, const std::vector<int32_t>& prompt, int max_new, const SamplerParams& p);

// A progress bar over the shard writes of prepare_shards (PrepareParams::progress), in MiB of text, for prepare and
// train --data TEXT: a text of gigabytes takes seconds to prepare, which should not pass in silence. Off for a text
// under 16 MiB (a fraction of a second), and where `enabled` is false. With `rate`, the MB/s of text so far too
// (prepare --tokenizer, whose encoding sets the pace).
class PrepareProgress {
 public:
  static constexpr size_t kMinBytes = size_t{16} << 20;
  PrepareProgress(size_t text_bytes, bool enabled, bool rate = false);
  // For PrepareParams::progress; empty when the bar is off.
  std::function<void(size_t done, size_t total)> callback();

 private:
  bool on_, rate_;
  int64_t total_mib_;
  ProgressBar bar_;
  int64_t shown_ = -1;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// Called in a catch block: rethrows the exception being handled, and where it is an allocation failure (an Error
// is_out_of_memory knows, or std::bad_alloc) as one Error that ends in "(<hint>)": the hint names the flag of the
// command that sizes the work ("try --size small"), which an allocation deep down cannot know. An empty hint
// (the work is as small as the command makes it) rethrows it as it is.
[[noreturn]] void rethrow_with_memory_hint(std::string_view hint);
// fn(), its allocation failures worded by rethrow_with_memory_hint.
template <typename Fn>
auto with_memory_hint(std::string_view hint, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    rethrow_with_memory_hint(hint);
  }
}

}  // namespace tessera::cli
