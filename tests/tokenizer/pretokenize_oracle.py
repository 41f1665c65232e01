#!/usr/bin/env python3
"""Python's `regex` module as the oracle of GPT-2's pre-tokenizer, for tests/tokenizer/test_pretokenize.cpp.

  pretokenize_oracle.py --classes OUT            one byte per code point 0..0x10FFFF: 0 other, 1 \\p{L}, 2 \\p{N}, 3 \\s
  pretokenize_oracle.py --split IN --out OUT     IN: cases, each a uint32 LE length and that many bytes; OUT: per
                                                 case one line, the byte lengths of its pre-tokens

Bytes that are not valid UTF-8 are decoded with errors="surrogateescape": each becomes a lone surrogate, which is
in none of the classes. Exit 77 (a skip) where `regex` is missing, unless TESSERA_REQUIRE_HF=1.
"""
import argparse
import os
import struct
import sys

try:
    import regex
except ImportError as e:
    if os.environ.get("TESSERA_REQUIRE_HF") == "1":
        print(f"FAIL: TESSERA_REQUIRE_HF=1 but {e} (with {sys.executable}; run scripts/install_deps.sh)")
        sys.exit(1)
    print(f"SKIP: {e}")
    sys.exit(77)

# GPT-2's encoder.py pattern, as written there.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def write_classes(path):
    letter, number, space = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    out = bytearray(0x110000)
    for cp in range(0x110000):
        c = chr(cp)
        out[cp] = 1 if letter.match(c) else 2 if number.match(c) else 3 if space.match(c) else 0
    with open(path, "wb") as f:
        f.write(out)


def split(inp, outp):
    pat = regex.compile(GPT2_PATTERN)
    data = open(inp, "rb").read()
    lines, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        text = data[at + 4:at + 4 + n].decode("utf-8", "surrogateescape")
        at += 4 + n
        lens = [len(piece.encode("utf-8", "surrogateescape")) for piece in pat.findall(text)]
        assert sum(lens) == n, "the pattern cuts every string whole"
        lines.append(" ".join(map(str, lens)))
    with open(outp, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes")
    ap.add_argument("--split")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.classes:
        write_classes(a.classes)
    if a.split:
        split(a.split, a.out)


if __name__ == "__main__":
    main()
