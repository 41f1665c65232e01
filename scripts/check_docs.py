#!/usr/bin/env python3
"""Checks the docs against the tree and the binary.

    python3 scripts/check_docs.py links [--source DIR]
        Every relative link in README.md, docs/*.md and bench/results/README.md resolves: the file or folder
        exists, and a #anchor names a heading of the page it points to (GitHub's heading ids). No table cell of
        those pages is longer than MAX_CELL_CHARS: a longer one is a paragraph, and belongs outside the table.
    python3 scripts/check_docs.py layers [--source DIR]
        docs/ARCHITECTURE.md's layers table is true: one row per folder of src/tessera/, and each row's "uses" is
        exactly the set of layers its folder's files include ("tessera/<layer>/..."). A layer may use only layers
        above it in the table, unless its cell marks that use "(an exception ...)".
    python3 scripts/check_docs.py comments [--source DIR]
        No comment in src/ quotes a measurement (a number with a time or rate unit) or names a GPU model: those are
        one run's facts and go to bench/results/ and the commit message (naming the results file is allowed). String
        literals are not comments, and COMMENT_ALLOW lists the few comments where a name is part of a format.
    python3 scripts/check_docs.py commands --build BUILD_DIR [--source DIR] [PAGE.md ...]
        Runs every fenced block tagged `sh doctest` in those pages (default: the pages above), as written, with
        bash -e -o pipefail. Each page runs in a fresh scratch directory holding `build` (a link to BUILD_DIR) and
        links to the source tree's data/, bench/ and scripts/, so `build/tessera train --data data/corpus.txt`
        runs as a reader would type it, and writes its runs/ into the scratch directory. A page's blocks run in
        order in one directory, so a later block may use what an earlier one wrote.

Exit status 0 when all is well, 1 with one line per problem otherwise.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Pages whose arrival other branches are bringing; a link to one of them is accepted while it is missing, and
# checked as any other once it exists. None are pending.
EXPECTED_PAGES = set()

# The longest table cell the docs allow (about three lines of a rendered table).
MAX_CELL_CHARS = 300

# A doc block is meant to take seconds (tiny models, a few steps); one past this has stopped being an example.
BLOCK_TIMEOUT_S = 120

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def pages(source):
    found = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    results = os.path.join(source, "bench", "results", "README.md")
    if os.path.exists(results):
        found.append(results)
    return found


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            marker = m.group(2)
            if fence is None:
                fence = marker[0] * len(marker)
                continue
            if marker.startswith(fence) and not m.group(3).strip():
                fence = None
                continue
        if fence is None:
            yield n, line


def slug(heading):
    """GitHub's id for a heading: markup dropped, lower case, punctuation removed, spaces as hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        seen, ids = {}, set()
        for _, line in prose_lines(text):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            ids.add(base if n == 0 else f"{base}-{n}")
        ids.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
        cache[path] = ids
    return cache[path]


def check_links(source):
    problems = []
    for page in pages(source):
        rel_page = os.path.relpath(page, source)
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for n, line in prose_lines(text):
            if line.startswith("|"):
                for cell in line.strip().strip("|").split(" | "):
                    if len(cell) > MAX_CELL_CHARS:
                        problems.append(f"{rel_page}:{n}: a table cell of {len(cell)} characters (at most "
                                        f"{MAX_CELL_CHARS}): {cell[:40]}...")
            line = INLINE_CODE.sub("", line)
            for target in LINK.findall(line) + IMAGE.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                where = f"{rel_page}:{n}: link '{target}'"
                dest = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
                rel_dest = os.path.relpath(dest, source)
                if rel_dest.startswith(".."):
                    problems.append(f"{where} leaves the repository")
                    continue
                if not os.path.exists(dest):
                    if rel_dest not in EXPECTED_PAGES:
                        problems.append(f"{where}: no such file {rel_dest}")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    problems.append(f"{where}: {rel_dest} has no heading with id '{anchor}'")
    return problems


def split_top_level(cell):
    """`cell` cut at the commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in cell:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in parts + [cur] if p.strip()]


def check_layers(source):
    page = os.path.join(source, "docs", "ARCHITECTURE.md")
    with open(page, encoding="utf-8") as f:
        lines = f.read().splitlines()
    header = [i for i, line in enumerate(lines) if re.match(r"^\|\s*layer\s*\|\s*folder\s*\|\s*holds\s*\|\s*uses\s*\|", line)]
    if len(header) != 1:
        return [f"docs/ARCHITECTURE.md: expected one table headed | layer | folder | holds | uses |, found {len(header)}"]
    rows = []
    for line in lines[header[0] + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            return [f"docs/ARCHITECTURE.md: a layers row without 4 cells: {line[:80]}"]
        rows.append(cells)
    problems, order = [], [r[0] for r in rows]
    root = os.path.join(source, "src", "tessera")
    folders = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for d in folders:
        if d not in order:
            problems.append(f"docs/ARCHITECTURE.md: src/tessera/{d}/ has no row in the layers table")
    for n, (layer, folder, _, uses) in enumerate(rows):
        if folder != f"`src/tessera/{layer}/`" or layer not in folders:
            problems.append(f"docs/ARCHITECTURE.md: layer {layer}: folder {folder} is not src/tessera/{layer}/")
            continue
        declared, exceptions = set(), set()
        if uses != "nothing":
            for chunk in split_top_level(uses):
                m = re.match(r"^`([a-z]+)`(.*)$", chunk)
                if not m:
                    problems.append(f"docs/ARCHITECTURE.md: layer {layer}: cannot read '{chunk}' in its uses")
                    continue
                declared.add(m.group(1))
                if "exception" in m.group(2):
                    exceptions.add(m.group(1))
        actual = set()
        for path in glob.glob(os.path.join(root, layer, "**", "*"), recursive=True):
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    actual.update(re.findall(r'^\s*#\s*include\s+"tessera/([a-z_]+)/', f.read(), re.M))
        actual.discard(layer)
        for used in sorted(actual - declared):
            problems.append(f"docs/ARCHITECTURE.md: layer {layer} includes {used}, which its row does not name")
        for used in sorted(declared - actual):
            problems.append(f"docs/ARCHITECTURE.md: layer {layer}'s row names {used}, which it does not include")
        for used in sorted(declared):
            above = used in order[:n]
            if not above and used not in exceptions:
                problems.append(f"docs/ARCHITECTURE.md: layer {layer} uses {used}, which is not above it")
            if above and used in exceptions:
                problems.append(f"docs/ARCHITECTURE.md: layer {layer}'s use of {used} is marked an exception, "
                                "but it is above: drop the mark")
    return problems


# What a comment in src/ may not hold: a measurement or a GPU's model name. Those are a run's facts, true of one tree
# on one machine, and they belong in bench/results/ and the commit message; a comment states the invariant, the
# formula or the reason, which stay true. Naming the results file that a choice rests on is what STYLE.md asks
# for, and passes. A unit alone ("the TFLOP/s table", "µs from mark 0") is
# a definition, not a measurement, and passes; a number with a time or rate unit does not.
COMMENT_RULES = [
    (re.compile(r"\d+(?:\.\d+)?\s*(?:µs|us|ms|ns)\b"), "quotes a time"),
    (re.compile(r"\d+(?:\.\d+)?\s*(?:[TGP]FLOP/?s|[TGM]B/s|GiB/s)"), "quotes a rate"),
    (re.compile(r"\b(?:[AHB]100|H200|GH200|B200|V100|L40S?|A10G?|RTX\s?\d{4})\b"), "names a GPU model"),
]

# (path relative to the source root, text the comment holds) of the few comments allowed to match a rule: where a
# model name is part of an identifier or a format the comment documents. Keep it short.
COMMENT_ALLOW = set()

SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def comments(text):
    """(line number, text) of every comment in C++ / CUDA source: `//` to the end of the line, and each line of a
    `/* */` block. String, character and raw string literals are skipped, so a "// in a string" is not a comment
    and a message string may name what it likes."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == "R" and text.startswith('"', i + 1) and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            line += text.count("\n", i, end)
            i = end
        elif c == '"' or (c == "'" and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"))):
            # A ' after a digit or a letter is a digit separator (1'000) or part of a prefix such as u8'x'.
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def check_comments(source):
    problems = []
    root = os.path.join(source, "src")
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if not path.endswith(SOURCE_EXTS) or not os.path.isfile(path):
            continue
        rel = os.path.relpath(path, source)
        with open(path, encoding="utf-8", errors="replace") as f:
            found = comments(f.read())
        for n, body in found:
            for rule, what in COMMENT_RULES:
                m = rule.search(body)
                if m and (rel, body.strip()) not in COMMENT_ALLOW:
                    problems.append(f"{rel}:{n}: a comment {what} ('{m.group(0)}'): state the invariant or the "
                                    "reason; the figures belong in bench/results/ and the commit message")
    return problems


def doctest_blocks(text):
    """(line number, script) of each fenced block whose info string is `sh doctest`."""
    blocks, current, start, fence = [], None, 0, None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            if m.group(3).split() == ["sh", "doctest"]:
                current, start = [], n
            continue
        if fence is not None and m and m.group(2).startswith(fence) and not m.group(3).strip():
            if current is not None:
                blocks.append((start, "\n".join(current) + "\n"))
            current, fence = None, None
            continue
        if current is not None:
            current.append(line)
    return blocks


def check_commands(source, build, only):
    binary = os.path.join(build, "tessera")
    if not os.access(binary, os.X_OK):
        return [f"no tessera binary in {build}"]
    env = dict(os.environ)
    # What a root user (CI runs as root) or a container without CAP_SYS_PTRACE sets for mpirun: docs/distributed.md
    # says so beside its commands.
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
    problems, ran = [], 0
    for page in only or pages(source):
        rel_page = os.path.relpath(page, source)
        with open(page, encoding="utf-8") as f:
            blocks = doctest_blocks(f.read())
        if not blocks:
            continue
        work = tempfile.mkdtemp(prefix="tessera-doctest-")
        try:
            os.symlink(os.path.abspath(build), os.path.join(work, "build"))
            for entry in ("data", "bench", "scripts"):
                os.symlink(os.path.join(os.path.abspath(source), entry), os.path.join(work, entry))
            for line, script in blocks:
                t0 = time.monotonic()
                try:
                    res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8",
                                         errors="replace", timeout=BLOCK_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    problems.append(f"{rel_page}:{line}: the block ran past {BLOCK_TIMEOUT_S} s (keep them seconds)")
                    continue
                ran += 1
                took = time.monotonic() - t0
                print(f"{rel_page}:{line}: exit {res.returncode} in {took:.1f} s")
                if res.returncode != 0:
                    tail = "\n    ".join(res.stdout.splitlines()[-15:])
                    problems.append(f"{rel_page}:{line}: the block exited {res.returncode}:\n    {tail}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if ran == 0:
        problems.append("no `sh doctest` block found")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["links", "layers", "comments", "commands"])
    ap.add_argument("pages", nargs="*", help="commands: only these pages")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="the repository's root (default: this script's parent)")
    ap.add_argument("--build", help="the build directory holding tessera (commands)")
    a = ap.parse_intermixed_args()
    source = os.path.abspath(a.source)
    if a.what == "links":
        problems = check_links(source)
    elif a.what == "layers":
        problems = check_layers(source)
    elif a.what == "comments":
        problems = check_comments(source)
    else:
        if not a.build:
            ap.error("commands needs --build BUILD_DIR")
        problems = check_commands(source, a.build, [os.path.abspath(p) for p in a.pages])
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
