#!/usr/bin/env bash
# On any machine, GPU or not: a per-kernel summary of a CUDA object's SASS, to check a kernel change before spending
# device time on it. Per function: instructions, HGMMA (wgmma), WARPGROUP.DEPBAR (wgmma waits), local-memory loads
# and stores, and a warning where every HGMMA has its own wait: ptxas serialized the wgmmas (it also says so with
# -Xptxas -v as C7510-C7520; a serialized loop ran 20-30% slower in 2026-11-30-hopper-backward-h200.md).
#
# cuobjdump comes with the full CUDA toolkit, not with the compiler-only one of the CPU machines; where it is missing
# this fetches NVIDIA's cuobjdump wheel from PyPI (nvidia-cuda-cuobjdump) into ~/.cache/tessera-cuobjdump once.
# Usage: scripts/sass_summary.sh OBJECT.o [NAME_FILTER]
#   e.g. scripts/sass_summary.sh build/CMakeFiles/tessera_core.dir/src/tessera/ops/attention/flash_hopper_backward.cu.o dkdv
set -euo pipefail
OBJ=${1:?usage: scripts/sass_summary.sh OBJECT.o [NAME_FILTER]}
FILTER=${2:-}
[ -f "$OBJ" ] || { echo "sass_summary: $OBJ: no such file (build it first)" >&2; exit 2; }

find_cuobjdump() {
  if command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1; then command -v cuobjdump; return; fi
  local cache="$HOME/.cache/tessera-cuobjdump" tmp bin
  for d in /usr/local/cuda/bin "$cache/nvidia/cu13/bin"; do
    [ -x "$d/cuobjdump" ] && [ -x "$d/nvdisasm" ] && { echo "$d/cuobjdump"; return; }
  done
  tmp=$(mktemp -d)
  echo "sass_summary: no cuobjdump + nvdisasm here; fetching NVIDIA's wheels from PyPI into $cache" >&2
  if ! python3 -m pip download --quiet --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$tmp" >&2; then
    rm -rf "$tmp"
    echo "sass_summary: pip could not fetch nvidia-cuda-cuobjdump / -nvdisasm; install the CUDA toolkit's" >&2
    exit 1
  fi
  mkdir -p "$cache"
  for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
  rm -rf "$tmp"
  bin=$(find "$cache" -type f -name cuobjdump | head -n 1)
  [ -n "$bin" ] && [ -f "$(dirname "$bin")/nvdisasm" ] || { echo "sass_summary: the wheels held no cuobjdump" >&2; exit 1; }
  chmod +x "$bin" "$(dirname "$bin")/nvdisasm"
  echo "$bin"
}

CUOBJDUMP=$(find_cuobjdump)
SASS=$(mktemp)
trap 'rm -f "$SASS"' EXIT
PATH="$(dirname "$CUOBJDUMP"):$PATH" "$CUOBJDUMP" -sass "$OBJ" >"$SASS"  # cuobjdump runs nvdisasm from PATH
awk -v filter="$FILTER" '
  /Function :/ {
    name = $3
    keep = (filter == "" || index(name, filter) > 0)
    if (keep) order[++n] = name
    next
  }
  !keep { next }
  /\/\*[0-9a-f]+\*\// { ins[name]++ }
  /HGMMA/ { hgmma[name]++ }
  /WARPGROUP\.DEPBAR/ { depbar[name]++ }
  /[ \t](LDL|STL)(\.[A-Z0-9]+)*[ \t]/ { local[name]++ }
  END {
    printf "%8s %6s %6s %6s  %s\n", "instrs", "HGMMA", "DEPBAR", "LDL/STL", "function"
    for (i = 1; i <= n; ++i) {
      f = order[i]
      printf "%8d %6d %6d %6d  %s\n", ins[f], hgmma[f], depbar[f], local[f], f
      if (hgmma[f] > 1 && depbar[f] >= hgmma[f])
        printf "         warning: a wait per HGMMA: ptxas serialized the wgmmas of %s\n", f
    }
  }' "$SASS"
