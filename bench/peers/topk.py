#!/usr/bin/env python3
"""PyTorch peer of `tessera bench topk`: the beam step's top-k as Hugging Face runs it.

`tessera bench topk --peer` runs this script after its own rows and prints its figures beside tessera's. It prints
one JSON object per line, {"kernel": NAME, "ms": MEDIAN}, with the row names tessera uses, and exits 0 with a
one-line message (and no figures) when torch or CUDA is missing. It never runs in CI (no GPU there).

Rows, for logits of shape (B*K, V) and running scores (B*K):
  "topk"       torch.topk(scores.view(B, K*V), k): the top-k alone, over keys already formed (the issue's peer);
  "beam step"  HF's step: log_softmax(logits.float()) + beam_scores[:, None], viewed (B, K*V), torch.topk(k) --
               what tessera's fused op computes.
Timing: warm-up runs, then timed runs between torch.cuda.Event pairs, the median reported; a 128 MiB buffer is read
before each timed run to flush the L2 cache, as tessera's harness does.
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("CUDA is not available to torch")
        return 0
    dev = "cuda"
    B, K, V, k = args.batch, args.beams, args.vocab, args.k
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(20261206)
    logits = (torch.randn(B * K, V, generator=gen, device=dev) * 3).to(dt)
    beam_scores = torch.randn(B * K, generator=gen, device=dev)
    keys = (torch.log_softmax(logits.float(), dim=-1) + beam_scores[:, None]).view(B, K * V)
    flush = torch.zeros(32 << 20, dtype=torch.float32, device=dev)

    def bench(name, fn):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for _ in range(args.iters):
            flush.sum()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop))
        print(json.dumps({"kernel": name, "ms": statistics.median(ms)}), flush=True)

    bench("topk", lambda: torch.topk(keys, k, dim=1, largest=True, sorted=True))

    def hf_step():
        s = torch.log_softmax(logits.float(), dim=-1) + beam_scores[:, None]
        return torch.topk(s.view(B, K * V), k, dim=1, largest=True, sorted=True)

    bench("beam step", hf_step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
