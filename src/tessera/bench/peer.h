// tessera/bench/peer.h — runs a PyTorch peer script of bench/peers/ beside a tessera benchmark and hands over the
// JSON objects it prints (one per line), so that the tables can show the peer's figures from the same run.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tessera {

// Runs `<python> <args>` through /bin/sh with stderr joined to stdout, python being $TESSERA_PYTHON (a virtual
// environment's interpreter) or python3, in a process group of its own. Every output line that parses as a JSON
// object goes to `take` as it arrives, which returns whether it was a figure; the last other line is kept for the
// note. timeout_s > 0: at that many seconds the whole group is stopped (SIGTERM, then SIGKILL), and the figures
// taken by then stand. Returns "" when the peer gave a figure and exited 0, else one line:
//   "peer skipped: <python> not found"          no figure, exit 127 (the shell found no interpreter)
//   "peer skipped: <last line>"                  no figure ("<what> printed no figures" when it printed nothing)
//   "peer exited with code N[: <last line>]"     figures, but a non-zero exit
//   "peer stopped at --peer-timeout S: the cells it had not reached are –"      figures, then the timeout
//   "peer skipped: stopped at --peer-timeout S[ (its last line: <line>)]"       the timeout before any figure
std::string run_peer_script(const std::string& args, const std::string& what,
                            const std::function<bool(const nlohmann::json&)>& take, double timeout_s = 0);

// "300 s", "2.5 s": a --peer-timeout as the notes print it.
std::string fmt_seconds(double s);

}  // namespace tessera
