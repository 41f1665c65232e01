#!/usr/bin/env python3
"""Hugging Face `generate(num_beams=K)` as the oracle of tessera's beam search, on a toy model.

--spec names a JSON list of cases, each {batch, steps, vocab, beams, eos, pad, length_penalty, early_stopping
("true", "false" or "never"), num_return_sequences, prompt (two tokens per entry), table}. The toy model is a
GPT2LMHeadModel whose forward is replaced: the next-token logits of a row are a fixed table indexed by (batch
entry, step, last token, the token before it), read from `table` (f32, little-endian: `a` of shape (B, N, V, V),
then `b2` of (V, V); logits = a[b][t][last] + 0.5 * b2[before]), the same function that
tests/infer/test_beam_search_hf.cpp feeds tessera's BeamSearch. No cache: every step sees the whole sequence.
Prints one JSON object a case: {"sequences": [[generated tokens, through EOS]...], "scores": [...]}, B * R rows in
HF's order (entry-major, best first). Exits 77 when torch or transformers is missing.
"""
import argparse
import json
import sys


def run_case(c, torch, transformers, np, Output):
    B, N, V, K = c["batch"], c["steps"], c["vocab"], c["beams"]
    raw = np.fromfile(c["table"], dtype="<f4")
    a = torch.from_numpy(raw[: B * N * V * V].reshape(B, N, V, V).copy())
    b2 = torch.from_numpy(raw[B * N * V * V:].reshape(V, V).copy())
    prompt = torch.tensor(c["prompt"], dtype=torch.long).view(B, 2)

    class Toy(transformers.GPT2LMHeadModel):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            rows, L = input_ids.shape
            t = L - 2
            z = torch.zeros(rows, L, V)
            for r in range(rows):
                z[r, -1] = a[r // K, t, input_ids[r, -1]] + 0.5 * b2[input_ids[r, -2]]
            return Output(logits=z)

    cfg = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=8, n_layer=1, n_head=1,
                                  bos_token_id=c["eos"], eos_token_id=c["eos"], pad_token_id=c["pad"])
    model = Toy(cfg).eval()
    es = {"true": True, "false": False, "never": "never"}[c["early_stopping"]]
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=K, max_new_tokens=N,
                             do_sample=False, length_penalty=c["length_penalty"], early_stopping=es,
                             num_return_sequences=c["num_return_sequences"], eos_token_id=c["eos"],
                             pad_token_id=c["pad"], use_cache=False, return_dict_in_generate=True,
                             output_scores=True)
    seqs = []
    for row in out.sequences[:, 2:].tolist():
        # HF pads after EOS: keep through the first EOS.
        if c["eos"] in row:
            row = row[: row.index(c["eos"]) + 1]
        seqs.append(row)
    return {"sequences": seqs, "scores": out.sequences_scores.tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="a JSON list of cases (see run_case)")
    args = ap.parse_args()
    try:
        import numpy as np
        import torch
        import transformers
        from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    transformers.logging.set_verbosity_error()
    with open(args.spec) as f:
        cases = json.load(f)
    for c in cases:
        print(json.dumps(run_case(c, torch, transformers, np, CausalLMOutputWithCrossAttentions)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
