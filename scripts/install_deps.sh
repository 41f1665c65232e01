#!/usr/bin/env bash
# Installs what tessera needs to build and test on Debian 12 / Ubuntu 24.04 (as root, or with sudo).
# nvcc is optional: when the CUDA toolkit is on PATH the CUDA sources are compiled too.
set -euo pipefail
pkgs=(build-essential cmake ninja-build libcli11-dev libgtest-dev libopenblas-dev nlohmann-json3-dev python3 python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
# A mirror hiccup should not fail a whole CI run: try each step up to three times.
for attempt in 1 2 3; do
  $SUDO apt-get update -qq && break
  [ "$attempt" -eq 3 ] && exit 1
  sleep 10
done
for attempt in 1 2 3; do
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null && break
  [ "$attempt" -eq 3 ] && exit 1
  sleep 10
done
