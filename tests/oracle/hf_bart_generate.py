#!/usr/bin/env python3
"""Hugging Face BART generate() as the oracle of tessera's seq2seq engine (tests/infer/test_seq2seq_hf.cpp).

Loads the save_pretrained directory tessera wrote into BartForConditionalGeneration (fp32, eval, eager attention)
and, for each case of cases.json (sources, num_beams, length_penalty, early_stopping, max_new_tokens), runs
generate() on the padded batch with its attention mask: num_beams 1 is greedy search. Prints one JSON line a case:
{"sequences": [[ids]], "scores": [..]}: the generated ids with the decoder start token dropped and the padding after
EOS cut, and sequences_scores for a beam search. Every forced or suppressed token of BART's generation config is
off, so that the search is the plain one tessera runs. Exits 77 (skipped) where transformers is not installed,
unless TESSERA_REQUIRE_HF=1.
"""
import json
import os
import sys

try:
    import torch
    from transformers import BartForConditionalGeneration
except ImportError as e:
    if os.environ.get("TESSERA_REQUIRE_HF") == "1":
        print(f"FAIL: TESSERA_REQUIRE_HF=1 but {e} (with {sys.executable})")
        sys.exit(1)
    sys.exit(77)


def main(model_dir: str) -> None:
    with open(os.path.join(model_dir, "cases.json")) as f:
        cases = json.load(f)
    model = BartForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32,
                                                         attn_implementation="eager")
    model.eval()
    cfg = model.config
    for c in cases:
        src = c["sources"]
        Ts = max(len(s) for s in src)
        ids = torch.tensor([s + [cfg.pad_token_id] * (Ts - len(s)) for s in src])
        mask = torch.tensor([[1] * len(s) + [0] * (Ts - len(s)) for s in src])
        K = c["beams"]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, num_beams=K, do_sample=False,
                                 max_new_tokens=c["max_new_tokens"], min_length=0, no_repeat_ngram_size=0,
                                 forced_bos_token_id=None, forced_eos_token_id=None, length_penalty=c["length_penalty"],
                                 early_stopping=c["early_stopping"], decoder_start_token_id=cfg.decoder_start_token_id,
                                 eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, num_return_sequences=1,
                                 output_scores=True, return_dict_in_generate=True)
        seqs = []
        for row in out.sequences.tolist():
            row = row[1:]
            if cfg.eos_token_id in row:
                row = row[:row.index(cfg.eos_token_id) + 1]
            seqs.append(row)
        scores = out.sequences_scores.tolist() if K > 1 else []
        print(json.dumps({"sequences": seqs, "scores": scores}))


if __name__ == "__main__":
    main(sys.argv[1])
