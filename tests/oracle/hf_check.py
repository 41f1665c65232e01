#!/usr/bin/env python3
"""Loads tessera's exported tiny GPT-2 and Llama checkpoints with Hugging Face `transformers`
(AutoModelForCausalLM.from_pretrained on the checkpoint directory, as a user would) and checks that the logits
equal tessera's (relative error <= 1e-5 in fp32). Exits 77 (skipped) where transformers is not installed,
as on Debian, whose archive has no python3-transformers (scripts/install_deps.sh puts it in .venv/), unless
TESSERA_REQUIRE_HF=1 (as in CI), where a missing transformers is a failure.
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from torch_oracle import load_safetensors, rel_err  # noqa: E402

try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    if os.environ.get("TESSERA_REQUIRE_HF") == "1":
        print(f"FAIL: TESSERA_REQUIRE_HF=1 but {e} (with {sys.executable}; run scripts/install_deps.sh)")
        sys.exit(1)
    print(f"skipped: {e}")
    sys.exit(77)

TOL = 1e-5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="the tessera_oracle_dump binary")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    subprocess.run([a.dump, a.workdir], check=True)
    failed = False
    for kind in ("gpt2", "llama"):
        d = os.path.join(a.workdir, kind)
        model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "init"), torch_dtype=torch.float32)
        model.eval()
        batch, _ = load_safetensors(os.path.join(d, "batch.safetensors"))
        with torch.no_grad():
            logits = model(batch["tokens"].long()).logits
        err = rel_err(batch["logits"], logits)
        ok = err <= TOL
        failed |= not ok
        print(f"{'ok' if ok else 'FAIL'} {kind}: {type(model).__name__} logits rel err {err:.2e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
