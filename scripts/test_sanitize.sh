#!/usr/bin/env bash
# Builds the CPU tests with AddressSanitizer + UndefinedBehaviorSanitizer (TESSERA_SANITIZE, CUDA off) in
# build-asan/ and runs them: an out-of-bounds access, a use after free, a leak in tessera's code or undefined
# behaviour fails the test that met it. Extra arguments go to ctest (e.g. -R Gemm).
#
# Left out: the two Python oracle tests (label oracle). They run the tessera_oracle_dump binary from a Python
# process, so ASan's report would land inside torch's output; the same code paths run in tessera_tests.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-asan}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=OFF -DTESSERA_SANITIZE=ON \
  -DTESSERA_WERROR="${TESSERA_WERROR:-OFF}" -DCMAKE_CXX_FLAGS=-g1 | grep -- "-- tessera:"
cmake --build "$BUILD" -j"$(nproc)"
# Leaks are checked, except those of OpenMPI's own start-up (tests/sanitize/lsan.supp). UBSan aborts at the first
# finding (-fno-sanitize-recover in the build), with a stack.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" -LE oracle "$@"
