#!/usr/bin/env bash
# The NCCL instances of tessera_dist_tests (ctest's dist_nccl, label cuda): one rank a GPU, as many ranks as there
# are GPUs, at most 2 (1 is allowed: the collectives then run over one rank). Exit 77 (ctest: skipped) without
# a GPU. Usage: run_nccl_tests.sh MPIEXEC "MPIEXEC_FLAGS" TESSERA_DIST_TESTS
set -euo pipefail
mpiexec=$1 flags=$2 binary=$3
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 1 ]; then
  echo "dist_nccl: no GPU visible: skipped"
  exit 77
fi
np=$(( gpus < 2 ? gpus : 2 ))
# shellcheck disable=SC2086  # flags are words
exec "$mpiexec" -np "$np" $flags "$binary" --gtest_filter='*Nccl'
