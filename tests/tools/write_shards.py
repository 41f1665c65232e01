#!/usr/bin/env python3
"""Writes llm.c-format token shards with nothing but the standard library, independently of tessera.

Header: 256 little-endian int32 (magic 20240520, version 1, token count, zeros), then uint16 tokens.
Token i of a good shard is (i * 7919 + 13) % modulus. Also writes broken shards for the error tests.
"""
import argparse
import os
import struct


def shard_bytes(tokens, magic=20240520, version=1, count=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--modulus", type=int, default=256)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    good = [(i * 7919 + 13) % a.modulus for i in range(a.count)]
    files = {
        "good_train_000000.bin": shard_bytes(good),
        "bad_magic.bin": shard_bytes(good, magic=20240521),
        "bad_version.bin": shard_bytes(good, version=7),
        "truncated.bin": shard_bytes(good)[:-10],
        "short_header.bin": shard_bytes(good)[:100],
        "big_token.bin": shard_bytes(good[:-1] + [300]),
    }
    for name, data in files.items():
        with open(os.path.join(a.out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
