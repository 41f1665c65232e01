#!/usr/bin/env python3
"""The PyTorch peer of `tessera bench seq2seq`: Hugging Face BartForConditionalGeneration trained and generating.

`tessera bench seq2seq --peer` runs this script after its own rows, with the model's shape and the rows' sizes as
flags, and sets its figures beside tessera's. Standalone:

  python3 bench/peers/seq2seq.py --device cuda
  python3 bench/peers/seq2seq.py --device cpu --precision f32 --vocab 512 --d-model 64 --layers 2,2 --heads 4 \
      --ffn 256 --src-len 8 --tgt-len 8 --train-tokens 64 --sentences 4 --batches 2,1 --new-tokens 8

The model is built from a BartConfig with random weights (nothing is downloaded) in the shape of tessera's
transformer-base preset: post-norm (BART's only form), activation_function "relu", scale_embedding as tessera's,
the same dropouts and vocabulary, pad 1 / bos 0 / eos 2 / decoder start 2. BART differs from tessera's preset in
its learned positions and its layernorm_embedding, which it always has (a few hundred microseconds of a step).

Rows, one JSON object per line (each with "what", "mode" and "n"):
- {"what": "train", "mode": "eager"|"compile", "n": target tokens, "ms", "tok/s", "MiB"}: one step of
  zero_grad(set_to_none) + forward + label-smoothed cross-entropy (F.cross_entropy's label_smoothing) + backward +
  torch.optim.AdamW(fused=True where this torch has it on the device), parameters in f32, the forward under
  autocast bf16 for --precision bf16 (GPU); B = n / tgt_len sentences of src_len + tgt_len tokens, no padding.
  The median of --iters steps after --warmup (compile: 3 more warm-up steps for the compilation); MiB:
  torch.cuda.max_memory_allocated over the build and the steps (GPU only). "compile" is torch.compile of the
  forward and loss.
- {"what": "translate", "mode": "eager"|"static", "n": batch, "sent/s", "ms", "sentences"}: generate(num_beams,
  min_new_tokens = max_new_tokens = new_tokens, early_stopping=False, no forced EOS or n-gram blocking) of random
  sources of src_len tokens in batches of n, the model in --precision under inference_mode; one untimed batch (two
  for static), then batches until --sentences are done or --translate-seconds have passed; ms per sentence over the
  sentences timed. "static": cache_implementation="static".
- {"what": ..., "unsupported": reason} where this torch / transformers cannot run a mode (torch.compile missing, a
  static cache BART does not take), {"what": ..., "error": ...} where one failed.
Without torch or transformers, or for --device cuda without a GPU, it exits 0 with one line "peer: <reason>".
"""
import argparse
import contextlib
import json
import statistics
import sys
import time


def one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def bart_config(transformers, a):
    enc, dec = (int(x) for x in a.layers.split(","))
    drop, attn, act = (float(x) for x in a.dropout.split(","))
    return transformers.BartConfig(
        vocab_size=a.vocab, d_model=a.d_model, encoder_layers=enc, decoder_layers=dec,
        encoder_attention_heads=a.heads, decoder_attention_heads=a.heads, encoder_ffn_dim=a.ffn,
        decoder_ffn_dim=a.ffn, activation_function="relu", dropout=drop, attention_dropout=attn,
        activation_dropout=act, max_position_embeddings=a.max_pos, scale_embedding=bool(a.scale_embedding),
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
        forced_bos_token_id=None, no_repeat_ngram_size=0, use_cache=True)


class Peer:
    def __init__(self, torch, transformers, a):
        self.torch, self.tf, self.a = torch, transformers, a
        self.dev = torch.device(a.device)
        self.cfg = bart_config(transformers, a)
        self.gen = torch.Generator(device="cpu").manual_seed(0)

    def emit(self, rec):
        print(json.dumps(rec), flush=True)

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def ids(self, rows, cols):
        return self.torch.randint(3, self.a.vocab, (rows, cols), generator=self.gen).to(self.dev)

    def timed_ms(self, fn, warmup, iters):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            self.sync()
            t = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    def adamw(self, params):
        try:
            return self.torch.optim.AdamW(params, lr=1e-4, fused=self.dev.type == "cuda"), self.dev.type == "cuda"
        except (TypeError, RuntimeError):  # torch without fused AdamW (or not on this device)
            return self.torch.optim.AdamW(params, lr=1e-4), False

    def train(self, mode, tokens):
        torch, a = self.torch, self.a
        F = torch.nn.functional
        if mode == "compile" and not hasattr(torch, "compile"):
            return {"unsupported": f"torch {torch.__version__} has no torch.compile"}
        B = tokens // a.tgt_len
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = self.tf.BartForConditionalGeneration(self.cfg).to(self.dev).train()  # f32 parameters
        opt, fused = self.adamw(model.parameters())
        src, tgt_out = self.ids(B, a.src_len), self.ids(B, a.tgt_len)
        tgt_in = torch.cat([torch.full((B, 1), 2, device=self.dev, dtype=tgt_out.dtype), tgt_out[:, :-1]], dim=1)
        mask = torch.ones_like(src)
        bf16 = a.precision == "bf16" and self.dev.type == "cuda"

        def loss_of(s, m, ti, to):
            with torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                logits = model(input_ids=s, attention_mask=m, decoder_input_ids=ti).logits
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), to.reshape(-1),
                                   label_smoothing=a.label_smoothing)

        fwd = torch.compile(loss_of) if mode == "compile" else loss_of

        def step():
            opt.zero_grad(set_to_none=True)
            fwd(src, mask, tgt_in, tgt_out).backward()
            opt.step()

        ms = self.timed_ms(step, a.warmup + (3 if mode == "compile" else 0), a.iters)
        rec = {"ms": ms, "tok/s": tokens / (ms / 1e3), "fused_adamw": fused, "autocast_bf16": bf16}
        if self.dev.type == "cuda":
            rec["MiB"] = torch.cuda.max_memory_allocated() / (1 << 20)
        if mode == "compile":  # the compiled graph holds the model: let it go before the next size's peak
            torch._dynamo.reset()
        return rec

    def translate(self, mode, batch, model):
        a = self.a
        kw = dict(num_beams=a.beams, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
                  early_stopping=False, num_return_sequences=1, no_repeat_ngram_size=0)
        if mode == "static":
            kw["cache_implementation"] = "static"
        sources = self.ids(a.sentences, a.src_len)

        def run(at):
            part = sources[at:at + batch]
            model.generate(input_ids=part, attention_mask=self.torch.ones_like(part), **kw)

        with self.torch.inference_mode():
            for _ in range(2 if mode == "static" else 1):
                try:
                    run(0)
                except Exception as e:  # a cache this BART does not take raises here, before any timing
                    if mode == "static":
                        return {"unsupported": one_line(e)}
                    raise
            self.sync()
            t, done = time.perf_counter(), 0
            while done < a.sentences and (done == 0 or time.perf_counter() - t < a.translate_seconds):
                run(done)
                done += min(batch, a.sentences - done)
            self.sync()
            ms = (time.perf_counter() - t) * 1e3
        return {"sent/s": done / (ms / 1e3), "ms": ms / done, "sentences": done}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--rows", default="train,translate")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", default="6,6", help="encoder,decoder")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--max-pos", type=int, default=1024)
    ap.add_argument("--dropout", default="0.1,0,0", help="dropout,attention_dropout,activation_dropout")
    ap.add_argument("--scale-embedding", type=int, default=1)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--tgt-len", type=int, default=32)
    ap.add_argument("--train-tokens", default="4096,16384")
    ap.add_argument("--train-modes", default="eager,compile")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batches", default="64,1")
    ap.add_argument("--translate-modes", default="eager,static")
    ap.add_argument("--translate-seconds", type=float, default=60.0,
                    help="stop timing a batch size's translation after this many seconds (per-sentence figures)")
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"peer: torch or transformers is not installed ({e})")
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("peer: no CUDA device")
        return 0
    transformers.logging.set_verbosity_error()
    p = Peer(torch, transformers, a)
    rows = [r for r in a.rows.split(",") if r]
    p.emit({"what": "versions", "text": f"torch {torch.__version__}, transformers {transformers.__version__}"})
    if "train" in rows:
        for mode in [m for m in a.train_modes.split(",") if m]:
            for tokens in (int(x) for x in a.train_tokens.split(",") if x):
                try:
                    p.emit({"what": "train", "mode": mode, "n": tokens, **p.train(mode, tokens)})
                except Exception as e:  # one size failing (out of memory) leaves the others
                    p.emit({"what": "train", "mode": mode, "n": tokens, "error": one_line(e)})
                if mode == "compile" and not hasattr(torch, "compile"):
                    break
    if "translate" in rows:
        dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
        torch.manual_seed(0)
        model = transformers.BartForConditionalGeneration(p.cfg).to(device=p.dev, dtype=dtype).eval()
        for mode in [m for m in a.translate_modes.split(",") if m]:
            for batch in (int(x) for x in a.batches.split(",") if x):
                try:
                    rec = p.translate(mode, batch, model)
                except Exception as e:
                    rec = {"error": one_line(e)}
                p.emit({"what": "translate", "mode": mode, "n": batch, **rec})
                if "unsupported" in rec:
                    break
    return 0


if __name__ == "__main__":
    sys.exit(main())
