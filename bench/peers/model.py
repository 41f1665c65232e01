#!/usr/bin/env python3
"""The PyTorch peer of `tessera bench model`: Hugging Face models, eager and torch.compile, timed as tessera times.

`tessera bench model --peer` runs this script after its own sizes, with the same sizes, batch, sequence length,
precision, regions and run counts, and sets its figures beside tessera's. Standalone:

  python3 bench/peers/model.py --sizes cs336-small,cs336-medium --batch 4 --seq 256 --precision bf16
  python3 bench/peers/model.py --sizes gpt2-124m --batch 16 --seq 1024 --modes compile

Models, built from a config (nothing is downloaded), the shapes of tessera's presets (src/tessera/models/config.cpp):
gpt2-124m and tiny as GPT2LMHeadModel (LayerNorm, GELU, learned positions, biases, tied embeddings, tessera's
dropout), the cs336 sizes as LlamaForCausalLM (RMSNorm, SwiGLU with intermediate_size = d_ff, RoPE theta 1e4, no
biases, untied embeddings, one KV head per head). use_cache is off (no KV cache in training). Each record carries
the model's parameter count, which tessera compares with its own.

Training as a typical PyTorch script does it: f32 parameters, torch.autocast(bfloat16) around the forward for
--precision bf16 (nothing for f32), the loss F.cross_entropy over the logits of every position against random
targets (B x T tokens, as tessera's), loss.backward(), clip_grad_norm_(1.0) and torch.optim.AdamW(fused=True on a
GPU; lr 1e-5, betas (0.9, 0.95), eps 1e-8, weight decay 0.1: tessera's AdamW defaults), zero_grad(set_to_none=True).
Modes: eager, and compile (torch.compile(model), default inductor; the optimizer step stays eager). The model is in
train() mode, so dropout runs where the preset has it, as in tessera's bench.

Regions, each run between two torch.cuda.synchronize() calls on the host's clock (time.perf_counter) after the
warm-up runs, as tessera and the CS336 assignment time them: fwd = forward + loss (autograd recording, as in
training); fwd-bwd = zero_grad + forward + loss + backward; step = fwd-bwd + clipping + AdamW. compile mode runs at
least 2 warm-up runs per region, since the first compiles (compile_s: the first runs' seconds, added). Each figure is the
median of the timed runs, with their standard deviation.

Memory (GPU): torch.cuda.max_memory_allocated above what was allocated before the model was built: fwd_mem over the
fwd region, train_mem over the fwd-bwd and step regions (weights, gradients, AdamW state, activations, the f32
logits); train_reserved_gib is the caching allocator's peak reserve (max_memory_reserved). On the CPU memory is
not measured (null).

One JSON object per line per (size, mode):
  {"size", "mode", "params", "fwd_ms", "fwd_std_ms", "fwd_bwd_ms", "fwd_bwd_std_ms", "step_ms", "step_std_ms",
   "fwd_mem_gib", "train_mem_gib", "train_reserved_gib", "tokens_per_s", "compile_s", "warmup", "steps", "batch",
   "seq", "precision", "device", "attn", "torch", "transformers"}
(null for a region not asked for); a size that runs out of memory: {"size", "mode", "oom": true, "error": ...} and
the sweep goes on; any other failure of one size: {"size", "mode", "error": "<type>: <message>"} and the sweep
goes on. Without torch, transformers, or (for --device cuda) a GPU it exits with one line "peer: <reason>".
"""
import argparse
import gc
import json
import re
import statistics
import sys
import time

# The presets of src/tessera/models/config.cpp that the peer can build: family, vocab, d_model, d_ff, layers,
# heads, max_seq, dropout. tessera compares the parameter count of each record with its own, so a drift shows.
PRESETS = {
    "tiny": ("gpt2", 256, 128, 512, 4, 4, 64, 0.0),
    "gpt2-124m": ("gpt2", 50257, 768, 3072, 12, 12, 1024, 0.1),
    "cs336-small": ("llama", 10000, 768, 3072, 12, 12, 1024, 0.0),
    "cs336-medium": ("llama", 10000, 1024, 4096, 24, 16, 1024, 0.0),
    "cs336-large": ("llama", 10000, 1280, 5120, 36, 20, 1024, 0.0),
    "cs336-xl": ("llama", 10000, 1600, 6400, 48, 25, 1024, 0.0),
    "cs336-2.7b": ("llama", 10000, 2560, 10240, 32, 32, 1024, 0.0),
}
REGIONS = ("fwd", "fwd-bwd", "step")
MODES = ("eager", "compile")
GIB = float(1 << 30)


def build_model(name, transformers):
    """The Hugging Face model of preset `name`, f32 weights on the CPU (the caller moves it)."""
    family, vocab, d_model, d_ff, layers, heads, max_seq, dropout = PRESETS[name]
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=max_seq, n_embd=d_model, n_layer=layers,
                                      n_head=heads, n_inner=d_ff, resid_pdrop=dropout, embd_pdrop=dropout,
                                      attn_pdrop=dropout, layer_norm_epsilon=1e-5, use_cache=False)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=d_model, intermediate_size=d_ff,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                                   max_position_embeddings=max_seq, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   tie_word_embeddings=False, attention_bias=False, use_cache=False)
    return transformers.LlamaForCausalLM(cfg)


def is_oom(e, torch):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def bench_one(name, mode, args, torch, transformers):
    """Times one size in one mode; returns its record."""
    import torch.nn.functional as F

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    baseline = torch.cuda.memory_allocated() if cuda else 0
    torch.manual_seed(1337)
    model = build_model(name, transformers).to(dev)
    model.train()
    params = sum(p.numel() for p in model.parameters())  # a tied matrix counts once
    if mode == "compile" and not hasattr(torch, "compile"):
        raise RuntimeError(f"torch.compile needs torch >= 2.0 (this is {torch.__version__})")
    run = torch.compile(model) if mode == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    vocab = PRESETS[name][1]
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randint(0, vocab, (args.batch, args.seq), device=dev, generator=g)
    y = torch.randint(0, vocab, (args.batch, args.seq), device=dev, generator=g)
    bf16 = args.precision == "bf16"

    def forward():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = run(input_ids=x).logits
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def fwd():
        forward()  # the graph and the activations go when the loss does

    def fwd_bwd():
        opt.zero_grad(set_to_none=True)
        forward().backward()

    def step():
        fwd_bwd()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    warmup = max(args.warmup, 2) if mode == "compile" else args.warmup
    compile_s = None

    def time_region(fn):
        nonlocal compile_s
        for i in range(warmup):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if i == 0 and mode == "compile":  # the first run of a region compiles what it runs first
                compile_s = (compile_s or 0.0) + time.perf_counter() - t0
        ms = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ms.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ms), statistics.stdev(ms) if len(ms) > 1 else 0.0

    rec = {"size": name, "mode": mode, "params": params}
    for key in ("fwd", "fwd_bwd", "step"):
        rec[key + "_ms"] = rec[key + "_std_ms"] = None
    rec.update(fwd_mem_gib=None, train_mem_gib=None, train_reserved_gib=None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if "fwd" in args.regions:
        rec["fwd_ms"], rec["fwd_std_ms"] = time_region(fwd)
        if cuda:
            rec["fwd_mem_gib"] = (torch.cuda.max_memory_allocated() - baseline) / GIB
            torch.cuda.reset_peak_memory_stats()
    for key, fn in (("fwd-bwd", fwd_bwd), ("step", step)):
        if key in args.regions:
            rec[key.replace("-", "_") + "_ms"], rec[key.replace("-", "_") + "_std_ms"] = time_region(fn)
    if cuda and ("fwd-bwd" in args.regions or "step" in args.regions):
        rec["train_mem_gib"] = (torch.cuda.max_memory_allocated() - baseline) / GIB
        rec["train_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    rate = next((rec[k] for k in ("step_ms", "fwd_bwd_ms", "fwd_ms") if rec[k] is not None), None)
    rec["tokens_per_s"] = args.batch * args.seq / (rate * 1e-3) if rate else None
    rec["compile_s"] = compile_s
    rec["attn"] = getattr(model.config, "_attn_implementation", None)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="cs336-small,cs336-medium,cs336-large,cs336-xl,cs336-2.7b",
                    help="comma list of tessera presets: " + ", ".join(PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--precision", choices=["f32", "bf16"], default="bf16")
    ap.add_argument("--modes", default="eager,compile", help="comma list of eager, compile")
    ap.add_argument("--regions", default="fwd,fwd-bwd,step", help="comma list of fwd, fwd-bwd, step")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N (tessera's device) or cpu")
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    for what, got, known in (("size", sizes, PRESETS), ("mode", modes, MODES), ("region", args.regions, REGIONS)):
        bad = [v for v in got if v not in known]
        if bad or not got:
            sys.exit(f"peer: unknown {what} '{','.join(bad)}' (known: {', '.join(known)})")
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", args.device):
        sys.exit(f"peer: --device must be cpu, cuda or cuda:N, got '{args.device}'")
    if args.batch < 1 or args.seq < 1 or args.steps < 1 or args.warmup < 0:
        sys.exit("peer: --batch, --seq and --steps must be >= 1 and --warmup >= 0")
    too_long = [s for s in sizes if args.seq > PRESETS[s][6]]
    if too_long:
        sys.exit(f"peer: --seq {args.seq} exceeds max_seq of {','.join(too_long)}")

    try:
        import torch
    except ImportError as e:
        sys.exit(f"peer: torch is not importable ({e})")
    try:
        import transformers
    except ImportError as e:
        sys.exit(f"peer: transformers is not importable ({e})")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("peer: no GPU visible to torch")
    if ":" in args.device:
        torch.cuda.set_device(torch.device(args.device))  # the allocator's statistics are the current device's
    if args.precision == "bf16" and not cuda:
        sys.exit("peer: bf16 is timed on a GPU only (tessera's CPU bench is f32)")
    common = {"warmup": args.warmup, "steps": args.steps, "batch": args.batch, "seq": args.seq,
              "precision": args.precision,
              "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__}
    # f32 stays exact (torch's default, TF32 off for matmuls), as tessera's f32 model computes its GEMMs.

    for name in sizes:
        for mode in modes:
            try:
                rec = bench_one(name, mode, args, torch, transformers)
            except Exception as e:  # noqa: BLE001 — one size failing must not end the sweep
                msg = str(e).strip().splitlines()
                rec = {"size": name, "mode": mode, "error": type(e).__name__ + ": " + (msg[0] if msg else "")}
                if is_oom(e, torch):
                    rec["oom"] = True
            if mode == "compile":
                rec.setdefault("warmup", max(args.warmup, 2))
                if hasattr(torch, "_dynamo"):
                    torch._dynamo.reset()  # the next size compiles afresh, under no recompile limit
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            print(json.dumps({**common, **rec}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
