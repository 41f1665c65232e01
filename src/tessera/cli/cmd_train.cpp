// tessera train: the command, phase by phase (cmd_train.h says which file holds which).
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/cli/cmd_train.h"
#include "tessera/cli/commands.h"
#include "tessera/cli/common.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/fnv.h"
#include "tessera/core/units.h"
#include "tessera/dist/zero.h"
#include "tessera/models/model.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/seq2seq_train.h"
#include "tessera/train/text.h"

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

// Why the sample after training, byte-level text as tessera generate's, cannot come from this model; "" when it can.
// max_token: the largest token id in the training shards (-1 for text, which is tokenized as bytes).
std::string byte_sample_refusal(int vocab, int max_token) {
  if (vocab < kByteVocab)
    return "the model's vocab of " + std::to_string(vocab) +
           " tokens is not the byte vocabulary (256), and the sample "
           "is byte-level text";
  if (max_token >= kByteVocab)
    return "the training data holds token ids up to " + std::to_string(max_token) +
           ", not bytes, and the sample is "
           "byte-level text";
  return "";
}

}  // namespace

TrainCommand::TrainCommand(int argc, char** argv, const Ranks& r)
    : argv_(argv), ranks(r),
      a("train",
        "Trains a GPT model. With no flags: the tiny preset on the bundled corpus, on the GPU when one\n"
        "is visible (bf16 with f32 master weights), else on the CPU (f32). An encoder-decoder preset, or\n"
        "--data holding paired shards, trains an encoder-decoder (docs/encoder_decoder.md)."),
      lead(r.rank() == 0), argc_(argc) {
  add_train_flags(a);
}

void TrainCommand::check_setup() {
  // 2. Every option against the model, the resume checkpoint and the memory the run needs (reads only).
  setup = train_setup(o);
  o = setup.options;
  for (const char* f : {"loss-scale-init", "loss-scale-interval"})
    TS_CHECK(!a.has(f) || o.loss_scaling, "--", f, " applies to --precision f16 (dynamic loss scaling)");
  // CPU ranks all-reduce over MPI, which has no CTAs to limit; 0, the default (NCCL's choice), asks for nothing,
  // so a launch script that always passes it runs on CPU ranks too.
  TS_CHECK(dist.comm_sms == 0 || setup.context->is_cuda(),
           "--comm-sms applies to ranks on GPUs (the SMs NCCL's "
           "collectives use): these ranks train on the CPU");
  // ZeRO-1 clips each rank's range after an all-reduce of the norm; skipping a step there is not built.
  TS_CHECK(!(dist.zero && o.loss_scaling),
           "--zero 1 does not support --precision f16 (dynamic loss scaling): use "
           "--precision bf16, or --ddp");
  // ZeRO-1 over more ranks than the flat parameters have blocks would shard nothing. Checked here, where the
  // ranks agree, rather than where each rank makes its optimizer in train(): there every rank failed alone, a
  // line and an MPI_Abort each.
  if (dist.zero) check_zero_world(model_flat_params(o.model), ranks.size());
}

bool TrainCommand::check_data() {
  // 3. The data: shards are opened and checked now; text is read and checked, and tokenized once the output
  // directory may be created.
  if (o.resume.empty()) {
    if (!a.has("data")) {
      TS_CHECK(o.model.vocab >= kByteVocab,
               "--data is required: the bundled corpus is byte-level (vocab 256) and the "
               "model's vocab is ",
               o.model.vocab);
      text_source = TESSERA_DEFAULT_CORPUS;
    } else {
      o.data = a.str("data");
      TS_CHECK(fs::exists(o.data), "data: ", o.data, " does not exist", dangling_link_note(o.data));
      if (!fs::is_directory(o.data) && !is_shard_file(o.data)) {
        TS_CHECK(o.model.vocab >= kByteVocab, "data ", o.data,
                 ": text is tokenized byte-level (vocab 256) and the "
                 "model's vocab is ",
                 o.model.vocab, "; give token shards instead");
        text_source = o.data;
      }
    }
  }
  if (!text_source.empty()) {
    // The text is read now and prepared into OUT/data, so train_setup's check of the outputs against the data
    // sees the prepared shards, not the text: a --trace of the text replaced it once the run had read it.
    OutputFiles files;
    files.protect(text_source, "the --data text, which the run reads");
    for (const auto& [flag, path] : trace_outputs(o)) files.claim(flag, path);
    {
      // A stop while the text is read (seconds for gigabytes, or an endless --data /dev/zero) ends the command as
      // one while its prepare runs does: a line, 128 + the signal, nothing written. Unhandled, it would be a
      // silent kill.
      text_signals.emplace(std::initializer_list<int>{SIGINT, SIGTERM, SIGHUP}, &read_stop,
                           /*keep_ignored=*/std::initializer_list<int>{SIGHUP});
      try {
        text = read_file_text(text_source, "data", &read_stop, /*stop_at_nul=*/true);
      } catch (const Error&) {
        if (read_stop == 0) {
          if (ranks.world) text_signals.reset();  // the ranks' agreement on the error waits with stops live
          throw;
        }
      }
      if (ranks.world) text_signals.reset();
      if (read_stop != 0) {
        TS_CHECK(!ranks.world, "interrupted while reading ", text_source);  // the ranks agree on an error
        return false;
      }
      if (fault_injected("train-stop-after-read")) ::raise(SIGINT);  // tests: a stop in the checks after the read
    }
    size_t bad = 0;
    TS_CHECK(is_utf8_text(text, &bad), "data ", text_source, " is neither a token shard (magic ", kShardMagic,
             ") nor plain text (", not_text_at(text, bad), "); tessera prepare turns text into shards");
    const size_t need = static_cast<size_t>(o.batch) * o.world_size * o.seq + 1;
    // The text's train split, as prepare will cut it: checked now, before anything is written (a --force whose
    // new text is too short leaves the old run as it was).
    const size_t n_train = prepare_split_sizes(text.size()).first;
    TS_CHECK(n_train >= need, "data ", text_source, ": its train split holds ", counted(n_train, "token"),
             ", fewer than batch x ", o.world_size > 1 ? "ranks x " : "", "seq + 1 = ", need);
  } else {
    setup.options.data = o.data;
    if (lead) lock_data(data_lock, o.data, o.out);
    train_open_data(setup);
  }
  return true;
}

void TrainCommand::check_sample() {
  // 4. The sample after training. Asked for where it cannot be drawn, it is an error now, not a sample left out
  // without a word after the run; by default a line then says why there is none.
  no_sample = byte_sample_refusal(o.model.vocab, setup.train_data ? setup.train_data->max_token() : -1);
  if (a.has("sample-tokens") && sample_flag > 0)
    TS_CHECK(no_sample.empty(), "--sample-tokens ", sample_flag, ": no sample can be drawn: ", no_sample);
  TS_CHECK(!a.has("prompt") || sample_flag > 0,
           "--prompt is for the sample after training, which --sample-tokens 0 turns off");
  TS_CHECK(!a.has("prompt") || no_sample.empty(), "--prompt: no sample can be drawn: ", no_sample);
}

int TrainCommand::run() {
  // Under mpirun every rank parses the same flags: a bad one is one line (from one rank), not one per rank, and
  // the job ends without MPI_Abort.
  bool help = false;
  ranks.agree([&] { help = !a.parse(argc_, argv_, 2, /*print_help=*/lead); });
  if (help) return 0;
  if (is_seq2seq_run()) return run_seq2seq();
  TS_CHECK(!a.has("max-tokens"), "--max-tokens applies to an encoder-decoder preset (paired --data)");
  TS_CHECK(!a.has("data") || !is_pair_data_dir(a.str("data")), "--data ", a.str("data"),
           " holds paired shards, which train an encoder-decoder preset; --preset ", a.str("preset", "tiny"),
           " is a GPT");
  ranks.agree([&] {
    read_flags();
    check_setup();
    if (!check_data()) return;
    check_sample();
    check_out_dir();
  });
  if (read_stop != 0) {
    std::fprintf(stderr, "tessera: %s while reading %s: nothing written\n", stop_word(read_stop), text_source.c_str());
    return 128 + read_stop;
  }
  // The gradient communicator (MPI for a CPU model, NCCL for a GPU one) joins every rank: a collective. Then the
  // ranks must agree on the run (options, data, world size; the text that rank 0 will tokenize), before anything
  // is written.
  if (ranks.world) {
    parallel = std::make_unique<DataParallelRun>(*ranks.world, *setup.context, dist);
    setup.parallel = parallel.get();
    Fnv fingerprint{run_fingerprint(o)};
    fingerprint.add(text.data(), text.size());
    parallel->check_consistent(fingerprint.h, "the training options, the data and the world size");
  }
  if (const int code = make_out_dir(); code != 0) return code;
  print_start();
  TrainResult r = train_run();
  text_signals.reset();  // after the training's handlers (the reverse order): the sample takes the default again
  created.keep();
  if (!lead) return g_stop != 0 ? 128 + g_stop : r.interrupted ? 128 + SIGTERM : 0;
  if (const std::optional<int> code = summarize(r)) return *code;
  return sample(r);
}

namespace {

// Prints a rank's one-line error, as main() would, before the job is aborted (naming the rank unless the message
// does: the communicators' errors start with it).
void print_rank_error(int rank, int size, std::string msg) {
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  if (!msg.starts_with("rank ")) msg = "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " + msg;
  std::fflush(stdout);
  std::fprintf(stderr, "tessera: error: %s\n", msg.c_str());
  std::fflush(stderr);
}

}  // namespace

int cmd_train(int argc, char** argv) {
  if (!MpiWorld::launched_by_mpi()) return TrainCommand(argc, argv, Ranks{}).run();
  MpiWorld world;
  try {
    MpiCommunicator launch(world);
    return TrainCommand(argc, argv, Ranks{.world = &world, .launch = &launch}).run();
  } catch (const CollectiveError& e) {
    // Every rank raised it at the same point: one line (from one rank), and the job ends cleanly.
    if (!e.quiet()) {
      std::fflush(stdout);
      std::string msg = e.what();
      for (char& c : msg)
        if (c == '\n' || c == '\r') c = ' ';
      std::fprintf(stderr, "tessera: error: %s\n", msg.c_str());
    }
    return 2;
  } catch (const std::bad_alloc&) {
    print_rank_error(world.rank(), world.size(), std::string("out of memory (") + kTrainMemoryHint + ")");
    world.abort(2);
  } catch (const std::exception& e) {
    // This rank alone failed (a collective timed out, a peer died, a write failed): the others may be waiting in
    // a collective for it, so the whole job ends now.
    print_rank_error(world.rank(), world.size(), e.what());
    world.abort(2);
  }
}

}  // namespace tessera::cli
