#!/usr/bin/env bash
# Builds tessera (CUDA sources too when nvcc is found) and runs the test suite. GPU tests skip without a GPU.
# The Python oracles use .venv/ when scripts/install_deps.sh made it (see tests/CMakeLists.txt).
# TESSERA_WERROR=ON (as .ci/run sets) makes every compiler warning an error.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# Show only tessera's own configure lines: CUDA, OpenBLAS and the Python interpreter of the oracles.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR="${TESSERA_WERROR:-OFF}" | grep -- "-- tessera:"
cmake --build "$BUILD" -j"$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" "$@"
