#!/usr/bin/env bash
# On the GPU machine: build with CUDA for sm_90a on all cores, run every test (CUDA-labelled ones included,
# and the Hugging Face transformers load check, which needs transformers), and write logs to $1.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  git rev-parse HEAD 2>/dev/null || true
} >"$OUT/env.txt" 2>&1
# The image's torch and transformers live in the python3 on PATH, not necessarily /usr/bin/python3.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
# Two OpenMP threads per test: eight tests at once share the 16 cores without oversubscribing them.
export OMP_NUM_THREADS=2
ctest --test-dir build-gpu --output-on-failure -j8 >"$OUT/ctest.log" 2>&1
rc=$?
tail -25 "$OUT/ctest.log"
ctest --test-dir build-gpu -L cuda -V >"$OUT/ctest_cuda.log" 2>&1
ctest --test-dir build-gpu -R hf_transformers_load -V >"$OUT/hf.log" 2>&1
grep -E "ok |FAIL|skipped" "$OUT/hf.log"
grep -E "Passed|Failed|Skipped|OK \]" "$OUT/ctest_cuda.log" | head
exit $rc
