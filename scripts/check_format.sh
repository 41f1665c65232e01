#!/usr/bin/env bash
# Fails (exit 1) when a C++/CUDA file under src/ or tests/ differs from what clang-format makes of it with the
# repository's .clang-format, and names the lines. Fix a failure with:
#   git ls-files src tests | grep -E '\.(h|cpp|cu|cuh)$' | xargs clang-format -i
# (twice: the string-pasting macros of ops/attention/flash_hopper_kernel.cuh settle on the second pass).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null || { echo "check_format: $CLANG_FORMAT not found (apt-get install clang-format)" >&2; exit 2; }
# Tracked files and new ones git does not ignore, so that a file not yet added is checked too.
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- src tests | grep -E '\.(h|cpp|cu|cuh)$' | sort -u)
[ ${#files[@]} -gt 0 ] || { echo "check_format: no sources found" >&2; exit 2; }
if "$CLANG_FORMAT" --dry-run -Werror --style=file "${files[@]}"; then
  echo "check_format: ${#files[@]} files formatted ($("$CLANG_FORMAT" --version | head -1))"
else
  echo "check_format: the files above are not formatted as .clang-format says" >&2
  exit 1
fi
