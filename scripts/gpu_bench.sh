#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_check.sh has built build-gpu: every `tessera bench` table with its
# PyTorch peer from the same run, and a gpt2-124m training run for tokens/s and peak memory. Markdown tables and
# logs go to $1; copy the tables into bench/results/ with the date, the GPU and the commit.
# Usage: scripts/gpu_bench.sh OUT_DIR
set -uo pipefail
OUT=${1:?usage: scripts/gpu_bench.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
B=build-gpu/tessera
rc=0
for dt in bf16 f32; do
  timeout 120 $B bench kernels --peer --dtype $dt --out "$OUT/kernels_$dt.md" >"$OUT/kernels_$dt.log" 2>&1 || rc=1
done
timeout 120 $B bench optimizer --peer --out "$OUT/optimizer.md" >"$OUT/optimizer.log" 2>&1 || rc=1
if $B bench --help 2>&1 | grep -q attention; then
  timeout 300 $B bench attention --peer --out "$OUT/attention.md" >"$OUT/attention.log" 2>&1 || rc=1
fi
timeout 120 $B train --preset gpt2-124m --batch 16 --seq 1024 --steps 40 --out /tmp/gpu_bench_run --force \
  --no-progress --val-every 0 --ckpt-every 0 --sample-tokens 0 >"$OUT/train_gpt2.log" 2>&1 || rc=1
tail -3 "$OUT/train_gpt2.log"
tail -5 /tmp/gpu_bench_run/metrics.jsonl >"$OUT/train_gpt2_last_steps.jsonl" 2>/dev/null
exit $rc
