#!/usr/bin/env python3
"""PyTorch peers of `tessera bench attention`.

`tessera bench attention --peer` runs this script after its own rows and prints its figures beside tessera's. It
prints one JSON object per line and exits 0 with a one-line message (and no figures) when torch or CUDA is missing.
It never runs in CI (no GPU there).

Peers: "torch naive" (S = Q Kᵀ / sqrt(d), softmax, P V, as plain PyTorch code: S and P materialized in the
dtype; causal by masked_fill), "torch sdpa flash" and "torch sdpa cudnn" (F.scaled_dot_product_attention under
sdpa_kernel with only that backend allowed).

Table "memory" (the CS336 assignment's): one head, batch 8, no mask, d in {16, 32, 64, 128}, T in {256, 1024,
4096, 8192, 16384}: forward ms (autograd recording, as in training), backward ms (o.backward on a graph built
once, retain_graph=True), MiB allocated after the forward (torch.cuda.memory_allocated, inputs included) and
the peak during the backward (max_memory_allocated). Out of memory: {"oom": true} and the sweep goes on.
Table "flops": causal, B*T = 32768 tokens, width 2048, Dh in {64, 128} (or --head-dims), H = width // Dh, T in
{1024, 4096, 16384}, (B, H, T, Dh) tensors: forward ms (no_grad) and forward + backward ms; with --dropout P,
attention dropout P there (SDPA's dropout_p, F.dropout on the naive P), as `tessera bench attention --attn-dropout
P` runs it.

Timing: warm-up runs, then timed runs between torch.cuda.Event pairs, one run at a time, the median reported;
a 128 MiB buffer is read before each timed run to flush the L2 (not timed; a read leaves no dirty lines), as tessera's harness does.
small: the tiny sweeps of `tessera bench attention --size small`.
"""
import argparse
import json
import math
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["small", "full"], default="full")
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="bf16")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dropout", type=float, default=0.0, help="attention dropout in the flops table")
    ap.add_argument("--head-dims", default="", help="comma list: the flops table's head dims (default by size)")
    args = ap.parse_args()
    if not 0.0 <= args.dropout < 1.0:
        print(f"--dropout must be in [0, 1), got {args.dropout}")
        return 2

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"torch is not installed ({e})")
        return 0
    if not torch.cuda.is_available():
        print("CUDA is not available to torch")
        return 0

    dev = torch.device("cuda")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    flush = torch.zeros(32 << 20, dtype=torch.float32, device=dev)  # 128 MiB, read to flush L2

    def time_ms(fn):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        ms = []
        for _ in range(args.iters):
            flush.sum()  # a read: leaves L2 clean (a write would leave dirty lines for the timed run)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        return statistics.median(ms)

    def naive(q, k, v, causal, p=0.0):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            t = q.shape[-2]
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        a = torch.softmax(s, dim=-1)
        return (F.dropout(a, p) if p > 0 else a) @ v

    def sdpa(backend):
        def f(q, k, v, causal, p=0.0):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p)
        return f

    impls = [("torch naive", naive), ("torch sdpa flash", sdpa(SDPBackend.FLASH_ATTENTION)),
             ("torch sdpa cudnn", sdpa(SDPBackend.CUDNN_ATTENTION))]

    def emit(obj):
        print(json.dumps(obj), flush=True)

    def release():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    if args.size == "small":
        mem_batch, mem_d, mem_T = 2, [16, 32], [16, 64]
        tokens, width, f_Dh, f_T = 256, 128, [32, 64], [64, 128]
    else:
        mem_batch, mem_d, mem_T = 8, [16, 32, 64, 128], [256, 1024, 4096, 8192, 16384]
        tokens, width, f_Dh, f_T = 32768, 2048, [64, 128], [1024, 4096, 16384]
    if args.head_dims:
        f_Dh = [int(d) for d in args.head_dims.split(",")]

    for d in mem_d:
        for T in mem_T:
            for name, fn in impls:
                row = {"table": "memory", "impl": name, "d": d, "T": T}
                try:
                    release()
                    shape = (mem_batch, 1, T, d)  # one head; SDPA wants (B, H, T, d)
                    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
                    do = torch.randn(shape, device=dev, dtype=dtype)
                    row["fwd_ms"] = time_ms(lambda: fn(q, k, v, False))
                    o = fn(q, k, v, False)
                    torch.cuda.synchronize()
                    row["mib_before_bwd"] = torch.cuda.memory_allocated() / 2**20
                    torch.cuda.reset_peak_memory_stats()
                    o.backward(do, retain_graph=True)
                    torch.cuda.synchronize()
                    row["mib_during_bwd"] = torch.cuda.max_memory_allocated() / 2**20
                    row["bwd_ms"] = time_ms(lambda: o.backward(do, retain_graph=True))
                    del o, q, k, v, do
                except torch.cuda.OutOfMemoryError:
                    row = {"table": "memory", "impl": name, "d": d, "T": T, "oom": True}
                except RuntimeError as e:  # a backend that does not take this shape or dtype
                    row = {"table": "memory", "impl": name, "d": d, "T": T, "error": str(e).split("\n")[0][:200]}
                emit(row)

    for Dh in f_Dh:
        for T in f_T:
            B, H = tokens // T, width // Dh
            for name, fn in impls:
                row = {"table": "flops", "impl": name, "d": Dh, "T": T}
                try:
                    release()
                    q, k, v = (torch.randn(B, H, T, Dh, device=dev, dtype=dtype, requires_grad=True)
                               for _ in range(3))
                    do = torch.randn(B, H, T, Dh, device=dev, dtype=dtype)

                    def fwd():
                        with torch.no_grad():
                            fn(q, k, v, True, args.dropout)

                    def fwd_bwd():
                        q.grad = k.grad = v.grad = None
                        fn(q, k, v, True, args.dropout).backward(do)

                    row["fwd_ms"] = time_ms(fwd)
                    row["fwd_bwd_ms"] = time_ms(fwd_bwd)
                    del q, k, v, do
                except torch.cuda.OutOfMemoryError:
                    row = {"table": "flops", "impl": name, "d": Dh, "T": T, "oom": True}
                except RuntimeError as e:
                    row = {"table": "flops", "impl": name, "d": Dh, "T": T, "error": str(e).split("\n")[0][:200]}
                emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
