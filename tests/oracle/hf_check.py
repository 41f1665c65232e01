#!/usr/bin/env python3
"""Loads tessera's exported tiny GPT-2 and Llama checkpoints with Hugging Face `transformers`
(AutoModelForCausalLM.from_pretrained on the checkpoint directory, as a user would) and checks that the logits
equal tessera's (relative error <= 1e-5 in fp32). For the grouped-query Llama (llama-gqa-small's shape, which
writes num_key_value_heads), the greedy continuation of a prompt by `model.generate` must also be the one
`tessera generate --greedy` prints. Exits 77 (skipped) where transformers is not installed,
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
    ap.add_argument("--tessera", required=True, help="the tessera binary")
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    subprocess.run([a.dump, a.workdir], check=True)
    failed = False
    for kind in ("gpt2", "llama", "llama-gqa"):
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
    failed |= not greedy_matches(a.tessera, os.path.join(a.workdir, "llama-gqa", "init"))
    sys.exit(1 if failed else 0)


def greedy_matches(tessera, ckpt, prompt=b"\x05\x1f\x02\x11", n=8):
    """transformers' greedy continuation of the prompt equals tessera generate --greedy's output. generate reads
    and prints byte-level text; the prompt's bytes lie below the model's vocab of 37, and prompt and continuation
    fit its max_seq of 12 (the context tessera generates within)."""
    model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32)
    model.eval()
    kv, heads = model.config.num_key_value_heads, model.config.num_attention_heads
    with torch.no_grad():
        ids = model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    want = bytes(ids[0].tolist())
    out = subprocess.run([tessera, "generate", "--checkpoint", ckpt, "--prompt", prompt.decode(), "--tokens", str(n),
                          "--greedy"], check=True, capture_output=True).stdout
    ok = kv < heads and out.startswith(want)
    print(f"{'ok' if ok else 'FAIL'} llama-gqa: {kv} of {heads} heads for keys and values; greedy continuation "
          f"transformers {want!r}, tessera {out!r}")
    return ok


if __name__ == "__main__":
    main()
