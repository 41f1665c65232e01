#!/usr/bin/env bash
# On the GPU machine: build (sm_90a, all cores), run the attention CUDA tests (flash, tiled, naive, and the GPU
# model tests that call attention), memcheck and racecheck on the flash tests, the SASS check of the flash
# kernels (HMMA present, no local-memory traffic), then `tessera bench attention --peer`. Logs and tables go to $1.
# Usage: scripts/flash_check.sh OUT_DIR [nobench]
set -uo pipefail
OUT=${1:?usage: scripts/flash_check.sh OUT_DIR [nobench]}
MODE=${2:-bench}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git rev-parse HEAD; } >"$OUT/env.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DTESSERA_PTXAS_VERBOSE=ON -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target tessera tessera_cuda_tests >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
grep -A2 "flash_attention" "$OUT/build.log" | grep -E "Used [0-9]+ registers|spill" | sort | uniq -c >"$OUT/ptxas_flash.txt"
rc=0
for f in flash_forward flash_backward_dq flash_backward_dkdv; do
  o=build-gpu/CMakeFiles/tessera_core.dir/src/tessera/ops/attention/$f.cu.o
  echo "$f: HMMA $(cuobjdump -sass "$o" | grep -c HMMA), LDSM $(cuobjdump -sass "$o" | grep -c LDSM), LDGSTS $(cuobjdump -sass "$o" | grep -c LDGSTS), local LDL/STL $(cuobjdump -sass "$o" | grep -cE '\bLDL|\bSTL')"
done | tee "$OUT/sass_flash.txt"
export OMP_NUM_THREADS=4
timeout 240 build-gpu/tests/tessera_cuda_tests --gtest_filter='CudaFlash*:CudaNaive*:CudaAttention*:CudaRope*:CudaGpt*' >"$OUT/cuda_tests.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|> " "$OUT/cuda_tests.log" | head -60
# The general call (GQA, Tq != Tk, q_offset, key lengths) and the packed GQA call under each flash family's
# TESSERA_FLASH_PATH; a failure names the kernel family that ran ([tiled-fma], [flash-mma], ...).
for path in mma hopper; do
  TESSERA_FLASH_PATH=$path timeout 180 build-gpu/tests/tessera_cuda_tests \
    --gtest_filter='CudaAttentionGeneral*:CudaAttentionPackedGqa*' >"$OUT/general_$path.log" 2>&1 || rc=1
  echo "TESSERA_FLASH_PATH=$path:"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|> " "$OUT/general_$path.log" | head -30
done
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/tessera_cuda_tests \
  --gtest_filter='CudaFlashAttention.ForwardAndBackwardAreDeterministic:CudaFlashAttention.LongSequence*:CudaNaive*:CudaAttentionGeneral.BackwardIsDeterministic' >"$OUT/memcheck.log" 2>&1 || rc=1
tail -2 "$OUT/memcheck.log"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 build-gpu/tests/tessera_cuda_tests \
  --gtest_filter='CudaFlashAttention.LongSequence*' >"$OUT/racecheck.log" 2>&1 || rc=1
tail -2 "$OUT/racecheck.log"
if [ "$MODE" = bench ]; then
  timeout 420 build-gpu/tessera bench attention --peer --out "$OUT/bench_attention.md" >"$OUT/bench_attention.log" 2>&1 || rc=1
  tail -60 "$OUT/bench_attention.log"
fi
exit $rc
