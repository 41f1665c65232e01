#!/usr/bin/env bash
# Issue 10's sweep on one host with N GPUs: all-reduce, DDP and ZeRO-1 scaling, beside torch.distributed, into OUT:
#   allreduce_<dt>_n<N>.md/.log   mpirun -np N tessera bench allreduce --backend nccl-cuda --peer, 1 MB .. 1 GB, f32 and
#                                 bf16, at each N >= 2 of --ranks (default 2 4 8, capped at the GPUs present)
#   train_<form>_n<N>.log, .../   gpt2-124m, B 16 x T 1024 per GPU, bf16, --ddp bucket and --zero 1 at N = 1 and each
#                                 N of --ranks (N = 1 is one process without mpirun: the baseline of the efficiency)
#   zero_<preset>_n<N>.log        the largest cs336 preset that fits one GPU (the rule: zero_pick.txt), --zero 1 at
#                                 the largest N: rank 0's AdamW m+v against 1/N of the unsharded figure
#   summary.md, busbw_<dt>.png    written by bench/scale_report.py from whatever of the above is in OUT, with the
#                                 issue's targets met or not; summary.md is meant to be copied under bench/results/
# Usage: bench/scale.sh OUT_DIR [--ranks "2 4 8"] [--parts build,allreduce,train,zero] [--cpu-smoke] [--bin PATH]
#   --ranks    the N to run (default 2 4 8; on GPUs those above the GPU count are dropped): all-reduce at each N >= 2,
#              training at N = 1 (always: the baseline) and each N >= 2, the ZeRO check at the largest
#   --parts    which parts to run (default all four); the report is always rewritten from what OUT holds, so the
#              sweep can be split over calls of 10 minutes: --parts build,allreduce, then train, then zero. Where each
#              call starts with an empty output folder (the lent GPU machines), point OUT_DIR at an ignored path of
#              the tree that outlives the call (runs/scale) and copy it out after each; or gather every call's files
#              into one folder and run python3 bench/scale_report.py on it
#   --cpu-smoke  the same flow on CPU ranks (--device cpu, --backend mpi-cpu, 64KB and 1MB, tiny models, a few steps,
#              f32, no peers, a 64 MiB "GPU" for the preset rule), so the parsing, tables and checks run without GPUs
#   --bin PATH   use this tessera and skip the build (the CI test passes build-cpu's)
# Environment: TESSERA_MPIRUN (default "mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE"),
# OMP_NUM_THREADS (default 4 a rank on GPUs, 1 on CPU ranks).
# Exit status: 0 when every run succeeded and the report was written (targets not met are not failures), 1 otherwise.
set -uo pipefail
usage="usage: bench/scale.sh OUT_DIR [--ranks \"2 4 8\"] [--parts build,allreduce,train,zero] [--cpu-smoke] [--bin PATH]"
OUT=${1:?$usage}
COMMAND=bench/scale.sh
for arg in "$@"; do [[ $arg =~ ^[A-Za-z0-9_./,=:+-]+$ ]] && COMMAND+=" $arg" || COMMAND+=" \"$arg\""; done
shift
RANKS="" PARTS="build,allreduce,train,zero" SMOKE=0 BIN=""
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) RANKS=${2:?$usage}; shift 2 ;;
    --parts) PARTS=${2:?$usage}; shift 2 ;;
    --cpu-smoke) SMOKE=1; shift ;;
    --bin) BIN=${2:?$usage}; shift 2 ;;
    *) echo "bench/scale.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }
for p in ${PARTS//,/ }; do
  case $p in build|allreduce|train|zero) ;; *) echo "bench/scale.sh: unknown part '$p' (build, allreduce, train, zero)" >&2; exit 2 ;; esac
done
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
if [ -n "$BIN" ]; then BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN") || exit 2; fi
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
CORES=$(getconf _NPROCESSORS_ONLN)  # not nproc: it answers OMP_NUM_THREADS when that is set

# NVLink multicast (NVLS) stays off: the device notes require it (NCCL and torch's NCCL both read this).
export NCCL_NVLS_ENABLE=0
MPIRUN=${TESSERA_MPIRUN:-mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE}
rc=0
note() { echo "scale.sh: $*" | tee -a "$OUT/notes.txt"; }
why() { grep -m1 'tessera: error' "$1" || grep -v '^[- ]*$' "$1" | tail -1; }  # a failed run's log -> one line

# ---- what this run is: mode, ranks, sizes, models ----
if [ "$SMOKE" = 1 ]; then
  GPUS=0
  RANKS=${RANKS:-"2 4 8"}
  SIZES=64KB,1MB DTYPES="f32" AR_ITERS="--warmup 1 --iters 3"
  AR_FLAGS="--backend mpi-cpu"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  # A container without CAP_SYS_PTRACE refuses OpenMPI's process_vm_readv between CPU ranks.
  export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
  PRESET=tiny DEVICE="--device cpu" TB=2 TT=64 STEPS=8 PREC=f32 PREC_FLAG=""
  # The preset rule on a pretend 64 MiB GPU, over candidates that straddle it (tiny fits, cs336-small does not).
  CANDIDATES="cs336-small gpt2-124m tiny" ZB=2 ZT=64 ZERO_STEPS=2 GPU_MIB=64
else
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  GPUS=${GPUS:-0}
  [ "$GPUS" -ge 1 ] || { echo "bench/scale.sh: no GPU visible (nvidia-smi -L); use --cpu-smoke on a CPU machine" >&2; exit 2; }
  RANKS=${RANKS:-"2 4 8"}
  SIZES=1MB,10MB,100MB,1GB DTYPES="f32 bf16" AR_ITERS="--warmup 5 --iters 20"
  AR_FLAGS="--backend nccl-cuda --peer"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
  PRESET=gpt2-124m DEVICE="" TB=16 TT=1024 STEPS=30 PREC=bf16 PREC_FLAG="--precision bf16"
  CANDIDATES="cs336-2.7b cs336-xl cs336-large cs336-medium cs336-small" ZB=4 ZT=1024 ZERO_STEPS=3
  GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')
fi
# The ranks that can run here: at most one a GPU on a GPU host.
TRAIN_NS="" AR_NS=""
for n in $RANKS; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/scale.sh: --ranks: '$n' is not a positive integer" >&2; exit 2; }
  if [ "$SMOKE" = 0 ] && [ "$n" -gt "$GPUS" ]; then note "N = $n skipped: $GPUS GPUs here"; continue; fi
  [ "$n" -ge 2 ] && AR_NS="$AR_NS $n"
  [ "$n" -ge 2 ] && TRAIN_NS="$TRAIN_NS $n"
done
NMAX=1
for n in $TRAIN_NS; do [ "$n" -gt "$NMAX" ] && NMAX=$n; done
{
  echo "command: $COMMAND"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "mode: $([ "$SMOKE" = 1 ] && echo "cpu-smoke" || echo "gpu")"
  echo "ranks:$TRAIN_NS (all-reduce:$AR_NS; training also N = 1)"
  echo "tree: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with uncommitted changes)')"
  echo "NCCL_NVLS_ENABLE: $NCCL_NVLS_ENABLE"
  echo "mpirun: $MPIRUN ($($MPIRUN --version 2>/dev/null | head -1))"
  if [ "$SMOKE" = 0 ]; then
    echo "gpus: $GPUS x $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader -i 0)"
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0)"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "torch: $(python3 -c 'import torch; print(torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1)"
  else
    echo "cpus: $CORES cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'))"
  fi
} >"$OUT/env.txt" 2>&1
echo "$(date -u '+%Y-%m-%d %H:%M UTC'): \`$COMMAND\`" >>"$OUT/calls.txt"  # the sweep may be split over several calls
[ "$SMOKE" = 0 ] && nvidia-smi topo -m >"$OUT/topo.txt" 2>&1

# ---- build ----
if [ -z "$BIN" ]; then
  if [ "$SMOKE" = 1 ]; then BUILD=build-cpu CMAKE_ARGS="-DTESSERA_CUDA=OFF"
  else BUILD=build-gpu CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a"; fi
  BIN=$ROOT/$BUILD/tessera
  if has_part build || [ ! -x "$BIN" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release $CMAKE_ARGS -DPython3_EXECUTABLE="$(command -v python3)" \
      >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    grep -E "tessera: (CUDA|MPI|NCCL)" "$OUT/cmake.log"
    cmake --build "$BUILD" -j"$CORES" --target tessera >"$OUT/build.log" 2>&1 ||
      { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
  fi
fi
[ -x "$BIN" ] || { echo "bench/scale.sh: no tessera binary at $BIN" >&2; exit 1; }
echo "binary: $BIN" >>"$OUT/env.txt"

# ---- 1. all-reduce at each N, tessera and (on GPUs) torch.distributed in the same run ----
if has_part allreduce; then
  for n in $AR_NS; do
    for dt in $DTYPES; do
      f=$OUT/allreduce_${dt}_n$n
      $MPIRUN -np "$n" "$BIN" bench allreduce $AR_FLAGS --dtype "$dt" --sizes "$SIZES" $AR_ITERS --out "$f.md" \
        >"$f.log" 2>&1 || { rc=1; note "all-reduce $dt N = $n failed: $(why "$f.log")"; rm -f "$f.md"; }
      [ -f "$f.md" ] && echo "all-reduce $dt N = $n: $(grep -c '^| tessera' "$f.md") sizes"
    done
  done
fi

# Token shards, prepared once for every training run (byte-level; 40 copies of the bundled corpus on GPUs, ~1.1M
# tokens, so a run reads new data for most of its steps).
DATA=$OUT/data
if { has_part train || has_part zero; } && [ ! -f "$DATA/train_000000.bin" ]; then
  copies=$([ "$SMOKE" = 1 ] && echo 4 || echo 40)
  python3 -c "import sys; sys.stdout.write(open('data/corpus.txt').read() * $copies)" >"$OUT/corpus.txt"
  "$BIN" prepare --text "$OUT/corpus.txt" --out "$DATA" >"$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log"; exit 1; }
  rm -f "$OUT/corpus.txt"
fi
# A run's directory keeps metrics.jsonl and no checkpoint (--no-checkpoint: 1.5 GB for gpt2-124m, ~38 GB for
# cs336-2.7b, minutes to write); prune removes anything else a run may leave.
common="--data $DATA --val-every 0 --val-batches 1 --no-checkpoint --no-progress --sample-tokens 0 --force"
prune() { rm -rf "$1/checkpoint" "$1/best" "$1/data"; }

# ---- 2. gpt2-124m data parallel: N = 1 (one process), then --ddp bucket and --zero 1 at each N ----
if has_part train; then
  train_args="--preset $PRESET $DEVICE $PREC_FLAG --batch $TB --seq $TT --steps $STEPS --warmup 5 $common"
  echo "batch $TB seq $TT steps $STEPS precision $PREC" >"$OUT/train_config.txt"
  "$BIN" train $train_args --out "$OUT/train_single_n1" >"$OUT/train_single_n1.log" 2>&1 ||
    { rc=1; note "training N = 1 failed: $(why "$OUT/train_single_n1.log")"; }
  prune "$OUT/train_single_n1"
  # One process prints no optimizer line; its AdamW m+v is tessera info's unsharded figure.
  "$BIN" info --preset "$PRESET" --batch "$TB" --seq "$TT" --precision "$PREC" >"$OUT/info_train.txt" 2>&1 || true
  for n in $TRAIN_NS; do
    for form in bucket zero; do
      flags=$([ $form = bucket ] && echo "--ddp bucket" || echo "--zero 1")
      d=$OUT/train_${form}_n$n
      $MPIRUN -np "$n" "$BIN" train $train_args $flags --out "$d" >"$d.log" 2>&1 ||
        { rc=1; note "training $flags N = $n failed: $(why "$d.log")"; }
      prune "$d"
      echo "training $flags N = $n: $(grep -o 'AdamW m+v.*' "$d.log" | head -1)"
    done
  done
fi

# ---- 3. the largest cs336 preset that fits one GPU, --zero 1 at the largest N ----
# The rule: going down from the largest candidate, the first whose `tessera info --precision bf16 --batch ZB --seq ZT`
# total (params, grads, f32 master weights, AdamW m+v and the planned activations of one process) is at most 90% of
# one GPU's memory (nvidia-smi memory.total; the 10% is for the CUDA context, cuBLAS and NCCL), and which then trains
# 2 steps on one GPU (one process, no mpirun) without failing; a candidate that fails the trial gives way to the next.
if has_part zero; then
  pick=""
  rm -f "$OUT"/zero_*_n*.log "$OUT/info_zero.txt"
  echo "rule: the largest of {$CANDIDATES} whose tessera info total (B $ZB, T $ZT, $PREC) is <= 90% of one" \
    "GPU's $GPU_MIB MiB and which trains 2 steps on one GPU" >"$OUT/zero_pick.txt"
  for preset in $CANDIDATES; do
    info=$("$BIN" info --preset "$preset" --batch "$ZB" --seq "$ZT" --precision "$PREC" 2>&1)
    total=$(echo "$info" | grep -m1 -E '^ +total ' | awk '{print $2, $3}')
    mib=$(python3 -c "v, u = '$total'.split()
print(int(float(v) * {'B': 2**-20, 'KiB': 2**-10, 'MiB': 1, 'GiB': 2**10, 'TiB': 2**20}[u]))" 2>/dev/null)
    if [ -z "$mib" ]; then
      echo "$preset: tessera info gave no total: $(echo "$info" | tail -1)" >>"$OUT/zero_pick.txt"; rc=1; continue
    fi
    line="$preset: tessera info total $total"
    if [ $((mib * 10)) -gt $((GPU_MIB * 9)) ]; then echo "$line: over 90%, skipped" >>"$OUT/zero_pick.txt"; continue; fi
    d=$OUT/fit_$preset
    "$BIN" train --preset "$preset" $DEVICE --batch "$ZB" --seq "$ZT" --steps 2 --warmup 1 $common \
      $PREC_FLAG --out "$d" >"$d.log" 2>&1
    trial=$?
    prune "$d"
    if [ $trial -ne 0 ]; then
      echo "$line: fits by the estimate, but 2 steps on one GPU failed: $(why "$d.log")" >>"$OUT/zero_pick.txt"
      continue
    fi
    echo "$line: fits; 2 steps on one GPU trained ($(grep -m1 -o 'peak .* on the GPU' "$d.log" || echo "no GPU peak reported"))" \
      >>"$OUT/zero_pick.txt"
    pick=$preset
    echo "$info" >"$OUT/info_zero.txt"
    break
  done
  cat "$OUT/zero_pick.txt"
  if [ -z "$pick" ]; then
    rc=1; note "no candidate preset fits one GPU (zero_pick.txt)"
  elif [ "$NMAX" -lt 2 ]; then
    note "ZeRO check skipped: it needs N >= 2 (--ranks)"
  else
    d=$OUT/zero_${pick}_n$NMAX
    # A longer --comm-timeout than the default 300 s: the first steps of a big preset are slow to start.
    zargs="--preset $pick $DEVICE $PREC_FLAG --batch $ZB --seq $ZT --steps $ZERO_STEPS --warmup 1 $common --zero 1 --comm-timeout 1800"
    $MPIRUN -np "$NMAX" "$BIN" train $zargs --out "$d" >"$d.log" 2>&1 ||
      { rc=1; note "ZeRO run $pick N = $NMAX failed: $(why "$d.log")"; }
    prune "$d"
    grep -o 'AdamW m+v.*' "$d.log" | head -1
  fi
fi

# ---- 4. tables, plots, the summary and the targets ----
python3 bench/scale_report.py "$OUT" || rc=1
exit $rc
