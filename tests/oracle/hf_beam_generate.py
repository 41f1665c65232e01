#!/usr/bin/env python3
"""Hugging Face `generate(num_beams=K)` on a checkpoint that save_pretrained wrote (tests/oracle/hf_fixtures.py), the
oracle of tessera's beam search through its engine (tests/infer/test_beam_generate.cpp).

--spec FILE: a JSON list of cases, each {checkpoint (a directory), prompt (token ids), max_new_tokens, num_beams,
length_penalty, early_stopping (true or false), num_return_sequences, eos}. The model is loaded by from_pretrained
(once per directory) and runs in fp32 on the CPU with its KV cache. Each prompt runs alone (batch 1, no padding).
Prints one JSON object a case: {"sequences": [[generated tokens, through the first EOS]...], "scores": [...]},
num_return_sequences rows, best first (HF's sequences and sequences_scores). Exits 77 when torch or transformers is
missing.
"""
import argparse
import json
import sys


def run_case(model, c, torch):
    prompt = torch.tensor([c["prompt"]], dtype=torch.long)
    # The pad id only fills the rows after EOS, which are cut here; it must not be the EOS itself.
    pad = 1 if c["eos"] == 0 else 0
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=c["num_beams"],
                             max_new_tokens=c["max_new_tokens"], do_sample=False,
                             length_penalty=c["length_penalty"], early_stopping=c["early_stopping"],
                             num_return_sequences=c["num_return_sequences"], eos_token_id=c["eos"],
                             pad_token_id=pad, return_dict_in_generate=True, output_scores=True)
    seqs = []
    for row in out.sequences[:, prompt.shape[1]:].tolist():
        if c["eos"] in row:
            row = row[: row.index(c["eos"]) + 1]
        seqs.append(row)
    return {"sequences": seqs, "scores": out.sequences_scores.tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="a JSON list of cases (see run_case)")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    with open(args.spec) as f:
        cases = json.load(f)
    models = {}
    for c in cases:
        d = c["checkpoint"]
        if d not in models:
            models[d] = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        print(json.dumps(run_case(models[d], c, torch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
