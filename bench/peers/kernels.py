#!/usr/bin/env python3
"""PyTorch peers of `tessera bench kernels` and `tessera bench optimizer`.

`tessera bench ... --peer` runs this script after its own kernels and prints its figures beside tessera's. It
prints one JSON object per line, {"kernel": NAME, "ms": MEDIAN}, with the kernel names tessera uses, and exits 0
with a one-line message (and no figures) when torch or CUDA is missing. It never runs in CI (no GPU there).

`--only FAMILY,...` (tessera's `bench kernels --only`) runs only those families' rows: embedding, layernorm,
residual, gelu, swiglu, cross-entropy.

Timing: warm-up runs, then timed runs between torch.cuda.Event pairs, one run at a time, the median reported. As
in tessera's harness, a 128 MiB buffer is read before each timed run to flush the L2 cache (not timed; a read leaves no dirty lines).
Backward passes are timed alone: torch.autograd.grad on a graph built once, with retain_graph=True.

Shapes (the same as tessera's): full: N = B*T = 16 * 1024 = 16384 rows, C = 768, d_ff = 3072, V = 50257; small:
N = 4 * 16 = 64, C = 64, d_ff = 256, V = 512; large (kernels only): N = 64 * 1024 = 65536 rows, full's widths, and
no cross-entropy rows.

AdamW: torch.optim.AdamW(fused=True) over f32 parameters and f32 gradients (tessera's f32 master weights; torch
has no master-weight mode, and writes no 16-bit copy), betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the
matrices and embeddings and 0 on gains and biases (two parameter groups), no clipping. full: the 148 tensors of
GPT-2 124M (tied lm_head), 124,439,808 parameters, each its own tensor as in a torch model; small: one flat tensor
of the tiny preset's 834,304 parameters.
"""
import argparse
import json
import statistics
import sys


def gpt2_124m_shapes():
    """(shape, decay) of every GPT-2 124M parameter: 124,439,808 in all."""
    C, V, T, L = 768, 50257, 1024, 12
    shapes = [((V, C), True), ((T, C), True)]
    for _ in range(L):
        shapes += [((C,), False), ((C,), False),                  # ln_1
                   ((C, 3 * C), True), ((3 * C,), False),         # attn.c_attn
                   ((C, C), True), ((C,), False),                 # attn.c_proj
                   ((C,), False), ((C,), False),                  # ln_2
                   ((C, 4 * C), True), ((4 * C,), False),         # mlp.c_fc
                   ((4 * C, C), True), ((C,), False)]             # mlp.c_proj
    shapes += [((C,), False), ((C,), False)]                      # ln_f
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--which", choices=["kernels", "optimizer"], default="kernels")
    ap.add_argument("--size", choices=["small", "full", "large"], default="full")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", default="", help="comma list of kernel families to run (default: all)")
    args = ap.parse_args()
    families = ["embedding", "layernorm", "residual", "gelu", "swiglu", "cross-entropy"]
    only = [f for f in args.only.split(",") if f] or families
    for f in only:
        if f not in families:
            ap.error(f"--only: unknown kernel family '{f}' (expected {', '.join(families)})")
    # --only picks kernel families; the optimizer's one row is not one of them (filtered by them, it was never run,
    # and `bench optimizer --peer` said "printed no figures").
    want = lambda family: args.which == "optimizer" or family in only
    if args.which == "optimizer" and args.size == "large":
        ap.error("--size large applies to --which kernels only")

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("CUDA is not available to torch")
        return 0

    dev = "cuda"
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    flush = torch.zeros(32 << 20, dtype=torch.float32, device=dev)  # 128 MiB, read to flush L2
    gen = torch.Generator(device=dev).manual_seed(20261130)

    def rand(*shape, dtype=dt, requires_grad=False):
        t = torch.rand(*shape, generator=gen, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
        return t.requires_grad_(requires_grad)

    def bench(name, fn):
        if not want(name.split()[0]):  # the family: the name's first word
            return
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for i in range(args.iters):
            flush.sum()  # a read: leaves L2 clean (a write would leave dirty lines for the timed run)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop))
        print(json.dumps({"kernel": name, "ms": statistics.median(ms)}), flush=True)

    def grad_of(out, inputs, d_out):
        return lambda: torch.autograd.grad(out, inputs, d_out, retain_graph=True)

    if args.which == "optimizer":
        if args.size == "full":
            shapes = gpt2_124m_shapes()
        else:
            shapes = [((834304,), True)]
        params = [rand(*s, dtype=torch.float32, requires_grad=True) for s, _ in shapes]
        for p in params:
            p.grad = rand(*p.shape, dtype=torch.float32).mul_(1e-2)
        groups = [{"params": [p for p, (_, d) in zip(params, shapes) if d], "weight_decay": 0.1},
                  {"params": [p for p, (_, d) in zip(params, shapes) if not d], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        bench("adamw step", opt.step)
        return 0

    B, T, C, Fd, V = {"full": (16, 1024, 768, 3072, 50257), "large": (64, 1024, 768, 3072, 50257),
                      "small": (4, 16, 64, 256, 512)}[args.size]
    N = B * T

    # embedding: wte[tokens] + wpe[t]
    tokens = torch.randint(0, V, (B, T), generator=gen, device=dev)
    wte, wpe = rand(V, C, requires_grad=True), rand(T, C, requires_grad=True)
    emb = lambda: F.embedding(tokens, wte) + wpe
    bench("embedding fwd", emb)
    out = emb()
    bench("embedding bwd", grad_of(out, [wte, wpe], rand(B, T, C)))
    # Without a position table (rope or sinusoidal models): d_wte alone.
    bench("embedding bwd (no positions)", grad_of(F.embedding(tokens, wte), [wte], rand(B, T, C)))
    # Zipf ids (P(id k) ∝ 1/(k+1)), as text has them: tessera's "embedding bwd (zipf ids)" row.
    zipf = torch.multinomial(1.0 / torch.arange(1, V + 1, device=dev, dtype=torch.float64), N, replacement=True,
                             generator=gen).view(B, T)
    out_z = F.embedding(zipf, wte) + wpe
    bench("embedding bwd (zipf ids)", grad_of(out_z, [wte, wpe], rand(B, T, C)))

    # layernorm (N, C)
    x, w, b = rand(N, C, requires_grad=True), rand(C, requires_grad=True), rand(C, requires_grad=True)
    ln = lambda: F.layer_norm(x, (C,), w, b, 1e-5)
    bench("layernorm fwd", ln)
    out = ln()
    bench("layernorm bwd", grad_of(out, [x, w, b], rand(N, C)))

    # residual: residual + (x + bias)
    res, bias = rand(N, C, requires_grad=True), rand(C, requires_grad=True)
    resid = lambda: res + (x + bias)
    bench("residual fwd", resid)
    out = resid()
    bench("residual bwd", grad_of(out, [x, bias], rand(N, C)))

    # gelu (tanh) of in + bias, (N, d_ff)
    h, hb = rand(N, Fd, requires_grad=True), rand(Fd, requires_grad=True)
    gelu = lambda: F.gelu(h + hb, approximate="tanh")
    bench("gelu fwd", gelu)
    out = gelu()
    bench("gelu bwd", grad_of(out, [h, hb], rand(N, Fd)))

    # swiglu without bias, (N, 2 d_ff) rows [gate | up] -> (N, d_ff)
    del out, h
    h2 = rand(N, 2 * Fd, requires_grad=True)
    swiglu = lambda: F.silu(h2[:, :Fd]) * h2[:, Fd:]
    bench("swiglu fwd", swiglu)
    out = swiglu()
    bench("swiglu bwd", grad_of(out, [h2], rand(N, Fd)))

    # cross-entropy with label smoothing 0.1 on 16-bit logits, forward + backward (mean loss); not at large
    del out
    if args.size == "large" or not want("cross-entropy"):
        return 0
    logits = rand(N, V, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=gen, device=dev)

    def ce():
        loss = F.cross_entropy(logits, targets, label_smoothing=0.1)
        torch.autograd.grad(loss, [logits])

    bench("cross-entropy fwd+bwd", ce)
    # tessera's fused op does the same work (loss and gradient of the mean loss) in one kernel: torch's is the peer.
    bench("cross-entropy fused fwd+bwd", ce)
    return 0


if __name__ == "__main__":
    sys.exit(main())
