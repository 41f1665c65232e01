#!/usr/bin/env bash
# On the GPU machine, in one call: build tessera with CUDA for sm_90a on all cores (reusing build-gpu/ when it is
# there), run the bench-model tests, then `tessera bench model` over the CS336 sizes (B 4, T 256, bf16: the issue's
# target setting) and GPT-2 124M at B 16, T 1024 (llm.c's setting), writing the tables (markdown, JSON, CSV), one
# Chrome trace and one memory timeline (PNG + CSV) per size into OUT_DIR. --peer: after tessera's sizes, the
# Hugging Face models of the same sizes in PyTorch eager and torch.compile (bench/peers/model.py, with the python3
# on PATH or $TESSERA_PYTHON: it needs torch with CUDA and transformers), in a second table with the speedup.
# Usage: scripts/bench_model.sh OUT_DIR [eager|compile|both]   (the peer's modes, default both: torch.compile of the
#   five cs336 sizes takes minutes, so on a machine with a 10-minute limit per command run eager and compile apart)
# Environment: TESSERA_PEER_TIMEOUT=S stops each peer run after S seconds (bench model --peer-timeout), keeping the
#   figures it printed by then (default 0: no limit).
set -uo pipefail
OUT=${1:?usage: scripts/bench_model.sh OUT_DIR [eager|compile|both]}
PEER_MODE=${2:-both}
PEER_TIMEOUT=${TESSERA_PEER_TIMEOUT:-0}
case $PEER_MODE in eager|compile|both) ;; *) echo "scripts/bench_model.sh: the peer mode is eager, compile or both, got '$PEER_MODE'" >&2; exit 2 ;; esac
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  git rev-parse HEAD 2>/dev/null || true
  "${TESSERA_PYTHON:-python3}" -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
    transformers.__version__, "cuda", torch.cuda.is_available())' || echo "the peer's python lacks torch or transformers"
} >"$OUT/env.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPython3_EXECUTABLE="$(command -v python3)" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target tessera tessera_tests >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
rc=0
build-gpu/tests/tessera_tests --gtest_filter='BenchModel*:ModelPeerFigures.*:Png.*:MemoryTimeline.*:AttentionNaive.*' \
  >"$OUT/tests.log" 2>&1 || rc=1
tail -3 "$OUT/tests.log"
build-gpu/tessera bench model --sizes cs336-small,cs336-medium,cs336-large,cs336-xl,cs336-2.7b,gpt2-124m \
  --batch 4 --seq 256 --precision bf16 --peer --peer-mode "$PEER_MODE" --peer-timeout "$PEER_TIMEOUT" --out "$OUT/model_b4_t256.md" --json "$OUT/model_b4_t256.json" \
  --csv "$OUT/model_b4_t256.csv" --trace "$OUT/trace_b4_t256.json" --memory-timeline "$OUT/memory_b4_t256.png" \
  2>&1 | tee "$OUT/model_b4_t256.log" || rc=1
build-gpu/tessera bench model --preset gpt2-124m --batch 16 --seq 1024 --precision bf16 --peer --peer-mode "$PEER_MODE" --peer-timeout "$PEER_TIMEOUT" \
  --out "$OUT/model_gpt2_b16_t1024.md" --json "$OUT/model_gpt2_b16_t1024.json" --csv "$OUT/model_gpt2_b16_t1024.csv" \
  --trace "$OUT/trace_gpt2_b16_t1024.json" --memory-timeline "$OUT/memory_gpt2_b16_t1024.png" \
  2>&1 | tee "$OUT/model_gpt2_b16_t1024.log" || rc=1
exit $rc
