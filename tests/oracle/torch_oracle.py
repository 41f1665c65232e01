#!/usr/bin/env python3
"""Independent oracle: PyTorch rebuilds tessera's tiny GPT-2-style and Llama-style models (one of them with
grouped-query attention) from the safetensors files that tessera wrote (Hugging Face names and layouts), and
checks tessera's logits, loss, every parameter gradient and the parameters after 3 AdamW steps. Relative error (||a - b|| / ||b|| per tensor) must be <= 1e-5
in fp32. The model code here is written from the Hugging Face definitions, not from tessera's.
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F

TOL = 1e-5
DTYPES = {"F32": torch.float32, "I32": torch.int32, "F16": torch.float16, "BF16": torch.bfloat16}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = bytearray(data[base + b:base + end])
        t = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta


def gpt2_forward(p, cfg, tokens):
    B, T = tokens.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg["layer_norm_epsilon"]
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["n_layer"]):
        pre = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
        qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]  # Conv1D: x W, W (in, out)
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
        u = F.gelu(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"], approximate="tanh")
        x = x + u @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    return x @ p["transformer.wte.weight"].T  # tied head


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(p, cfg, tokens):
    B, T = tokens.shape
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Dh = C // H
    Hkv = cfg.get("num_key_value_heads", H)  # grouped-query attention: each K/V head serves H / Hkv query heads
    eps = cfg["rms_norm_eps"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = p["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q, k, v = (F.linear(h, p[pre + f"self_attn.{n}_proj.weight"]).view(B, T, -1, Dh).transpose(1, 2)
                   for n in ("q", "k", "v"))
        k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = (q @ k.transpose(-2, -1)) / math.sqrt(Dh)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[pre + "self_attn.o_proj.weight"])
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        g = F.silu(F.linear(h, p[pre + "mlp.gate_proj.weight"])) * F.linear(h, p[pre + "mlp.up_proj.weight"])
        x = x + F.linear(g, p[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps)
    return F.linear(x, p["lm_head.weight"])


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def check(name, ours, ref, failures):
    err = rel_err(ours, ref)
    status = "ok" if err <= TOL else "FAIL"
    print(f"  {status:4} {name:48} rel err {err:.2e}")
    if err > TOL:
        failures.append(name)


def run_model(kind, d, failures):
    print(f"{kind}:")
    with open(os.path.join(d, "init", "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == kind.split("-")[0], f"expected a {kind} config.json, got {cfg['model_type']}"
    init, meta = load_safetensors(os.path.join(d, "init", "model.safetensors"))
    assert meta.get("format") == "pt"
    batch, bmeta = load_safetensors(os.path.join(d, "batch.safetensors"))
    grads, _ = load_safetensors(os.path.join(d, "grads", "model.safetensors"))
    after, _ = load_safetensors(os.path.join(d, "after3", "model.safetensors"))
    eps_ls = float(bmeta["label_smoothing"])
    lr, wd, clip = float(bmeta["lr"]), float(bmeta["weight_decay"]), float(bmeta["clip"])
    forward = gpt2_forward if kind == "gpt2" else llama_forward
    if kind == "llama-gqa":
        assert cfg["num_key_value_heads"] < cfg["num_attention_heads"], "llama-gqa: no grouped KV heads"
    tokens, targets = batch["tokens"].long(), batch["targets"].long()

    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}

    def loss_fn():
        logits = forward(params, cfg, tokens)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1,
                               label_smoothing=eps_ls)
        return logits, loss

    logits, loss = loss_fn()
    check("logits", batch["logits"], logits.detach(), failures)
    check("loss", torch.tensor([float(bmeta["loss"])]), loss.detach().view(1), failures)
    loss.backward()
    assert set(grads) == set(params), f"gradient names differ: {set(grads) ^ set(params)}"
    for k in sorted(params):
        check("grad " + k, grads[k], params[k].grad, failures)

    # 3 AdamW steps: decay on matrices and embeddings, none on biases and norm gains.
    for p in params.values():
        p.grad = None
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(3):
        opt.zero_grad()
        _, loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
    for k in sorted(params):
        ours, ref = after[k], params[k].detach()
        if k.endswith("attn.c_attn.bias"):
            # The key bias has an exactly zero gradient (it shifts every score of a row by the same amount),
            # so both sides hold rounding noise there, and Adam's g / (|g| + eps) turns noise into steps of up
            # to lr. Check the q and v parts to the tolerance and the k part to lr.
            C = cfg["n_embd"]
            check("after 3 AdamW steps " + k + " [q, v]", torch.cat([ours[:C], ours[2 * C:]]),
                  torch.cat([ref[:C], ref[2 * C:]]), failures)
            gk = grads[k][C:2 * C].double().norm().item() / grads[k].double().norm().item()
            dk = (ours[C:2 * C] - ref[C:2 * C]).abs().max().item()
            ok = gk < 1e-5 and dk <= 3 * lr
            print(f"  {'ok' if ok else 'FAIL':4} {k + ' [k]':48} grad share {gk:.1e}, max diff {dk:.1e} <= 3 lr")
            if not ok:
                failures.append(k + " [k]")
            continue
        check("after 3 AdamW steps " + k, ours, ref, failures)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="the tessera_oracle_dump binary")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    subprocess.run([a.dump, a.workdir], check=True)
    failures = []
    for kind in ("gpt2", "llama", "llama-gqa"):
        run_model(kind, os.path.join(a.workdir, kind), failures)
    if failures:
        print(f"{len(failures)} checks above the tolerance {TOL}: {failures}")
        sys.exit(1)
    print(f"all checks within {TOL}")


if __name__ == "__main__":
    main()
