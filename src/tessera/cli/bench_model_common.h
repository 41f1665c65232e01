// tessera/cli/bench_model_common.h — what `bench model` and `bench compare` share: reading the flags that pick the
// sizes, shapes, precision and runs of bench/model.h's measurement; running the PyTorch peer
// (bench/peers/model.py) over the same; and the cells of their tables. `what` ("bench model", "bench compare")
// heads every error message.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/bench/model.h"
#include "tessera/cli/flags.h"
#include "tessera/core/context.h"
#include "tessera/models/config.h"

namespace tessera::cli {

// "a, b,c" -> {"a", "b", "c"}; an empty item is an error (--sizes).
std::vector<std::string> split_list(const std::string& s);
// "512MiB", "1.5GiB", "2GB", "1000000": bytes (--max-memory).
size_t parse_bytes(const std::string& what, const std::string& v);

// --warmup (5), --steps (10), --batch (4) and --max-memory into bc, checked.
void read_model_bench_runs(const Flags& a, const std::string& what, ModelBenchConfig& bc);

// Where and what a model bench runs: --device, --precision, --cuda-graph, --preset / --sizes and --seq, checked
// (bc.dtype, bc.loss_scaling (f16), bc.cuda_graph and bc.seq are set from them).
struct ModelBenchTarget {
  Context ctx;
  std::string prec = {};                // "f32", "bf16" or "f16"
  std::vector<std::string> names = {};  // the presets, in the order given
  std::vector<ModelConfig> cfgs = {};
  std::string device = {};        // "cpu" or "cuda:0 (<the GPU's name>)"
  std::string no_graph = {};      // model_bench_graph_refusal: "" when the regions are CUDA graph replays
  std::string regions_line = {};  // "regions: ..." for the header
};
ModelBenchTarget read_model_bench_target(const Flags& a, const std::string& what, ModelBenchConfig& bc);

// Runs bench_model over the sizes with a progress bar on stderr ("[###....] part 4/9 | gpt2-medium fwd+bwd | 1m02s
// elapsed"; none when `progress` is false), and each size's outcome as a line on stderr ("  gpt2-124m: done in 12.3
// s", "  cs336-xl: OOM (...)"): stdout is left to the report, which a user redirects. `after` runs once a size is
// done (bench model writes its trace there; what it says goes to stderr as well).
std::vector<ModelBenchRow> run_model_bench_sizes(
    const std::vector<ModelConfig>& cfgs, ModelBenchConfig bc, Context& ctx, double gemm_flops_per_s, bool progress,
    const std::function<void(const ModelConfig&, const ModelBenchRow&)>& after = {});

// --peer-mode eager|compile|both (default both) as the modes bench/peers/model.py is asked for.
std::vector<std::string> read_peer_modes(const Flags& a, const std::string& what);
// --peer-timeout S: seconds after which the peer is stopped, its figures so far kept (default 0: no limit).
double read_peer_timeout(const Flags& a, const std::string& what);
inline constexpr const char* kPeerTimeoutHelp =
    "stop the peer after S seconds (default: no limit; torch.compile of several sizes takes minutes): the figures "
    "it printed by then stay, its other cells read –";

// What bench/peers/model.py printed: its records by (size, mode), the versions it ran with, or a one-line reason
// why there is none (run_peer_script's note).
struct ModelPeer {
  std::map<std::pair<std::string, std::string>, ModelPeerFigures> figures;
  std::string note, torch, transformers, device;
  const ModelPeerFigures* find(const std::string& size, const std::string& mode) const {
    const auto it = figures.find({size, mode});
    return it == figures.end() ? nullptr : &it->second;
  }
};
// Runs bench/peers/model.py ($TESSERA_PYTHON or python3) over the sizes and modes, with bc's regions, batch,
// sequence length and runs, in `precision` on `device` ("cpu", "cuda:N"); stopped at timeout_s (> 0).
ModelPeer run_model_peer(const std::vector<std::string>& sizes, const std::vector<std::string>& modes,
                         const ModelBenchConfig& bc, const std::string& precision, const std::string& device,
                         double timeout_s);

// A time in ms: 3 decimals below 10, else 2.
std::string ms_text(double ms);
std::string csv_num(double v);  // %.6g
// A memory cell: "OOM", "–" when absent, else human_bytes.
std::string cell_bytes(const std::optional<size_t>& b, bool oom);
// A peer cell: "OOM", "failed", "–" when the peer printed nothing for it, else the value (bytes or ms).
std::string peer_cell(const ModelPeerFigures* f, const std::optional<double>& v, bool bytes);

}  // namespace tessera::cli
