#!/usr/bin/env bash
# On a machine with 2 GPUs (NVLink): build with CUDA and NCCL, run the distributed tests (the NCCL instances and the
# MPI ones), then the benchmarks of issue 9 beside their torch.distributed peer, and write logs and tables to $1:
#   allreduce_f32.md, allreduce_bf16.md   tessera bench allreduce --backend nccl-cuda --peer (1 MB .. 1 GB)
#   ddp.md                                gpt2-124m, B 16 x T 1024 per GPU, bf16: one GPU, the four --ddp forms
#                                         (bucket at 1, 10, 25, 100 MB) and --zero 1, step times and scaling
#                                         efficiency; HF GPT-2 alone, under DDP and under ZeroRedundancyOptimizer
# Usage: scripts/dist_check.sh OUT_DIR [tests|allreduce|ddp]   (default: all three; each part alone fits in a
# 10-minute call once the build is there)
set -uo pipefail
OUT=${1:?usage: scripts/dist_check.sh OUT_DIR [tests|allreduce|ddp]}
MODE=${2:-all}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m
  nvcc --version | tail -1
  mpirun --version | head -1
  git rev-parse HEAD 2>/dev/null || true
} >"$OUT/env.txt" 2>&1
MPI="mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep -E "tessera: (CUDA|MPI|NCCL)" "$OUT/cmake.log"
cmake --build build-gpu -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
export OMP_NUM_THREADS=4
rc=0
B=build-gpu/tessera

if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  # dist_nccl (label cuda) runs the NCCL instances on 2 ranks, one a GPU; dist_mpi_np2/4 and the CLI tests the MPI path.
  ctest --test-dir build-gpu --output-on-failure -R 'dist_|Dist|Zero|Ddp|GradReady' >"$OUT/dist_tests.log" 2>&1 || rc=1
  tail -15 "$OUT/dist_tests.log"
  # The CUDA fault path: a stalled rank makes the other fail within --comm-timeout on NCCL too.
  python3 - >"$OUT/corpus.txt" <<'EOF'
import sys
text = open("data/corpus.txt").read()
sys.stdout.write(text * 40)
EOF
  rm -rf "$OUT/stall"
  start=$(date +%s)
  TESSERA_DIST_FAULT=1:3:hang timeout 300 $MPI $B train --preset tiny --data "$OUT/corpus.txt" --out "$OUT/stall" \
    --steps 50 --comm-timeout 10 --no-progress --sample-tokens 0 >"$OUT/stall.log" 2>&1
  echo "stalled rank on NCCL: exit $? after $(( $(date +%s) - start )) s (expect 2 after ~10 s):"
  grep "tessera: error" "$OUT/stall.log" | head -2
fi

if [ "$MODE" = all ] || [ "$MODE" = allreduce ]; then
  # All-reduce bus bandwidth, tessera (NCCL) and torch.distributed in the same run.
  for dt in f32 bf16; do
    $MPI $B bench allreduce --backend nccl-cuda --dtype "$dt" --sizes 1MB,10MB,100MB,1GB --warmup 5 --iters 20 --peer \
      --out "$OUT/allreduce_$dt.md" >"$OUT/allreduce_$dt.log" 2>&1 || rc=1
    tail -6 "$OUT/allreduce_$dt.log"
  done
fi
if [ "$MODE" != all ] && [ "$MODE" != ddp ]; then exit $rc; fi

# Step time of gpt2-124m, B 16 x T 1024 per GPU, bf16: median ms a step over steps 6..N of metrics.jsonl.
python3 - >"$OUT/corpus.txt" <<'EOF'
import sys
text = open("data/corpus.txt").read()
sys.stdout.write(text * 40)
EOF
STEPS=30
step_ms() {  # run dir, ranks -> median ms a step (global tokens / tokens_per_s), skipping 5 warm-up steps
  python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")][5:]
print("%.1f" % statistics.median(16 * 1024 * int(sys.argv[2]) / r["tokens_per_s"] * 1e3 for r in recs))
EOF
}
train_args="--preset gpt2-124m --data $OUT/corpus.txt --batch 16 --seq 1024 --steps $STEPS --warmup 5 --val-every 0 \
  --val-batches 1 --no-checkpoint --no-progress --sample-tokens 0 --force"
$B train $train_args --out "$OUT/run_single" >"$OUT/run_single.log" 2>&1 || rc=1
single=$(step_ms "$OUT/run_single" 1)
{
  echo "# gpt2-124m data parallel on 2 GPUs, B 16 x T 1024 per GPU, bf16 (f32 master weights)"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo "- step time: median over steps 6..$STEPS of metrics.jsonl (global tokens / tokens_per_s); scaling efficiency = single-GPU step / 2-GPU step"
  echo
  echo "| run | ms / step | scaling efficiency | optimizer memory (rank 0) |"
  echo "|---|---:|---:|---|"
  echo "| tessera, 1 GPU | $single | – | $(grep -o 'AdamW m+v.*' "$OUT/run_single.log" | head -1) |"
} >"$OUT/ddp.md"
for form in "naive" "flat" "overlap" "bucket 1" "bucket 10" "bucket 25" "bucket 100" "zero"; do
  set -- $form
  name=${1}${2:+-$2}
  if [ "$1" = zero ]; then flags="--zero 1"; elif [ "$1" = bucket ]; then flags="--ddp bucket --bucket-mb $2"; else flags="--ddp $1"; fi
  $MPI $B train $train_args $flags --out "$OUT/run_$name" >"$OUT/run_$name.log" 2>&1 || { rc=1; tail -3 "$OUT/run_$name.log"; continue; }
  ms=$(step_ms "$OUT/run_$name" 2)
  eff=$(python3 -c "print('%.1f%%' % (100 * $single / $ms))")
  mem=$(grep -o 'AdamW m+v.*' "$OUT/run_$name.log" | head -1)
  echo "| tessera, 2 GPUs, $flags | $ms | $eff | $mem |" >>"$OUT/ddp.md"
done
# The peer: HF GPT-2 eager alone, under DDP (25 MB buckets) and under ZeroRedundancyOptimizer.
for mode in single ddp zero; do
  n=$([ "$mode" = single ] && echo 1 || echo 2)
  python3 -m torch.distributed.run --standalone --nproc_per_node "$n" bench/peers/allreduce.py --which gpt2 \
    --mode "$mode" >"$OUT/peer_gpt2_$mode.log" 2>&1 || rc=1
  grep '^{' "$OUT/peer_gpt2_$mode.log" | tail -1 | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
print('| HF GPT-2 eager (torch), %d GPU%s, %s | %.1f | | AdamW state %.2f GiB a rank; peak %.1f GiB |' % (
    r['world'], 's' if r['world'] > 1 else '', r['mode'], r['median_ms'], r['optimizer_gib'], r['peak_gib']))
" >>"$OUT/ddp.md" || rc=1
done
cat "$OUT/ddp.md"
exit $rc
