#!/usr/bin/env python3
"""Decodes a PNG with Python's zlib, independently of tessera's encoder, and prints one JSON object:
{"ok": true, "width": W, "height": H, "colors": {"r,g,b": count, ...}} or {"ok": false, "error": "..."}.

Checked: the signature, every chunk's CRC-32, IHDR (8-bit RGB, no interlace), IHDR first and IEND last, that the
IDAT data inflates to exactly height * (1 + 3 * width) bytes, and that every scanline's filter byte is 0 (none,
the only filter tessera writes, so the pixels can be read straight).
Usage: check_png.py FILE.png
"""
import json
import struct
import sys
import zlib
from collections import Counter


def check(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return {"ok": False, "error": "bad signature"}
    pos, chunks = 8, []
    while pos < len(data):
        if pos + 12 > len(data):
            return {"ok": False, "error": "truncated chunk at %d" % pos}
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(ctype + body) & 0xFFFFFFFF != crc:
            return {"ok": False, "error": "bad CRC in chunk %r" % ctype}
        chunks.append((ctype, body))
        pos += 12 + length
    if not chunks or chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        return {"ok": False, "error": "IHDR must come first and IEND last"}
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if (depth, ctype, comp, filt, interlace) != (8, 2, 0, 0, 0):
        return {"ok": False, "error": "not 8-bit RGB without interlace"}
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    stride = 1 + 3 * w
    if len(raw) != h * stride:
        return {"ok": False, "error": "IDAT inflates to %d bytes, expected %d" % (len(raw), h * stride)}
    colors = Counter()
    for y in range(h):
        row = raw[y * stride:(y + 1) * stride]
        if row[0] != 0:
            return {"ok": False, "error": "row %d uses filter %d" % (y, row[0])}
        for x in range(w):
            colors["%d,%d,%d" % tuple(row[1 + 3 * x:4 + 3 * x])] += 1
    return {"ok": True, "width": w, "height": h, "colors": dict(colors)}


if __name__ == "__main__":
    print(json.dumps(check(sys.argv[1])))
