#!/usr/bin/env python3
"""Hugging Face BART as the oracle of tessera's EncoderDecoder (tests/train/test_bart_export.cpp).

Loads the save_pretrained directory tessera wrote into BartForConditionalGeneration (fp32, eval: dropout off,
eager attention), runs the batch of batch.json (sources with their attention mask, decoder inputs, targets with
-100 past each length and at pad), and writes out.json: the label-smoothed cross-entropy (torch's, ignore_index
-100), the logits of the rows inside the target lengths, and the gradient of every parameter by its BART name.
Exits 77 (skipped) where transformers is not installed, unless TESSERA_REQUIRE_HF=1.
"""
import json
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from transformers import BartForConditionalGeneration
except ImportError as e:
    if os.environ.get("TESSERA_REQUIRE_HF") == "1":
        print(f"FAIL: TESSERA_REQUIRE_HF=1 but {e} (with {sys.executable})")
        sys.exit(1)
    sys.exit(77)


def main(model_dir: str) -> None:
    with open(os.path.join(model_dir, "batch.json")) as f:
        b = json.load(f)
    B, Ts, Tt = b["B"], b["Ts"], b["Tt"]
    model = BartForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32,
                                                         attn_implementation="eager")
    model.eval()
    src = torch.tensor(b["src"]).view(B, Ts)
    mask = (torch.arange(Ts)[None, :] < torch.tensor(b["src_lens"])[:, None]).long()
    tgt_in = torch.tensor(b["tgt_in"]).view(B, Tt)
    labels = torch.tensor(b["tgt_out"]).view(B, Tt).clone()
    inside = torch.arange(Tt)[None, :] < torch.tensor(b["tgt_lens"])[:, None]
    labels[~inside] = -100
    labels[labels == model.config.pad_token_id] = -100
    out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt_in)
    logits = out.logits
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100,
                           label_smoothing=b["label_smoothing"])
    loss.backward()
    rows = inside.view(-1).nonzero().view(-1)
    grads = {n: p.grad.detach().reshape(-1).tolist() for n, p in model.named_parameters() if p.grad is not None}
    result = {"loss": loss.item(), "rows": rows.tolist(),
              "logits": logits.detach().view(B * Tt, -1)[rows].reshape(-1).tolist(), "grads": grads}
    with open(os.path.join(model_dir, "out.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
