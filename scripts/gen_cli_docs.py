#!/usr/bin/env python3
"""Writes docs/cli.md from the tessera binary's --help texts: every command and every subcommand (bench, tokenizer).

    python3 scripts/gen_cli_docs.py BINARY [OUT.md]      write OUT.md (default docs/cli.md)
    python3 scripts/gen_cli_docs.py BINARY --check FILE  exit 1 when FILE differs from what BINARY prints

The commands are read from the binary itself (`tessera --help`'s "commands:" list and the list of each command
whose usage names subcommands), so a new command or subcommand appears without a change here. `--help` is the flag reference; this page
is that reference in one place, so flags are documented once.
"""
import difflib
import os
import re
import subprocess
import sys
import tempfile

HEADER = """# Command reference

This page is generated from `tessera --help` and each command's `--help` by `scripts/gen_cli_docs.py`.
Do not edit it by hand. After changing a help text, run:

```sh
python3 scripts/gen_cli_docs.py build/tessera
```

The test `docs_cli_fresh` fails while this page differs from the built binary's help.
"""

# A command line in a help's list: two spaces, a lower-case name, two or more spaces, its description.
LIST_ENTRY = re.compile(r"^  ([a-z][a-z0-9-]*)\s{2,}\S")


def help_text(binary, args):
    """The stdout of `binary args --help`; a non-zero exit is an error that names the command."""
    cmd = [binary] + args + ["--help"]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, COLUMNS="120"))
    if res.returncode != 0:
        sys.exit(f"gen_cli_docs: `{' '.join(cmd)}` exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout.rstrip("\n")


def listed_names(text, after):
    """The names listed in `text` below the line `after` (or from the top when `after` is None)."""
    names, inside = [], after is None
    for line in text.splitlines():
        if not inside:
            inside = line.strip() == after
            continue
        m = LIST_ENTRY.match(line)
        if m:
            names.append(m.group(1))
    return names


def section(args, text):
    name = " ".join(["tessera"] + args)
    return f"## `{name}`\n\n```text\n{text}\n```\n"


def render(binary):
    top = help_text(binary, [])
    commands = listed_names(top, "commands:")
    if not commands:
        sys.exit("gen_cli_docs: `tessera --help` lists no commands")
    parts = [HEADER, section([], top)]
    for cmd in commands:
        parts.append(section([cmd], help_text(binary, [cmd])))
        # A command whose usage line reads `tessera CMD <a|b|...>` has subcommands (bench, tokenizer): each
        # listed one gets its own section, from `tessera CMD SUB --help`.
        cmd_top = help_text(binary, [cmd])
        if re.match(rf"usage: tessera {re.escape(cmd)} <", cmd_top):
            subs = listed_names(cmd_top, None)
            if not subs:
                sys.exit(f"gen_cli_docs: `tessera {cmd} --help` lists no subcommands")
            for sub in subs:
                parts.append(section([cmd, sub], help_text(binary, [cmd, sub])))
    return "\n".join(parts)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    binary = argv[1]
    text = render(binary)
    if len(argv) == 4 and argv[2] == "--check":
        with open(argv[3], encoding="utf-8") as f:
            old = f.read()
        if old == text:
            return 0
        diff = difflib.unified_diff(old.splitlines(), text.splitlines(), argv[3], "tessera --help", lineterm="")
        print("\n".join(list(diff)[:60]))
        print(f"{argv[3]} is stale: run `python3 scripts/gen_cli_docs.py {binary}`", file=sys.stderr)
        return 1
    out = argv[2] if len(argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "docs", "cli.md")
    # Written beside the target and renamed over it, so a failure leaves the old page whole.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".cli.md.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
