#!/usr/bin/env python3
"""The PyTorch peers of `tessera bench decode`: Hugging Face `generate`, `torch.topk` and a copy yardstick.

`tessera bench decode --peer` runs this script after its own rows and sets its figures beside tessera's.
Standalone:

  python3 bench/peers/decode.py --size full
  python3 bench/peers/decode.py --size small --device cpu

Models are built from a config with random weights (nothing is downloaded), in the shapes of tessera's presets
(src/tessera/models/config.cpp): gpt2-124m as GPT2LMHeadModel, the cs336 sizes as LlamaForCausalLM. They run in
--precision (bf16 by default) as model.to(dtype), eval(), under torch.inference_mode().

Rows, one JSON object per line:
- {"what": "copy", "gbps"}: a device-to-device copy of 2 GiB (1 GiB on --size small), bytes read + written per
  second, the median of 10: the bandwidth floor tessera divides weight bytes by.
- {"what": "generate", "model", "mode", "batch", "beams", "new_tokens", "prompt", "ms_per_token", "total_ms"}:
  `generate` with greedy decoding (do_sample=False), min_new_tokens = max_new_tokens = new_tokens (so no EOS ends
  it early), a random prompt of `prompt` tokens per sequence; ms_per_token = the wall time of the whole call
  (prefill included) / new_tokens, the median of --iters calls after warm-up calls. Modes: "eager" (the default
  dynamic cache) and "static" (cache_implementation="static": transformers compiles the decode step with CUDA
  graphs; its first calls compile, so it gets 2 extra warm-up calls). Beams: num_beams=4, early_stopping=False.
- {"what": "prefill", "model", "tokens", "ms"}: one forward over a (1, tokens) prompt with use_cache=True (the
  prefill of generate), the median of --iters.
- {"what": "topk", "rows", "cols", "k", "us"}: torch.topk over a (rows, cols) bf16 tensor (cols = beams x vocab,
  as a beam step ranks them), the median of 50 between CUDA events.
- {"what": "first token", "model", "s"}: `from_pretrained` of a directory that `save_pretrained` wrote (once,
  untimed) plus one generated token, on a fresh model object: what a user waits for. The page cache is warm.
Without torch, transformers or (for --device cuda) a GPU it exits 0 with one line "peer: <reason>".
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def gpt2_config(transformers, size):
    if size == "gpt2-124m":
        return transformers.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    if size == "tiny":
        return transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=128, n_layer=2, n_head=4)
    return None


def llama_config(transformers, size):
    shapes = {"cs336-small": (768, 3072, 12, 12), "cs336-2.7b": (2560, 10240, 32, 32)}
    if size not in shapes:
        return None
    d, ff, layers, heads = shapes[size]
    return transformers.LlamaConfig(vocab_size=10000, hidden_size=d, intermediate_size=ff, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=heads,
                                    max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=False)


def build(transformers, size, dtype, device):
    cfg = gpt2_config(transformers, size)
    cls = transformers.GPT2LMHeadModel
    if cfg is None:
        cfg = llama_config(transformers, size)
        cls = transformers.LlamaForCausalLM
    if cfg is None:
        raise ValueError(f"unknown size {size}")
    model = cls(cfg).to(device=device, dtype=dtype).eval()
    return model, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["small", "full"], default="full")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--precision", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--models", default="", help="comma list (default: gpt2-124m; tiny on --size small)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per sequence")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="eager,static")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--prefill", type=int, default=1024, help="prefill row's tokens (0: none)")
    ap.add_argument("--no-topk", action="store_true")
    ap.add_argument("--no-first-token", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"peer: torch or transformers is not installed ({e})")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("peer: no CUDA device")
        return 0
    transformers.logging.set_verbosity_error()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.precision]
    dev = torch.device(args.device)
    small = args.size == "small"
    models = [m for m in (args.models or ("tiny" if small else "gpt2-124m")).split(",") if m]
    new_tokens = min(args.new_tokens, 16) if small else args.new_tokens
    common = {"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
              "precision": args.precision}

    def emit(rec):
        print(json.dumps({**common, **rec}), flush=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def wall_ms(fn, warmup, iters):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    if dev.type == "cuda":
        n = (1 if small else 2) << 30
        src = torch.empty(n, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        ms = wall_ms(lambda: dst.copy_(src), 2, 10)
        emit({"what": "copy", "bytes": n, "gbps": 2 * n / (ms * 1e-3) / 1e9})
        del src, dst
        if not args.no_topk:
            rows, k = 32, 8
            cols = 4 * (256 if small else 50257)
            x = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for i in range(60):
                start.record()
                torch.topk(x, k, dim=-1)
                end.record()
                end.synchronize()
                if i >= 10:
                    times.append(start.elapsed_time(end) * 1e3)
            emit({"what": "topk", "rows": rows, "cols": cols, "k": k, "us": statistics.median(times)})

    gen = torch.Generator(device="cpu").manual_seed(0)
    for size in models:
        try:
            torch.manual_seed(0)
            model, cfg = build(transformers, size, dtype, dev)
        except Exception as e:  # one size failing leaves the others
            emit({"what": "generate", "model": size, "error": f"{type(e).__name__}: {e}"})
            continue
        vocab = cfg.vocab_size
        with torch.inference_mode():
            for mode in [m for m in args.modes.split(",") if m]:
                if mode == "static" and dev.type != "cuda":
                    continue
                for batch, beams in [(int(b), 1) for b in args.batches.split(",") if b] + [(1, 4)]:
                    prompt = torch.randint(0, vocab, (batch, args.prompt), generator=gen).to(dev)
                    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              num_beams=beams, pad_token_id=0)
                    if beams > 1:
                        kw["early_stopping"] = False
                    if mode == "static":
                        kw["cache_implementation"] = "static"
                    try:
                        ms = wall_ms(lambda: model.generate(prompt, **kw), 3 if mode == "static" else 1,
                                     args.iters)
                    except Exception as e:
                        emit({"what": "generate", "model": size, "mode": mode, "batch": batch, "beams": beams,
                              "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
                        continue
                    emit({"what": "generate", "model": size, "mode": mode, "batch": batch, "beams": beams,
                          "new_tokens": new_tokens, "prompt": args.prompt, "ms_per_token": ms / new_tokens,
                          "total_ms": ms})
            if args.prefill > 0:
                tokens = min(args.prefill, getattr(cfg, "n_positions", None) or cfg.max_position_embeddings)
                ids = torch.randint(0, vocab, (1, tokens), generator=gen).to(dev)
                ms = wall_ms(lambda: model(ids, use_cache=True), 2, max(args.iters, 5))
                emit({"what": "prefill", "model": size, "tokens": tokens, "ms": ms})
        if not args.no_first_token:
            with tempfile.TemporaryDirectory() as d:
                model.save_pretrained(d)
                del model
                sync()
                t = time.perf_counter()
                cls = transformers.AutoModelForCausalLM
                try:
                    m2 = cls.from_pretrained(d, dtype=dtype)
                except TypeError:
                    m2 = cls.from_pretrained(d, torch_dtype=dtype)
                m2 = m2.to(dev).eval()
                with torch.inference_mode():
                    m2.generate(torch.randint(0, vocab, (1, args.prompt), generator=gen).to(dev), max_new_tokens=1,
                                do_sample=False, pad_token_id=0)
                sync()
                emit({"what": "first token", "model": size, "s": time.perf_counter() - t})
                del m2
        else:
            del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
