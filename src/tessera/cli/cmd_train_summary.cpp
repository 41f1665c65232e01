// What `tessera train` prints: the startup lines, the training under its stop handlers, the summary, and a
// sample from the trained model.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/bench/memory_timeline.h"
#include "tessera/cli/cmd_train.h"
#include "tessera/cli/common.h"
#include "tessera/core/error.h"
#include "tessera/core/signals.h"
#include "tessera/core/units.h"
#include "tessera/dist/ddp.h"
#include "tessera/infer/sampler.h"

namespace tessera::cli {

namespace fs = std::filesystem;

void TrainCommand::print_start() {
  const int64_t params = o.model.num_params();
  const std::string what = o.resume.empty()
                               ? o.model.preset + " (" + human_count(static_cast<double>(params)) + " params)"
                               : "from checkpoint " + o.resume;
  // The precision line: 16-bit parameters with f32 master weights, or without them and what that saves.
  std::string precision(dtype_name(setup.dtype));
  if (setup.dtype != DType::F32) {
    precision += o.master_weights
                     ? " with f32 master weights"
                     : " without master weights (LightSeq's mode: " +
                           human_bytes(4.0 * static_cast<double>(o.model.num_params())) + " of f32 masters saved)";
    if (o.loss_scaling) precision += " and dynamic loss scaling";
  }
  const std::string where = setup.context->is_cuda()
                                ? setup.context->gpu().name + " (" + setup.context->device().str() + ") in " + precision
                                : std::string("the CPU");
  if (lead) {
    // A resume runs the steps after its checkpoint's: "for 50 steps" beside "done: 10 steps" would read as a
    // contradiction.
    // --stop-after ends this call at its step (checked to be one this run takes): "for steps 5 to 10" under
    // --stop-after 5 promised five steps and ran one.
    const bool resumed = !o.resume.empty() && setup.model;
    const int64_t first = resumed ? setup.state.step + 1 : 1;
    const int64_t last = o.stop_after > 0 ? o.stop_after : o.steps;
    std::string span = !resumed && last == o.steps ? "for " + counted(o.steps, "step")
                       : first == last             ? "for step " + std::to_string(last)  // not "for steps 2 to 2"
                                       : "for steps " + std::to_string(first) + " to " + std::to_string(last);
    if (last != o.steps) span += " of " + std::to_string(o.steps) + " (--stop-after " + std::to_string(last) + ")";
    std::printf("training %s on %s %s -> %s\n", what.c_str(), where.c_str(), span.c_str(), o.out.c_str());
    const std::string no_graph = train_cuda_graph_refusal(o, *setup.context);
    if (no_graph.empty())
      std::printf("step: CUDA graphs (one a step: forward, backward and AdamW; the first step%s runs eagerly)\n",
                  o.trace.empty() ? "" : " and the --trace step");
    else std::printf("step: eager (%s)\n", no_graph.c_str());
    if (!setup.no_validation.empty()) std::printf("validation: none (%s)\n", setup.no_validation.c_str());
    if (ranks.world) {
      std::printf("data parallel: %s x batch %d = %s a micro-step, %s\n", counted(ranks.size(), "rank").c_str(),
                  o.batch, counted(ranks.size() * o.batch, "sequence").c_str(),
                  dist.zero ? "ZeRO-1 (gradients reduce-scattered, optimizer state sharded)"
                            : ("--ddp " + std::string(ddp_mode_name(dist.ddp)) +
                               (dist.ddp == DdpMode::Bucket ? " (" + a.str("bucket-mb", "25") + " MB buckets)" : ""))
                                  .c_str());
    }
    std::fflush(stdout);
  }
}

TrainResult TrainCommand::train_run() {
  // The optimizer memory of each rank: all of AdamW's m and v with DDP, about 1/N of them under ZeRO-1.
  auto on_start = [&](size_t state_bytes, size_t unsharded) {
    if (!lead || !ranks.world) return;
    const std::string mine = human_bytes(static_cast<double>(state_bytes));
    const std::string all = human_bytes(static_cast<double>(unsharded));
    if (dist.zero)
      std::printf("optimizer: AdamW m+v %s on rank 0 (ZeRO-1: its 1/%d of %s)\n", mine.c_str(), ranks.size(),
                  all.c_str());
    else std::printf("optimizer: AdamW m+v %s on each rank (unsharded)\n", mine.c_str());
    std::fflush(stdout);
  };
  TrainResult r;
  {
    // SIGINT, SIGTERM, SIGHUP (the terminal closed) and SIGPIPE (the output pipe closed) set g_stop while training
    // runs: the run stops at the next step boundary with a checkpoint, where their default action killed it with
    // none. SIGHUP and SIGPIPE ignored by whoever started us (nohup ignores SIGHUP; systemd, SIGPIPE) stay
    // ignored. The previous handlers come back afterwards.
    set_stop_note(lead, o.checkpoints, o.progress);
    // Nested in text_signals (one process with a --data text), which stays until these are undone: a reset of it
    // first left a moment with the default action in force, and a stop recorded after the last look at read_stop.
    const ScopedSignals signals({SIGINT, SIGTERM, SIGHUP, SIGPIPE}, on_stop_signal,
                                /*keep_ignored=*/{SIGHUP, SIGPIPE});
    // A stop since the read (text_signals recorded it) or during the prepare's last renames stops the training at
    // its first step boundary, and is said now, as a stop during the training is: unsaid, a second Ctrl-C later
    // abandoned the checkpoint.
    say_earlier_stop(read_stop);
    // --memory-timeline: the step's memory, as train() records it, drawn as a PNG with its CSV beside it.
    const std::string timeline_png = setup.options.memory_timeline;
    const auto draw_timeline = [timeline_png](const std::vector<MemoryTimelinePoint>& points,
                                              const std::string& title) {
      write_memory_timeline(timeline_png, fs::path(timeline_png).replace_extension(".csv").string(), points, title);
    };
    try {
      r = train(std::move(setup), {.stop = &g_stop,
                                   .on_checkpoint = {},
                                   .on_start = on_start,
                                   .before_optimizer_step = {},
                                   .before_grad_sync = {},
                                   .on_memory_timeline = draw_timeline});
    } catch (...) {
      // A run that fails before its first step (out of memory making the model, say) leaves nothing behind; one
      // that fails later keeps its metrics and checkpoints (a diverged run's metrics say how it went).
      std::error_code ec, ec2;
      const auto metrics = fs::file_size(out / "metrics.jsonl", ec);  // uintmax_t(-1) and ec set when missing
      const bool checkpoint = fs::exists(out / "checkpoint", ec2);
      if ((!ec && metrics > 0) || checkpoint) created.keep();
      // An empty metrics.jsonl (a new run's, or a branch's into --out NEW) in a directory that was there before
      // would make it a run: the same command would then be refused as one into a run, with nothing in it.
      else if (!ec && lead) fs::remove(out / "metrics.jsonl", ec);
      throw;
    }
  }
  return r;
}

std::optional<int> TrainCommand::summarize(const TrainResult& r) {
  // A data-parallel run resumes at its world size, with its form of gradient reduction.
  const std::string launcher = ranks.world ? "mpirun -np " + std::to_string(ranks.size()) + " " : "";
  const std::string dist_flags = !ranks.world ? ""
                                 : dist.zero  ? " --zero 1"
                                              : " --ddp " + std::string(ddp_mode_name(dist.ddp)) +
                                                   (a.has("bucket-mb") ? " --bucket-mb " + a.str("bucket-mb") : "");
  // Precision, master weights and the loss-scale interval are not saved with a run (a checkpoint resumes on any
  // device): the command repeats the ones given, so that an f16 run resumes in f16 with its scaler state.
  std::string precision_flags;
  if (a.has("precision")) precision_flags.append(" --precision ").append(a.str("precision"));
  if (a.has("master-weights")) precision_flags.append(" --master-weights ").append(a.str("master-weights"));
  if (a.has("loss-scale-interval"))
    precision_flags.append(" --loss-scale-interval ").append(a.str("loss-scale-interval"));
  const std::string resume_cmd = launcher + shell_quote(argv_[0]) + " train --resume " + shell_quote(r.checkpoint) +
                                 (fs::path(r.checkpoint).parent_path() == out ? "" : " --out " + shell_quote(o.out)) +
                                 dist_flags + precision_flags;
  // The --trace / --memory-timeline files, or why there are none (a run stopped before its --trace-step leaves
  // none): said, so that neither the files nor their absence goes unmentioned.
  const bool wants_trace = !o.trace.empty() || !o.memory_timeline.empty();
  std::string traced;
  for (const std::string& f : r.traced) traced += (traced.empty() ? "" : ", ") + f;
  const std::string no_trace = "no --trace / --memory-timeline file: the run stopped before step " +
                               std::to_string(o.trace_step) + ", the one they record";
  if (r.interrupted && wants_trace && traced.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s\n", no_trace.c_str());
  }
  if (r.interrupted && r.checkpoint.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s at step %lld: --no-checkpoint, so nothing was written to resume from\n",
                 stop_word(g_stop), static_cast<long long>(r.last_step));
    return 128 + g_stop;
  }
  if (r.interrupted) {
    std::fflush(stdout);
    std::fprintf(stderr, "tessera: %s at step %lld: checkpoint written to %s; continue the run with: %s\n",
                 stop_word(g_stop), static_cast<long long>(r.last_step), r.checkpoint.c_str(), resume_cmd.c_str());
    return 128 + g_stop;
  }
  std::printf("done: %s in %.1fs, loss %.4f -> %.4f", counted(r.steps, "step").c_str(), r.seconds, r.first_loss,
              r.last_loss);
  if (r.loss_scale > 0)
    std::printf(", %lld skipped (f16 overflow), loss scale %g", static_cast<long long>(r.skipped_steps), r.loss_scale);
  if (r.last_val_loss > 0) std::printf(", val loss %.4f", r.last_val_loss);
  std::printf("\ncheckpoint: %s\n", r.checkpoint.empty() ? "none (--no-checkpoint)" : r.checkpoint.c_str());
  // A resume with --no-checkpoint keeps the run's best/ as it was: said, since a better validation loss of this
  // run (printed above) did not replace it.
  if (r.best_step > 0)
    std::printf("best:       %s (step %lld, val loss %.4f%s)\n", r.best_checkpoint.c_str(),
                static_cast<long long>(r.best_step), r.best_val_loss,
                r.checkpoint.empty() ? "; as it was: --no-checkpoint writes none" : "");
  std::printf("metrics:    %s\n", (fs::path(o.out) / "metrics.jsonl").c_str());  // "--out run/": one slash
  if (wants_trace)
    std::printf("trace:      %s\n",
                traced.empty() ? no_trace.c_str() : (traced + " (step " + std::to_string(o.trace_step) + ")").c_str());
  if (r.peak_device_bytes > 0)
    std::printf(
        "memory:     peak %s on the GPU after a step (the driver's count: tessera's buffers and the CUDA "
        "context)\n",
        human_bytes(static_cast<double>(r.peak_device_bytes)).c_str());
  if (r.last_step < o.steps && !r.checkpoint.empty())
    std::printf("stopped after step %lld; continue with: %s\n", static_cast<long long>(r.last_step),
                resume_cmd.c_str());
  if (g_stop != 0) return 128 + g_stop;  // a signal after the last step: the run is complete, skip the sample
  return std::nullopt;
}

int TrainCommand::sample(TrainResult& r) {
  // Sample from the model still in memory (it equals the checkpoint just written) rather than reloading it.
  int sample_tokens = sample_flag;
  if (!a.has("sample-tokens") && !r.model->context().is_cuda() && r.model->config().num_params() > kSampleMaxParams) {
    sample_tokens = 0;
    // generate's default checkpoint is runs/tiny's, another model: the hint names this run's.
    const std::string gen = r.checkpoint.empty() ? ""
                                                 : ", or run " + shell_quote(argv_[0]) + " generate --checkpoint " +
                                                       shell_quote(r.checkpoint);
    std::printf("\nno sample: %s parameters is too slow to sample on the CPU (ask with --sample-tokens N%s)\n",
                human_count(static_cast<double>(r.model->config().num_params())).c_str(), gen.c_str());
  }
  if (sample_tokens > 0 && !no_sample.empty()) {
    sample_tokens = 0;
    std::printf("\nno sample: %s\n", no_sample.c_str());
  }
  if (sample_tokens > 0) {
    const std::string prompt = a.str("prompt", "The ");
    std::printf("\nsample (temperature 0.7, top-k 40):\n");
    try {
      generate_streamed(*r.model, encode_prompt(prompt, r.model->config().vocab), sample_tokens,
                        {.temperature = 0.7f, .top_k = 40, .seed = o.seed});
    } catch (const OutputLost& e) {
      // The first write that reaches the output is the sample's, after the run is saved.
      TS_THROW(e.what(), kOutputLostNote);
    }
  }
  return 0;
}

}  // namespace tessera::cli
