#!/usr/bin/env bash
# Builds the CPU tests with AddressSanitizer + UndefinedBehaviorSanitizer (TESSERA_SANITIZE, CUDA off) in
# build-asan/ and runs them: an out-of-bounds access, a use after free or undefined behaviour fails the test that
# met it. Extra arguments go to ctest (e.g. -R Gemm).
# Every CPU test runs, the Python oracles too (their tessera_oracle_dump is the sanitized binary), except those that
# run tessera under an address limit: ASan's shadow memory leaves no room for one, and they skip
# (TS_SKIP_UNLESS_ADDRESS_LIMITS_APPLY, tests/cli/cli_run.h). .ci/run runs this after the normal suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-asan}
# Warnings are not errors here, whatever TESSERA_WERROR says: the normal build checks them, and under -fsanitize
# GCC 12 warns -Wmaybe-uninitialized inside <regex> (std::function in regex_automaton.h, cli/common.cpp), a false
# positive that the sanitizers' instrumentation brings out.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=OFF -DTESSERA_SANITIZE=ON \
  -DTESSERA_WERROR=OFF -DCMAKE_CXX_FLAGS=-g1 | grep -- "-- tessera:"
cmake --build "$BUILD" -j"$(nproc)"
# Leaks are not checked (detect_leaks=0): OpenMPI's start-up leaks in every rank, from components it has unloaded
# by exit, so LeakSanitizer cannot name them for a suppression, and the tests run tessera under mpirun. UBSan aborts
# at the first finding (-fno-sanitize-recover in the build), with a stack.
export ASAN_OPTIONS="detect_leaks=0:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" "$@"
