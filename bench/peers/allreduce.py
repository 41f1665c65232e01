#!/usr/bin/env python3
"""The torch.distributed peer of `tessera bench allreduce` and of tessera's data-parallel training.

Run one process a GPU with torchrun, on the machine where tessera's figures are taken:

  torchrun --standalone --nproc_per_node 2 bench/peers/allreduce.py --which allreduce --sizes 1MB,10MB,100MB,1GB
  torchrun --standalone --nproc_per_node 2 bench/peers/allreduce.py --which gpt2 --mode ddp
  torchrun --standalone --nproc_per_node 2 bench/peers/allreduce.py --which gpt2 --mode zero
  torchrun --standalone --nproc_per_node 1 bench/peers/allreduce.py --which gpt2 --mode single

`tessera bench allreduce --peer` runs the first itself. Rank 0 prints one JSON object a line:

  allreduce: {"bytes", "dtype", "world", "median_ms", "mean_ms", "algbw", "busbw"} per size. Each timed run is
    a barrier, then dist.all_reduce (sum) between two CUDA events on the current stream (the NCCL stream waits
    for it and it waits for the NCCL stream, so the events span the collective); a run's time is its slowest
    rank's; algbw = bytes / time and busbw = algbw * 2(n-1)/n, GB/s of 1e9 bytes: the definitions that tessera's
    table uses.
  gpt2: {"mode", "world", "batch", "seq", "median_ms", "mean_ms", "tokens_per_s", "peak_gib", "optimizer_gib"}:
    Hugging Face GPT2LMHeadModel (gpt2-124m's config), B x T tokens per GPU, bf16 autocast with f32 weights, AdamW;
    single: one GPU; ddp: DistributedDataParallel with 25 MB buckets; zero: DDP plus ZeroRedundancyOptimizer
    (AdamW state sharded over the ranks, ZeRO-1). optimizer_gib is the AdamW state (exp_avg, exp_avg_sq) this rank
    holds.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time


def parse_size(item):
    """1MB -> 10**6 bytes (KB/MB/GB powers of 1000, KiB/MiB/GiB of 1024, a bare number is bytes), as tessera parses."""
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(B|KB|MB|GB|KiB|MiB|GiB)?", item.strip())
    if not m:
        raise SystemExit(f"--sizes: '{item}' is not a size (like 1MB, 10MB, 1GB)")
    units = {None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    return int(round(float(m.group(1)) * units[m.group(2)]))


def slowest(ms, dist, torch):
    """The largest of every rank's time for each run (an all-reduce ends with its last rank)."""
    t = torch.tensor(ms, dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def bench_allreduce(args, dist, torch):
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    esize = torch.tensor([], dtype=dtype).element_size()
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        x = torch.zeros(size // esize, dtype=dtype, device="cuda")
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for it in range(args.warmup + args.iters):
            dist.barrier()
            start.record()
            dist.all_reduce(x)
            stop.record()
            stop.synchronize()
            if it >= args.warmup:
                ms.append(start.elapsed_time(stop))
        ms = slowest(ms, dist, torch)
        med = statistics.median(ms)
        algbw = size / (med * 1e-3) / 1e9
        if rank == 0:
            print(json.dumps({"bytes": size, "dtype": args.dtype, "world": world, "median_ms": med,
                              "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
                              "mean_ms": statistics.fmean(ms), "algbw": algbw,
                              "busbw": algbw * 2 * (world - 1) / world}), flush=True)
        del x
        torch.cuda.empty_cache()


def bench_gpt2(args, dist, torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    torch.manual_seed(1337)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    if args.mode in ("ddp", "zero"):
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()],
                                                          bucket_cap_mb=25)
    if args.mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-4,
                                      weight_decay=0.1, betas=(0.9, 0.95))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    x = torch.randint(0, 50257, (args.batch, args.seq + 1), device="cuda", generator=g)
    inputs, labels = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    ms = []
    for it in range(args.warmup + args.iters):
        torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if it >= args.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    if world > 1:
        ms = slowest(ms, dist, torch)
    state = opt.optim.state if args.mode == "zero" else opt.state
    opt_bytes = sum(t.numel() * t.element_size() for s in state.values() for k, t in s.items()
                    if k in ("exp_avg", "exp_avg_sq"))
    med = statistics.median(ms)
    if rank == 0:
        print(json.dumps({"mode": args.mode, "world": world, "batch": args.batch, "seq": args.seq, "median_ms": med,
                          "mean_ms": statistics.fmean(ms), "tokens_per_s": args.batch * args.seq * world / (med * 1e-3),
                          "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "optimizer_gib": opt_bytes / 2**30}),
              flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--which", choices=["allreduce", "gpt2"], default="allreduce")
    p.add_argument("--sizes", default="1MB,10MB,100MB,1GB")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--mode", choices=["single", "ddp", "zero"], default="ddp")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        sys.exit(f"peer: torch is not importable ({e})")
    if not torch.cuda.is_available():
        sys.exit("peer: no GPU visible (the torch.distributed peer runs NCCL on GPUs)")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if "RANK" in os.environ:
        try:  # device_id binds the communicator to this GPU at once (torch >= 2.3)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        except TypeError:
            dist.init_process_group("nccl")
    elif args.which == "allreduce" or args.mode != "single":
        sys.exit("peer: start me with torchrun --nproc_per_node N (see the top of this file)")
    try:
        (bench_allreduce if args.which == "allreduce" else bench_gpt2)(args, dist, torch)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
