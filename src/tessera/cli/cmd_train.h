// tessera/cli/cmd_train.h — `tessera train`, in parts: the flags (cmd_train_flags.cpp), the output directory
// (cmd_train_run_dir.cpp), the stop signals (cmd_train_signals.cpp), the startup lines, the summary and the sample
// (cmd_train_summary.cpp), and the command that runs them in order (cmd_train.cpp).
#pragma once
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/cli/flags.h"
#include "tessera/core/file_io.h"
#include "tessera/core/signals.h"
#include "tessera/dist/data_parallel.h"
#include "tessera/dist/mpi_communicator.h"
#include "tessera/dist/mpi_world.h"
#include "tessera/train/trainer.h"

namespace tessera::cli {

// Above this many parameters no sample is drawn by default: on the CPU it would take minutes.
constexpr int64_t kSampleMaxParams = 100'000'000;
constexpr int kDefaultSampleTokens = 100;

// The stop signals (cmd_train_signals.cpp). g_stop: the first stop signal's number while training runs, 0 before.
extern SignalFlag g_stop;
// SIGINT, SIGTERM, SIGHUP and SIGPIPE's handler while training runs: the first signal asks for a stop after the
// step (said at once, with the note set_stop_note chose); a second one, later than a repeat of the same stop, exits.
extern "C" void on_stop_signal(int sig);
// Chooses what the first stop prints: rank 0's line, which says whether a checkpoint follows; none on other ranks.
void set_stop_note(bool lead, bool checkpoints, bool progress);
// A stop that came before the training's handlers: `read_stop` (while the text was read) is handled now as one
// during the training; one already recorded (during the prepare) is said now.
void say_earlier_stop(int read_stop);
// Records a stop that came while the text was prepared, as the handler would.
void record_stop(int sig);

// Removes the directories this command created when it fails before its first step, so that a failed command
// leaves no empty output directory and no prepared shards (cmd_train_run_dir.cpp).
class CreatedDirs {
 public:
  ~CreatedDirs();
  // Creates `dir`, remembering each directory on its path that this process's own mkdir made.
  void create(const std::string& dir);
  void keep() { keep_ = true; }

 private:
  std::vector<std::pair<std::filesystem::path, bool>> created_;  // (directory, whether one asked for), outermost first
  bool keep_ = false;
};

// The ranks of a run under mpirun: the MPI runtime, and a communicator on which the ranks agree on the outcome
// of each phase of the command.
struct Ranks {
  const MpiWorld* world = nullptr;
  MpiCommunicator* launch = nullptr;
  int rank() const { return world ? world->rank() : 0; }
  int size() const { return world ? world->size() : 1; }
  // Runs fn; under mpirun every rank learns whether it failed anywhere (run_collectively).
  void agree(const std::function<void()>& fn) const {
    if (launch) run_collectively(*launch, fn, kTrainMemoryHint);
    else fn();
  }
};

// `tessera train`: checks everything, makes the output directory, trains, and prints the summary and a sample.
class TrainCommand {
 public:
  TrainCommand(int argc, char** argv, const Ranks& ranks);
  int run();

 private:
  // An encoder-decoder run (cmd_train_seq2seq.cpp): an encoder-decoder preset, paired --data, or --resume of an
  // encoder-decoder checkpoint.
  bool is_seq2seq_run() const;
  int run_seq2seq();

 private:
  // 1. The flags into the options, with nothing read or written yet (cmd_train_flags.cpp).
  void read_flags();
  void read_data_parallel_flags();
  // 2. Every option against the model, the resume checkpoint and the memory the run needs (reads only).
  void check_setup();
  // 3. The data: false when a stop interrupted the read of a text.
  bool check_data();
  // 4. The sample after training.
  void check_sample();
  // 5. The output directory (cmd_train_run_dir.cpp): one run each; then, checks done, made (rank 0) and the text
  // prepared into it. Returns 0, or the exit code of a stop during the prepare.
  void check_out_dir();
  int make_out_dir();
  // The startup lines, the training under its signal handlers, the summary (an exit code, or nullopt to go on to
  // the sample) and the sample (cmd_train_summary.cpp).
  void print_start();
  TrainResult train_run();
  std::optional<int> summarize(const TrainResult& r);
  int sample(TrainResult& r);

  char** argv_;
  const Ranks& ranks;
  Flags a;
  bool lead = true;  // the one rank that writes files and prints
  int argc_;
  TrainOptions o;
  TrainSetup setup;
  DataParallelOptions dist;
  std::string text, text_source, no_sample;
  int sample_flag = kDefaultSampleTokens;
  // Held by rank 0 until it exits: one train at a time in OUT. Taken as soon as OUT is known, when it exists
  // (before the checks read its checkpoint, which a running train may be swapping), else once it is made.
  std::optional<DirectoryLock> out_lock;
  // Rank 0's lock on the directory of the shards it reads: shared (exclusive while train prepares its text there).
  std::optional<DirectoryLock> data_lock;
  SignalFlag read_stop = 0;  // a stop while the --data text is read
  // One process: from the read of a --data text until the training's own handlers, a stop is recorded in read_stop
  // and said, where between the read, the prepare and the training the default action would kill train without a
  // word (seconds, for gigabytes of text). Ranks keep it for the read alone: a flag that some ranks saw and others
  // did not would part them, and mpirun ends them all on a stop anyway.
  std::optional<ScopedSignals> text_signals;
  std::unique_ptr<DataParallelRun> parallel;
  std::filesystem::path out;
  CreatedDirs created;
  SignalFlag prepare_stop = 0;  // a stop while train prepares its text (the training's handlers come later)
  int prepare_interrupted = 0;  // the signal that undid the prepare
};

// What a refusal to train into a busy output directory adds.
constexpr const char* kOutBusy =
    "(a train into it, or a resume of it): wait for that one to end, or choose another --out";

// The flags of `tessera train` (cmd_train_flags.cpp).
void add_train_flags(Flags& a);

// Locks, shared, the directory of the shards a run reads for the run's life (cmd_train_run_dir.cpp).
void lock_data(std::optional<DirectoryLock>& lock, const std::string& data, const std::string& out);
// A path as a shell word.
std::string shell_quote(const std::string& s);

}  // namespace tessera::cli
