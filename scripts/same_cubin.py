#!/usr/bin/env python3
"""Whether a refactor of CUDA files left their machine code alone, without a GPU: each FILE.cu is compiled to an
sm_90a cubin in this tree and at git revision REV, with the exact command the CUDA build uses (from
`ninja -t commands` of a configured build directory, its --generate-code swapped for -arch=sm_90a -cubin), and
the two cubins' ELF sections are compared byte for byte, headers included (a kernel's register count lives in
its .nv.info section and header, so it is compared too). The hash in an anonymous namespace's mangled name
(_GLOBAL__N__<hash>, which follows the source file's path) is left out of the comparison.

Usage: scripts/same_cubin.py REV FILE.cu [FILE.cu ...]   (paths relative to the repository root)
Exit 0: every file identical; 1: some differ (the sections are named); 2: bad usage or a failed compile.
Needs nvcc (the CUDA toolkit) and cmake + ninja; the builds go under build-cubin/ of each tree (REV's in a
temporary git worktree, removed at the end).
"""
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile


ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+")
ANON_BYTES = re.compile(rb"_GLOBAL__N__[0-9a-f]+")


def sections(path):
    """{name: (type, flags, size, link, info, entsize, bytes)} of an ELF64 file."""
    with open(path, "rb") as f:
        d = f.read()
    (shoff,) = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name = d[names + h[0]: d.index(b"\0", names + h[0])].decode()
        body = d[h[4]: h[4] + h[5]] if h[1] != 8 else b""  # SHT_NOBITS holds no bytes
        name = ANON.sub("_GLOBAL__N__", name)
        if name in (".strtab", ".shstrtab"):
            body = ANON_BYTES.sub(b"_GLOBAL__N__", body)
        out[name] = (h[1], h[2], len(body) if name in (".strtab", ".shstrtab") else h[5], h[6], h[7], h[9], body)
    return out


def compile_cubin(tree, rel, out):
    build = os.path.join(tree, "build-cubin")
    # Both trees with the same options: ptxas records its flags (-Werror among them) in .note.nv.tkinfo, so a
    # build dir left configured with TESSERA_WERROR=ON would differ there from one without it.
    subprocess.run(["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DCMAKE_CUDA_ARCHITECTURES=90a", "-DTESSERA_WERROR=OFF"], check=True, stdout=subprocess.DEVNULL)
    cmds = subprocess.run(["ninja", "-C", build, "-t", "commands"], check=True, capture_output=True,
                          text=True).stdout.splitlines()
    src = os.path.join(tree, rel)
    line = next((c for c in cmds if f"-c {src} " in c + " "), None)
    if line is None:
        sys.exit(f"same_cubin: the build of {tree} does not compile {rel}")
    argv = [a for a in shlex.split(line) if a != "ccache"]
    keep = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-MD",) or a.startswith("--generate-code"):
            continue
        if a in ("-MT", "-MF", "-o", "-c"):
            skip = True
            continue
        keep.append(a)
    keep = [a for a in keep if a != src] + ["-arch=sm_90a", "-cubin", src, "-o", out]
    r = subprocess.run(keep, cwd=build, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        sys.exit(f"same_cubin: {rel} did not compile in {tree}")


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[-5], file=sys.stderr)
        return 2
    rev, files = sys.argv[1], sys.argv[2:]
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                          text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="same_cubin_")
    old = os.path.join(tmp, "old")
    subprocess.run(["git", "-C", root, "worktree", "add", "-q", "--detach", old, rev], check=True)
    differ = False
    try:
        for rel in files:
            a, b = os.path.join(tmp, "old.cubin"), os.path.join(tmp, "new.cubin")
            compile_cubin(old, rel, a)
            compile_cubin(root, rel, b)
            sa, sb = sections(a), sections(b)
            bad = [n for n in sorted(set(sa) | set(sb)) if sa.get(n) != sb.get(n)]
            kernels = [n for n in sa if n.startswith(".text.")]
            print(f"{rel}: {len(sa)} sections, {len(kernels)} kernels: "
                  f"{'identical' if not bad else 'DIFFER in ' + ', '.join(n[:60] for n in bad)}")
            differ |= bool(bad)
    finally:
        subprocess.run(["git", "-C", root, "worktree", "remove", "--force", old], capture_output=True)
        subprocess.run(["rm", "-rf", tmp])
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
