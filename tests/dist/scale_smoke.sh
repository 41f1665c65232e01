#!/usr/bin/env bash
# ctest's dist_scale_smoke (labels cpu, dist): bench/scale.sh --cpu-smoke on 1 and 2 CPU ranks, then the summary must
# hold every row the sweep produces and the ZeRO-1 check must pass, so that a change that breaks the script's
# runs, its parsing or its tables fails here rather than on the day a 4- or 8-GPU machine is lent.
# Usage: scale_smoke.sh SOURCE_DIR TESSERA_BINARY WORK_DIR "MPIEXEC FLAGS"
set -uo pipefail
src=$1 bin=$2 work=$3
export TESSERA_MPIRUN="$4"
rm -rf "$work"
fail=0
check() {  # description, extended regex, file: the file must hold a line matching the regex
  if grep -qE "$2" "$3"; then echo "ok: $1"; else echo "FAIL: $1: no line matching /$2/ in $3"; fail=1; fi
}
bash "$src/bench/scale.sh" "$work" --cpu-smoke --ranks "1 2" --parts allreduce,train,zero --bin "$bin" >"$work.log" 2>&1
status=$?
cat "$work.log"
[ $status -eq 0 ] || { echo "FAIL: bench/scale.sh exited $status"; fail=1; }
s=$work/summary.md
[ -f "$s" ] || { echo "FAIL: no $s"; exit 1; }
num='[0-9]+\.[0-9]+'
# all-reduce: N = 2 at both sizes, bandwidths as numbers, no torch figures on the CPU
check "all-reduce row, N 2, 64 KB" "^\| 2 \| 64 KB \| $num \| $num \| – \| – \|$" "$s"
check "all-reduce row, N 2, 1 MB" "^\| 2 \| 1 MB \| $num \| $num \| – \| – \|$" "$s"
# training: the one-process baseline, then both forms at N = 2 with step time, tokens/s and an efficiency
check "training row, N 1" "^\| 1 \| one process \| $num \| [0-9]+ \| – \| [0-9.]+ [KMG]iB \(tessera info" "$s"
check "training row, N 2, --ddp bucket" "^\| 2 \| --ddp bucket \| $num \| [0-9]+ \| $num% \| [0-9.]+ [KMG]iB on each rank \(unsharded\) \|$" "$s"
check "training row, N 2, --zero 1" "^\| 2 \| --zero 1 \| $num \| [0-9]+ \| $num% \| [0-9.]+ [KMG]iB on rank 0 \(ZeRO-1: its 1/2 of" "$s"
# the preset rule and the ZeRO-1 check
check "preset rule: cs336-small over the budget" "^cs336-small: tessera info total .* over 90%, skipped$" "$s"
check "preset rule: tiny picked" "^tiny: tessera info total .*: fits; 2 steps" "$s"
check "ZeRO-1 check passes" "^ZeRO-1 memory check \(tiny, N = 2\): PASS: rank 0 holds AdamW m\+v" "$s"
# the targets, computed at the largest N and size that ran
check "target: all-reduce (no peer on the CPU)" "^\| all-reduce busbw f32, 1 MB, N = 2 .* \| not measured \|$" "$s"
check "target: bucket efficiency" "^\| \`--ddp bucket\` scaling efficiency, N = 2 .*: $num% \| (yes|\*\*no\*\*) \|$" "$s"
check "target: ZeRO-1 memory" "^\| \`--zero 1\` optimizer memory per rank, tiny, N = 2 .* \| yes \|$" "$s"
check "NVLS off" "NCCL_NVLS_ENABLE=0" "$s"
exit $fail
