#!/usr/bin/env bash
# On the GPU machine: an old tree against this one, in the same call, for a refactor that must change no number.
# Builds both (CUDA, sm_90a, half the cores each, in parallel), then per MODE:
#   build:  only the builds (a later call on the warm machine reuses them)
#   losses: a gpt2-124m bf16 run of each tree; their metrics.jsonl losses must agree bit for bit
#   speed:  `bench model` (tessera's side of `bench compare`) for gpt2-124m at B 16, T 1024 and the five cs336
#           sizes at B 4, T 256, then `bench attention`, old and new alternated, rounds FIRST_ROUND (default 1) to
#           ROUNDS (default 2), into OUT as markdown (a call that cannot hold every round runs them in turn)
# Usage: scripts/compare_trees.sh OLD_DIR OUT_DIR MODE...   (OLD_DIR: a source tree, e.g. `git archive` of a commit)
set -uo pipefail
OLD=$(cd "${1:?usage: scripts/compare_trees.sh OLD_DIR OUT_DIR MODE...}" && pwd)
OUT=${2:?usage: scripts/compare_trees.sh OLD_DIR OUT_DIR MODE...}
shift 2
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
NEW=$(pwd)
half=$(( $(nproc) / 2 ))
build() {  # build TREE LOG
  cmake -S "$1" -B "$1/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$2" 2>&1 &&
  cmake --build "$1/build-gpu" -j"$half" --target tessera >>"$2" 2>&1
}
if [ ! -x "$OLD/build-gpu/tessera" ] || [ ! -x "$NEW/build-gpu/tessera" ]; then
  build "$OLD" "$OUT/build_old.log" & p1=$!
  build "$NEW" "$OUT/build_new.log" & p2=$!
  wait $p1 || { echo "old tree: build failed"; tail -20 "$OUT/build_old.log"; exit 1; }
  wait $p2 || { echo "new tree: build failed"; grep -E "error" "$OUT/build_new.log" | head -20; exit 1; }
fi
nvidia-smi --query-gpu=name --format=csv,noheader >"$OUT/gpu.txt"
rc=0
for mode in "$@"; do
  case $mode in
    build) ;;
    losses)
      for t in old new; do
        dir=$OLD; [ $t = new ] && dir=$NEW
        timeout 200 "$dir/build-gpu/tessera" train --preset gpt2-124m --batch 16 --seq 1024 --steps 30 --lr 6e-4 \
          --out "/tmp/cmp_$t" --force --no-progress --val-every 0 --ckpt-every 0 --sample-tokens 0 \
          >"$OUT/train_$t.log" 2>&1 || rc=1
        grep -o '"loss":[^,]*' "/tmp/cmp_$t/metrics.jsonl" >"$OUT/losses_$t.txt"
      done
      if cmp -s "$OUT/losses_old.txt" "$OUT/losses_new.txt" && [ -s "$OUT/losses_new.txt" ]; then
        echo "losses: the same, bit for bit, over $(wc -l <"$OUT/losses_new.txt") steps"
      else
        echo "losses: DIFFER"; diff "$OUT/losses_old.txt" "$OUT/losses_new.txt" | head; rc=1
      fi ;;
    speed)
      for round in $(seq "${FIRST_ROUND:-1}" "${ROUNDS:-2}"); do
        for t in old new; do
          dir=$OLD; [ $t = new ] && dir=$NEW
          B=$dir/build-gpu/tessera
          timeout 150 $B bench model --preset gpt2-124m --batch 16 --seq 1024 --precision bf16 --no-progress \
            --out "$OUT/gpt2_${t}_$round.md" >"$OUT/gpt2_${t}_$round.log" 2>&1 || rc=1
          timeout 200 $B bench model --sizes cs336-small,cs336-medium,cs336-large,cs336-xl,cs336-2.7b --batch 4 \
            --seq 256 --precision bf16 --no-progress --out "$OUT/cs336_${t}_$round.md" >"$OUT/cs336_${t}_$round.log" 2>&1 || rc=1
          timeout 200 $B bench attention --no-progress --out "$OUT/attention_${t}_$round.md" \
            >"$OUT/attention_${t}_$round.log" 2>&1 || rc=1
        done
      done ;;
    *) echo "scripts/compare_trees.sh: the modes are build, losses and speed, got '$mode'" >&2; exit 2 ;;
  esac
done
exit $rc
