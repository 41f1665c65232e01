// tessera — train and run transformer language models.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"

namespace {

const char* kUsage =
    "usage: tessera <command> [flags]\n"
    "\n"
    "commands:\n"
    "  train      train a model (no flags: the tiny model on the bundled corpus)\n"
    "  generate   continue a prompt with a trained checkpoint\n"
    "  prepare    turn a text file into train/val token shards (byte-level)\n"
    "  info       show a model's config, parameter count and memory estimate\n"
    "\n"
    "Run `tessera <command> --help` for the flags of each command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "train") return tessera::cli::cmd_train(argc, argv);
    if (cmd == "generate") return tessera::cli::cmd_generate(argc, argv);
    if (cmd == "prepare") return tessera::cli::cmd_prepare(argc, argv);
    if (cmd == "info") return tessera::cli::cmd_info(argc, argv);
    std::fprintf(stderr, "tessera: error: unknown command '%s' (see tessera --help)\n", cmd.c_str());
    return 2;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "\ntessera: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "\ntessera: error: out of memory (try a smaller model, --batch or --seq)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ntessera: internal error: %s\n", e.what());
    return 1;
  }
}
