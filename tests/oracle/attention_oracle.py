#!/usr/bin/env python3
"""Independent oracle for tessera's general attention (grouped KV heads, Tq != Tk, causal q_offset, key lengths):
PyTorch recomputes out, lse and the gradients of q, k and v from the inputs tessera wrote, in fp64, and checks
tessera's results to a relative error (norm of the difference over the norm of torch's) of 1e-10 per tensor: the
CPU reference's fp64 results. A case's json may set looser bounds for results computed in a 16-bit type on the GPU
(tests/cuda/test_attention_oracle_cuda.cpp): "tol" for out, "lse_tol" for lse, "grad_tol" for the gradients, whose
error is taken relative to max(norm(torch's), "grad_floor").

Two formulations, each written from the definition, not from tessera's code:
- explicit: softmax(Q Kᵀ / sqrt(Dh) + mask) V with K, V repeat_interleave'd over the heads of a group, autograd for
  the backward (torch 1.13 has no scaled_dot_product_attention);
- F.scaled_dot_product_attention with enable_gqa, where this torch has it (the rows with a visible key only: it
  returns NaN for a fully masked row).
A query row with no visible key: tessera's convention is out = 0, lse = +inf and zero gradients.

Usage: attention_oracle.py DIR, where DIR holds case_N.json and case_N_<name>.f64 (raw little-endian doubles).
Exit status 0: every case agrees; 1: a mismatch (printed); 77: torch is not importable.
"""
import glob
import inspect
import json
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("attention_oracle: torch is not importable", file=sys.stderr)
    sys.exit(77)

TOL = 1e-10


def load(d, stem, name, shape):
    with open(os.path.join(d, f"{stem}_{name}.f64"), "rb") as f:
        raw = bytearray(f.read())
    t = torch.frombuffer(raw, dtype=torch.float64) if raw else torch.empty(0, dtype=torch.float64)
    return t.reshape(shape).clone()


def visible(meta):
    """(B, 1, Tq, Tk) bool: key j visible to query i of sequence b."""
    B, Tq, Tk = meta["B"], meta["Tq"], meta["Tk"]
    i = torch.arange(Tq).view(Tq, 1)
    j = torch.arange(Tk).view(1, Tk)
    lens = torch.tensor(meta["lens"] if meta["lens"] else [Tk] * B).view(B, 1, 1)
    m = (j.view(1, 1, Tk) < lens).expand(B, Tq, Tk)
    if meta["causal"]:
        m = m & (j <= i + meta["q_offset"]).view(1, Tq, Tk)
    return m.view(B, 1, Tq, Tk)


def explicit(meta, q, k, v):
    """out (B, Tq, H, Dh), lse (B, H, Tq); q (B, Tq, H, Dh), k and v (B, Tk, Hkv, Dh)."""
    group = meta["H"] // meta["Hkv"]
    qh = q.transpose(1, 2)  # (B, H, Tq, Dh)
    kh = k.repeat_interleave(group, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(group, dim=2).transpose(1, 2)
    s = qh @ kh.transpose(-2, -1) / math.sqrt(meta["Dh"])
    mask = visible(meta)
    any_visible = mask.any(-1, keepdim=True)
    # A fully masked row's scores are replaced by zeros before the softmax and its probabilities by zeros after:
    # finite gradients, out = 0.
    s_masked = s.masked_fill(~mask, float("-inf"))
    p = torch.where(any_visible, s_masked, torch.zeros_like(s)).softmax(-1) * mask
    out = (p @ vh).transpose(1, 2)
    lse = torch.where(any_visible[..., 0], torch.logsumexp(torch.where(any_visible, s_masked, torch.zeros_like(s)), -1),
                      torch.full_like(s[..., 0], float("inf")))
    return out, lse


def sdpa(meta, q, k, v):
    mask = visible(meta)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         enable_gqa=True)
    return out.transpose(1, 2)


def sdpa_takes_gqa():
    """Whether this torch has scaled_dot_product_attention with enable_gqa (a builtin: asked by a call, since
    inspect.signature cannot read a builtin's parameters)."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    x = torch.zeros(1, 2, 1, 1, dtype=torch.float64)
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        return True
    except TypeError:
        return False


def rel(a, b, floor=0.0):
    return ((a - b).norm() / max(b.norm().item(), floor, 1e-30)).item()


def check_case(d, stem):
    with open(os.path.join(d, stem + ".json")) as f:
        meta = json.load(f)
    B, Tq, Tk, H, Hkv, Dh = (meta[x] for x in ("B", "Tq", "Tk", "H", "Hkv", "Dh"))
    qs, ks = (B, Tq, H, Dh), (B, Tk, Hkv, Dh)
    q, k, v = (load(d, stem, n, s).requires_grad_() for n, s in (("q", qs), ("k", ks), ("v", ks)))
    d_out = load(d, stem, "d_out", qs)
    got = {n: load(d, stem, n, s) for n, s in (("out", qs), ("lse", (B, H, Tq)), ("dq", qs), ("dk", ks), ("dv", ks))}
    failures = []
    tol, lse_tol = meta.get("tol", TOL), meta.get("lse_tol", TOL)
    grad_tol, floor = meta.get("grad_tol", TOL), meta.get("grad_floor", 0.0)

    out, lse = explicit(meta, q, k, v)
    out.backward(d_out)
    ref = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for name, r in ref.items():
        bound = tol if name == "out" else grad_tol
        e = rel(got[name], r, 0.0 if name == "out" else floor)
        if not e <= bound:
            failures.append(f"{meta['name']}: {name} relative error {e:.3g} > {bound} (explicit softmax)")
    inf_rows = torch.isinf(lse)
    if not torch.equal(torch.isinf(got["lse"]) & (got["lse"] > 0), inf_rows):
        failures.append(f"{meta['name']}: lse is +inf on other rows than those with no visible key")
    e = rel(got["lse"][~inf_rows], lse.detach()[~inf_rows])
    if not e <= lse_tol:
        failures.append(f"{meta['name']}: lse relative error {e:.3g} > {lse_tol}")

    has_sdpa = sdpa_takes_gqa()
    if has_sdpa:
        rows = visible(meta).any(-1)[:, 0, :]  # (B, Tq): rows with a visible key
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o2 = sdpa(meta, q2, k2, v2)
        e = rel(got["out"][rows], o2.detach()[rows])
        if not e <= tol:
            failures.append(f"{meta['name']}: out relative error {e:.3g} > {tol} (scaled_dot_product_attention)")
        (o2[rows] * d_out[rows]).sum().backward()
        if rows.all():
            for name, g in (("dq", q2.grad), ("dk", k2.grad), ("dv", v2.grad)):
                e = rel(got[name], g, floor)
                if not e <= grad_tol:
                    failures.append(f"{meta['name']}: {name} relative error {e:.3g} > {grad_tol} (sdpa)")
    return failures, has_sdpa


def main():
    d = sys.argv[1]
    stems = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(d, "case_*.json")))
    if not stems:
        print(f"attention_oracle: no cases in {d}", file=sys.stderr)
        return 1
    failures, sdpa_used = [], False
    for stem in stems:
        f, s = check_case(d, stem)
        failures += f
        sdpa_used |= s
    for f in failures:
        print("attention_oracle: " + f, file=sys.stderr)
    print(f"attention_oracle: {len(stems)} cases, torch {torch.__version__}, "
          f"{'explicit softmax and scaled_dot_product_attention' if sdpa_used else 'explicit softmax'}: "
          f"{'FAILED' if failures else 'agree'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
