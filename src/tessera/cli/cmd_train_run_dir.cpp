// The output directory of `tessera train`: one run each, checked before anything is written; then made, locked,
// and the --data text prepared into it.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessera/cli/cmd_train.h"
#include "tessera/cli/common.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/train/checkpoint.h"
#include "tessera/train/data.h"
#include "tessera/train/text.h"

namespace tessera::cli {

namespace fs = std::filesystem;

namespace {

// What a run's directory holds besides the run itself: the shards of data/ (prepared there beforehand, or by an
// earlier run), and what a checkpoint swap or a metrics rewrite that was cut short leaves (<dir>.tmp, <dir>.old,
// ".metrics.jsonl.tmp.<pid>").
bool is_run_entry(const std::string& name) {
  for (const std::string dir : {"checkpoint", "best"})
    if (name == dir + ".tmp" || name == dir + ".old") return true;
  return name == "data" || name.starts_with(".metrics.jsonl.tmp.");
}

// The entries of `out`, an existing directory that holds no run, that are not a run's: sorted, for the message.
std::vector<std::string> foreign_entries(const fs::path& out) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out))
    if (!is_run_entry(e.path().filename().string())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// "a, b, c and 2 more": a refusal names what it found without running past its one line.
std::string first_names(const std::vector<std::string>& names) {
  std::string shown;
  for (size_t i = 0; i < names.size() && i < 3; ++i) shown += (i ? ", " : "") + names[i];
  if (names.size() > 3) shown += " and " + std::to_string(names.size() - 3) + " more";
  return shown;
}

}  // namespace

CreatedDirs::~CreatedDirs() {
  if (keep_) return;
  std::error_code ec;
  // The directories asked for go with what is in them; the parents made on the way only when empty (fs::remove
  // refuses a directory that is not), so that another run started into the same new parent keeps its files.
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    if (it->second) fs::remove_all(it->first, ec);
    else fs::remove(it->first, ec);
  }
}

// Each directory on the path that this process's own mkdir made (create_dirs_recorded): dir itself is the last of
// them when it was made.
void CreatedDirs::create(const std::string& dir) {
  bool made_dir = false;
  const std::vector<fs::path> made = create_dirs_recorded(dir, &made_dir);
  for (size_t i = 0; i < made.size(); ++i) created_.emplace_back(made[i], made_dir && i + 1 == made.size());
}

// Locks, shared, the directory of the shards a run reads (that of a single shard file) for the run's life: a tessera
// prepare into it (which takes it exclusively) replaced the shards under a running train, whose resume then failed.
// Data in the output directory itself is covered by its lock; data that is missing is left to the check that says so.
void lock_data(std::optional<DirectoryLock>& lock, const std::string& data, const std::string& out) {
  const fs::path p(data);
  const fs::path dir = fs::is_directory(p) ? p : p.has_parent_path() ? p.parent_path() : fs::path(".");
  lock.reset();
  std::error_code ec;
  // A directory this user may not list (a shard file given in it) cannot be opened to lock: it runs unlocked.
  if (!fs::is_directory(dir) || fs::equivalent(dir, out, ec) || ::access(dir.c_str(), R_OK) != 0) return;
  lock.emplace(dir.string(), "data directory", "(a prepare writes its shards): wait for it to end",
               DirectoryLock::Mode::Shared);
}

// A path as a shell word.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:+,@") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void TrainCommand::check_out_dir() {
  // 5. The output directory: one run each. A resumed run continues in the directory of its checkpoint; written
  // anywhere else that holds a run (--out B, or --resume RUN/best into RUN, whose checkpoint/ is later), it
  // would replace that run's checkpoint and cut its metrics back, silently.
  if (!o.resume.empty() && holds_run(o.out)) {
    const fs::path ck_dir = resume_dir(o.resume);
    std::error_code ec;
    const bool own = fs::equivalent(ck_dir.has_parent_path() ? ck_dir.parent_path() : fs::path("."), o.out, ec) &&
                     (ck_dir.filename() == "checkpoint" || ck_dir.filename() == "checkpoint.old");
    TS_CHECK(own, "--resume ", a.str("resume"), ": output directory ", o.out,
             " already holds a run, which this "
             "would replace (its checkpoint/, and metrics.jsonl cut back to this checkpoint's step): continue it "
             "with --resume ",
             (fs::path(o.out) / "checkpoint").string(), ", or give --out a new directory");
  }
  // A directory that holds no run but other files (`--out /`, a home or project directory) would get the run's
  // metrics.jsonl, checkpoint/, best/ and data/ mixed into what is there. --force replaces a run, so it does not
  // lift this: there is no run to replace.
  TS_CHECK(!fs::exists(o.out) || fs::is_directory(o.out), "output path ", o.out, " is not a directory");
  if (!holds_run(o.out) && fs::is_directory(o.out)) {
    const std::vector<std::string> other = foreign_entries(o.out);
    TS_CHECK(other.empty(), "output directory ", o.out, " holds no tessera run but other files (", first_names(other),
             "), which the run's metrics.jsonl, checkpoint/, best/ and data/ would be mixed into: give --out a new "
             "or empty directory");
  }
  // Train's text goes to OUT/data: a data/ that holds other files than shards (a run's directory whose data/
  // someone filled by hand) belongs to something else, not to the run. A killed prepare's hidden files are the
  // run's own, and the prepare removes them.
  if (!text_source.empty() && fs::is_directory(fs::path(o.out) / "data")) {
    std::vector<std::string> shards;
    for (const auto& e : fs::directory_iterator(fs::path(o.out) / "data")) {
      const std::string name = e.path().filename().string();
      const bool shard = e.is_regular_file() && e.path().extension() == ".bin" &&
                         (name.starts_with("train_") || name.starts_with("val_"));
      TS_CHECK(shard || is_prepare_leftover(name), "output directory ", o.out, ": its data/ holds ", name,
               ", not a shard train writes; train prepares the text into OUT/data: give another --out");
      if (shard) shards.push_back(name);
    }
    // Shards with no run beside them were prepared by hand (tessera prepare --out OUT/data): replaced without a
    // word, they would be lost. A run's own shards go with the run, which --force replaces. All of them are named
    // (the first few): one name would read as if the others were not at stake.
    std::sort(shards.begin(), shards.end());
    TS_CHECK(shards.empty() || holds_run(o.out) || a.has("force"), "output directory ", o.out,
             " holds no run, "
             "but its data/ holds shards (",
             first_names(shards), ") that train would replace with those of ", text_source,
             ": train on them with --data ", (fs::path(o.out) / "data").string(),
             ", give another --out, or --force to replace them");
  }
  if (o.resume.empty() && holds_run(o.out) && !a.has("force")) {
    for (const char* ck : {"checkpoint", "checkpoint.old"})
      if (fs::is_directory(fs::path(o.out) / ck))
        TS_THROW("output directory ", o.out, " already holds a run: continue it with --resume ",
                 (fs::path(o.out) / ck).string(), ", or replace it with --force");
    // A run stopped while it wrote its first checkpoint still has its best/ when it validated.
    const fs::path best = fs::path(o.out) / "best";
    const bool best_resumable = holds_train_state(best.string());
    TS_THROW("output directory ", o.out, " already holds a run with no checkpoint to resume",
             best_resumable
                 ? ", only its best/: continue that as a new run with --resume " + best.string() + " --out NEW,"
                 : ":",
             " replace it with --force, or choose another --out");
  }
}

int TrainCommand::make_out_dir() {
  // Checks done: from here on files are written, by rank 0 alone.
  out = fs::path(o.out);
  ranks.agree([&] {
    if (!lead) return;
    created.create(o.out);
    if (!out_lock) {
      // --out did not exist when the checks above ran, so they were made unlocked: another run started at the same
      // moment may hold it now, or may have trained in it and ended. Either way it is that one's.
      try {
        out_lock.emplace(o.out, "output directory", kOutBusy);
      } catch (const DirectoryInUse&) {
        created.keep();
        throw;
      }
      if (!fs::is_empty(o.out)) {
        created.keep();
        TS_THROW("output directory ", o.out,
                 " already holds a run, made by another tessera process started at the "
                 "same time: choose another --out");
      }
    }
    if (!text_source.empty()) {
      // prepare_shards replaces OUT/data's shards all or nothing (checked above: data/ holds nothing else). A stop
      // while it writes undoes it: killed there, it left a hidden temporary shard in OUT/data, which the next run
      // refused as a file that is not a shard.
      const std::string data_dir = (out / "data").string();
      created.create(data_dir);
      // Held exclusively while the text is prepared, then shared on the same descriptor for the run: released in
      // between, a prepare into OUT/data could replace the new shards before the run took its fingerprint.
      data_lock.emplace(data_dir, "data directory",
                        "(a train reads its shards, or a prepare writes them): wait for it to end, or choose another "
                        "--out");
      if (fault_injected("train-stop-before-prepare")) ::raise(SIGINT);  // tests: a stop after the checks
      PrepareReport prepared;
      try {
        const ScopedSignals stop({SIGINT, SIGTERM, SIGHUP}, &prepare_stop, /*keep_ignored=*/{SIGHUP});
        // A stop since the checks above (the scope starts its flag at 0): the prepare ends at once, undone.
        if (read_stop != 0) prepare_stop = read_stop;
        PrepareProgress bar(text.size(), o.progress && lead);
        prepared = prepare_shards(text, data_dir, {.stop = &prepare_stop, .progress = bar.callback(), .lock = false});
      } catch (const PrepareInterrupted& e) {
        // One process: it exits 128 + the signal below. Ranks: an error they agree on (the others wait for rank 0).
        TS_CHECK(!ranks.world, "interrupted while preparing ", text_source, " into ", data_dir, ": ", o.out,
                 " left as it was");
        prepare_interrupted = e.signal();
        return;
      }
      // A signal after the last shard was written: the training stops at its first step boundary, as if it had come
      // a moment later.
      if (prepare_stop != 0) record_stop(prepare_stop);
      if (fault_injected("train-stop-after-prepare")) ::raise(SIGINT);  // tests: a stop before the training's handlers
      const size_t n_train = prepared.n_train, n_val = prepared.n_val;
      std::error_code ec;
      // The source as the user would type it from here (the bundled corpus's path is absolute at build time).
      const fs::path shown = fs::proximate(text_source, ec);
      std::printf("prepared %s: %zu train / %s in %s\n", (ec ? text_source : shown.string()).c_str(), n_train,
                  counted(n_val, "val token").c_str(), data_dir.c_str());
      setup.options.data = data_dir;
      data_lock->share();
      train_open_data(setup);
    }
    // The run that --force replaces goes only once the new one's data has been checked. Its <dir>.old too (a swap
    // cut short): the loaders read RUN/checkpoint.old while RUN/checkpoint is missing, so until the new run's first
    // save (never, with --no-checkpoint; best/ only with validation) the old run's model would stand in for the
    // new one's.
    if (a.has("force")) {
      for (const char* name : {"metrics.jsonl", "checkpoint", "checkpoint.old", "best", "best.old"})
        fs::remove_all(out / name);
    }
  });
  if (prepare_interrupted != 0) {  // `created` removes the directories this run made
    std::fprintf(stderr, "tessera: %s while preparing %s: %s left as it was\n", stop_word(prepare_interrupted),
                 text_source.c_str(), o.out.c_str());
    return 128 + prepare_interrupted;
  }
  // The other ranks read the shards that rank 0 has just prepared (one file system, or a shared one).
  ranks.agree([&] {
    if (lead || text_source.empty()) return;
    setup.options.data = (out / "data").string();
    train_open_data(setup);
  });
  return 0;
}

}  // namespace tessera::cli
