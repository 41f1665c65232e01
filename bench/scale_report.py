#!/usr/bin/env python3
"""The report of bench/scale.sh: reads what the sweep left in OUT and writes, beside it,

  allreduce_<dt>.md   one table per dtype: N, size, algbw, busbw, torch busbw, tessera / torch busbw
  busbw_<dt>.png      busbw against size, one line per N (torch's dashed), when matplotlib is installed
  training.md         gpt2-124m at N = 1 and each N: ms / step (median over steps 6.. of metrics.jsonl), tokens/s,
                      scaling efficiency (N = 1's step / N's step: the per-GPU batch is fixed), optimizer memory
  zero_check.txt      the ZeRO-1 check: rank 0's AdamW m+v against 1/N of the unsharded figure, PASS or FAIL
  summary.md          all of it, with issue 10's targets met or not, to copy under bench/results/

Usage: python3 bench/scale_report.py OUT. Exit status 1 when a run's output that should be there cannot be read.
Only the standard library is needed (matplotlib for the PNG, optional).
"""
import glob
import json
import os
import re
import statistics
import sys

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
# issue 10's targets
BUSBW_TARGET, EFF_TARGET = 95.0, 95.0
ISSUE_N, ISSUE_SIZE = 8, 10**9


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def size_bytes(name):
    """'1 MB' -> 10**6, as tessera's size_name writes sizes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KB|MB|GB|KiB|MiB|GiB)\s*", name)
    return int(round(float(m.group(1)) * SIZE_UNITS[m.group(2)])) if m else None


def human_bytes(b):
    """The inverse of tessera's human_bytes formatting, for messages: bytes -> '474.70 MiB'."""
    for u in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024:
            return "%.2f %s" % (b, u)
        b /= 1024
    return "%.2f PiB" % b


def parse_md_table(text):
    """The first markdown table in text, as a list of {header: cell}."""
    lines = [l.strip() for l in text.splitlines() if l.strip().startswith("|")]
    if len(lines) < 2:
        return []
    cells = lambda l: [c.strip() for c in l.strip("|").split("|")]
    head = cells(lines[0])
    return [dict(zip(head, cells(l))) for l in lines[2:]]


def num(s):
    try:
        return float(str(s).rstrip("%"))
    except ValueError:
        return None


# ---- all-reduce ----
def allreduce_rows(out, dt):
    """Rows {n, size, bytes, algbw, busbw, torch_busbw, ratio} of every allreduce_<dt>_n<N>.md, by N then size."""
    rows, notes = [], []
    for path in glob.glob(os.path.join(out, "allreduce_%s_n*.md" % dt)):
        text = read(path)
        for line in text.splitlines():
            if re.match(r"- peer skipped|- the peer|- backend", line):
                notes.append("N = %s: %s" % (re.search(r"_n(\d+)\.md$", path).group(1), line[2:]))
        for r in parse_md_table(text):
            n = int(r["world size"])
            rows.append({
                "n": n, "size": r["size"], "bytes": size_bytes(r["size"]), "algbw": num(r["algbw GB/s"]),
                "busbw": num(r["busbw GB/s"]), "torch_busbw": num(r.get("torch busbw GB/s", "–")),
                "ratio": num(r.get("tessera / torch busbw", "–")),
            })
    rows.sort(key=lambda r: (r["n"], r["bytes"] or 0))
    return rows, sorted(set(notes))


def fmt(v, f="%.2f", missing="–"):
    return missing if v is None else f % v


def allreduce_table(rows):
    md = "| N | size | algbw GB/s | busbw GB/s | torch busbw GB/s | tessera / torch busbw |\n"
    md += "|---:|---:|---:|---:|---:|---:|\n"
    for r in rows:
        md += "| %d | %s | %s | %s | %s | %s |\n" % (r["n"], r["size"], fmt(r["algbw"]), fmt(r["busbw"]),
                                                   fmt(r["torch_busbw"]), fmt(r["ratio"], "%.1f%%"))
    return md


def plot_busbw(out, dt, rows):
    """busbw_<dt>.png, or one line saying why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "busbw_%s.png not drawn: matplotlib is not installed (pip install matplotlib, then rerun " \
               "python3 bench/scale_report.py OUT)" % dt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, n in enumerate(sorted({r["n"] for r in rows})):
        mine = [r for r in rows if r["n"] == n and r["bytes"]]
        color = "C%d" % i
        ax.plot([r["bytes"] for r in mine], [r["busbw"] for r in mine], "o-", color=color, label="tessera, N = %d" % n)
        peer = [r for r in mine if r["torch_busbw"] is not None]
        if peer:
            ax.plot([r["bytes"] for r in peer], [r["torch_busbw"] for r in peer], "x--", color=color, alpha=0.6,
                    label="torch.distributed, N = %d" % n)
    ax.set_xscale("log")
    sizes = sorted({(r["bytes"], r["size"]) for r in rows if r["bytes"]})
    ax.set_xticks([b for b, _ in sizes], [name for _, name in sizes])
    ax.minorticks_off()
    ax.set_xlabel("size per rank")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("all-reduce bus bandwidth, %s" % dt)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "busbw_%s.png" % dt), dpi=120)
    plt.close(fig)
    return None


# ---- training ----
def step_ms(run_dir, tokens_per_step):
    """Median ms a step over steps 6.. of metrics.jsonl (all but the first when a run has 5 steps or fewer), from
    tokens_per_s: the global tokens of a step over its time, so ms = global tokens / tokens_per_s."""
    try:
        recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    except (OSError, ValueError):
        return None, 0
    recs = [r for r in recs if r.get("tokens_per_s")]
    timed = recs[5:] if len(recs) > 5 else recs[1:]
    if not timed:
        return None, 0
    return statistics.median(tokens_per_step / r["tokens_per_s"] * 1e3 for r in timed), len(timed)


def optimizer_line(log_text):
    m = re.search(r"AdamW m\+v ([0-9.]+ [KMGTP]?i?B) on (rank 0|each rank)[^\n]*", log_text)
    return m


def to_bytes(s):
    v, u = s.split()
    return float(v) * UNITS[u]


def training(out):
    cfg = read(os.path.join(out, "train_config.txt")).split()
    conf = dict(zip(cfg[0::2], cfg[1::2]))
    if "batch" not in conf:
        return None
    B, T = int(conf["batch"]), int(conf["seq"])
    rows, missing = [], []
    single, timed = step_ms(os.path.join(out, "train_single_n1"), B * T)
    info = re.search(r"AdamW m\+v ([0-9.]+ [KMGTP]?i?B)", read(os.path.join(out, "info_train.txt")))
    rows.append({"n": 1, "form": "one process", "ms": single, "timed": timed,
                 "mem": (info.group(1) + " (tessera info; one process prints none)") if info else "–"})
    if single is None:
        missing.append("train_single_n1")
    ns = sorted({int(m.group(1)) for p in glob.glob(os.path.join(out, "train_*_n*.log"))
                 for m in [re.search(r"train_(?:bucket|zero)_n(\d+)\.log$", p)] if m})
    for n in ns:
        for form, flag in (("bucket", "--ddp bucket"), ("zero", "--zero 1")):
            d = os.path.join(out, "train_%s_n%d" % (form, n))
            ms, timed = step_ms(d, B * T * n)
            if ms is None:
                missing.append(os.path.basename(d))
            opt = optimizer_line(read(d + ".log"))
            rows.append({"n": n, "form": flag, "ms": ms, "timed": timed,
                         "mem": opt.group(0).replace("AdamW m+v ", "") if opt else "–",
                         "mem_bytes": to_bytes(opt.group(1)) if opt else None})
    for r in rows:
        r["tps"] = B * T * r["n"] / r["ms"] * 1e3 if r["ms"] else None
        r["eff"] = 100.0 * single / r["ms"] if single and r["ms"] and r["n"] > 1 else None
    return {"B": B, "T": T, "steps": int(conf.get("steps", 0)), "precision": conf.get("precision", "?"),
            "rows": rows, "missing": missing}


def training_table(tr):
    md = "| N | run | ms / step | tokens/s | scaling efficiency | optimizer memory per rank |\n"
    md += "|---:|---|---:|---:|---:|---|\n"
    for r in tr["rows"]:
        md += "| %d | %s | %s | %s | %s | %s |\n" % (r["n"], r["form"], fmt(r["ms"], "%.1f"), fmt(r["tps"], "%.0f"),
                                                    fmt(r["eff"], "%.1f%%") if r["n"] > 1 else "–", r["mem"])
    return md


# ---- ZeRO-1 memory ----
def zero_check(out):
    """Rank 0's AdamW m+v under --zero 1 at N against 1/N of the unsharded figure. rank 0 owns c = ⌊S/(16N)⌋·16 of
    the S elements (dist/zero.h), so 8·S/N − 8·c < 128 bytes: the padding; the figures are printed with two
    decimals, so each may be off by half a unit of its last digit too."""
    logs = glob.glob(os.path.join(out, "zero_*_n*.log"))
    if not logs:
        return None
    log = logs[0]
    m = re.search(r"zero_(.+)_n(\d+)\.log$", os.path.basename(log))
    preset, n = m.group(1), int(m.group(2))
    line = re.search(r"AdamW m\+v ([0-9.]+ [KMGTP]?i?B) on rank 0 \(ZeRO-1: its 1/(\d+) of ([0-9.]+ [KMGTP]?i?B)\)",
                     read(log))
    res = {"preset": preset, "n": n, "log": os.path.basename(log)}
    if not line:
        res.update(ok=False, text="ZeRO-1 memory check (%s, N = %d): FAIL: no optimizer line in %s" % (
            preset, n, res["log"]))
        return res
    mine, shown_n, unsharded = to_bytes(line.group(1)), int(line.group(2)), to_bytes(line.group(3))
    half_unit = lambda s: 0.005 * UNITS[s.split()[1]]
    tol = 128 + half_unit(line.group(1)) + half_unit(line.group(3)) / n
    ideal = unsharded / n
    ok = shown_n == n and abs(mine - ideal) <= tol
    res.update(ok=ok, mine=mine, unsharded=unsharded, text=(
        "ZeRO-1 memory check (%s, N = %d): %s: rank 0 holds AdamW m+v %s; 1/%d of the unsharded %s is %s; "
        "difference %.0f bytes, allowed %.0f (128 bytes of the layout's rounding + the figures' last digit)" % (
            preset, n, "PASS" if ok else "FAIL", line.group(1), n, line.group(3), human_bytes(ideal),
            abs(mine - ideal), tol)))
    # the exact figure, when tessera info gave the parameter count: 8 bytes x ⌊S/(16N)⌋·16
    params = re.search(r"^params\s+(\d+)", read(os.path.join(out, "info_zero.txt")), re.M)
    if params:
        S = int(params.group(1))
        exact = 8 * (S // (16 * n)) * 16
        agrees = abs(mine - exact) <= half_unit(line.group(1)) and abs(unsharded - 8 * S) <= half_unit(line.group(3))
        res["ok"] = ok and agrees
        res["text"] = res["text"].replace(": PASS:" if ok else ": FAIL:", ": PASS:" if res["ok"] else ": FAIL:", 1)
        res["text"] += "; from tessera info's %d parameters, the layout gives rank 0 %d bytes (%s) of %d: %s" % (
            S, exact, human_bytes(exact), 8 * S, "the log agrees" if agrees else "the log DISAGREES")
    return res


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 bench/scale_report.py OUT")
    out = sys.argv[1]
    env = read(os.path.join(out, "env.txt"))
    envd = dict(l.split(": ", 1) for l in env.splitlines() if ": " in l)
    smoke = envd.get("mode") == "cpu-smoke"
    problems = []
    notes = list(dict.fromkeys(l for l in read(os.path.join(out, "notes.txt")).splitlines() if l))  # calls repeat them
    md_parts, targets = [], []

    # all-reduce
    for dt in ("f32", "bf16"):
        rows, peer_notes = allreduce_rows(out, dt)
        if not rows:
            continue
        table = allreduce_table(rows)
        with open(os.path.join(out, "allreduce_%s.md" % dt), "w") as f:
            f.write(table)
        why = plot_busbw(out, dt, rows)
        if why:
            notes.append(why)
            print("scale_report: " + why)
        md_parts.append("## All-reduce, %s\n\n%s%s" % (
            dt, "".join("- %s\n" % n for n in peer_notes) + ("\n" if peer_notes else ""), table) +
            ("" if why else "\n![busbw against size, %s](busbw_%s.png)\n" % (dt, dt)))
        # target: busbw at the largest size and N, against torch's in the same run
        nmax = max(r["n"] for r in rows)
        big = max((r for r in rows if r["n"] == nmax), key=lambda r: r["bytes"] or 0)
        where = "%s, N = %d" % (big["size"], nmax)
        if (nmax, big["bytes"]) != (ISSUE_N, ISSUE_SIZE):
            where += " (the issue's: 1 GB, N = 8)"
        if big["ratio"] is None:
            targets.append(("all-reduce busbw %s, %s" % (dt, where), "≥ %.0f%% of torch.distributed" % BUSBW_TARGET,
                            "%s GB/s; no torch figure" % fmt(big["busbw"]), "not measured"))
        else:
            targets.append(("all-reduce busbw %s, %s" % (dt, where), "≥ %.0f%% of torch.distributed" % BUSBW_TARGET,
                            "%s GB/s against %s: %.1f%%" % (fmt(big["busbw"]), fmt(big["torch_busbw"]), big["ratio"]),
                            "yes" if big["ratio"] >= BUSBW_TARGET else "**no**"))

    # training
    tr = training(out)
    if tr:
        table = training_table(tr)
        with open(os.path.join(out, "training.md"), "w") as f:
            f.write(table)
        model = "tiny (CPU smoke)" if smoke else "gpt2-124m"
        md_parts.append(
            "## %s data parallel, B %d x T %d per rank, %s\n\n- ms / step: median over steps 6..%d of metrics.jsonl "
            "(global tokens / tokens_per_s); tokens/s: global; scaling efficiency: the N = 1 step / the N-rank step "
            "(the per-rank batch is fixed)\n- optimizer memory: rank 0's AdamW m+v line of the log\n\n%s" % (
                model, tr["B"], tr["T"], tr["precision"], tr["steps"], table))
        problems += ["no step times in %s/metrics.jsonl" % m for m in tr["missing"]]
        bucket = [r for r in tr["rows"] if r["form"] == "--ddp bucket"]
        if bucket:
            b = max(bucket, key=lambda r: r["n"])
            where = "N = %d" % b["n"] + ("" if b["n"] == ISSUE_N else " (the issue's: N = 8)")
            single = tr["rows"][0]["ms"]
            targets.append(("`--ddp bucket` scaling efficiency, " + where, "≥ %.0f%%" % EFF_TARGET,
                            "%s ms against %s ms on one: %s" % (fmt(b["ms"], "%.1f"), fmt(single, "%.1f"),
                                                                fmt(b["eff"], "%.1f%%")),
                            "not measured" if b["eff"] is None else "yes" if b["eff"] >= EFF_TARGET else "**no**"))

    # ZeRO-1
    z = zero_check(out)
    pick = read(os.path.join(out, "zero_pick.txt")).strip()
    if z:
        with open(os.path.join(out, "zero_check.txt"), "w") as f:
            f.write(z["text"] + "\n")
        print(z["text"])
        md_parts.append("## ZeRO-1 optimizer memory, %s at N = %d\n\nThe preset: the largest cs336 preset that fits "
                        "one GPU:\n\n```\n%s\n```\n\n%s\n" % (z["preset"], z["n"], pick, z["text"]))
        where = "%s, N = %d" % (z["preset"], z["n"]) + ("" if z["n"] == ISSUE_N else " (the issue's: N = 8)")
        targets.append(("`--zero 1` optimizer memory per rank, " + where, "1/%d of unsharded, within padding" % z["n"],
                        "%s of %s" % (human_bytes(z["mine"]), human_bytes(z["unsharded"])) if "mine" in z else
                        "no figure", "yes" if z["ok"] else "**no**"))
        if not z["ok"] and "mine" not in z:
            problems.append("the ZeRO run printed no optimizer line (%s)" % z["log"])

    title = ("CPU smoke of bench/scale.sh (MPI ranks on the CPU; no figure here is a performance result)" if smoke
             else "Scale-out on one host: all-reduce, DDP and ZeRO-1 on %s" % envd.get("gpus", "?"))
    head = "# %s\n\n" % title
    head += "- runs: %s, %s\n" % (envd.get("date", "?"), envd.get("gpus", envd.get("cpus", "?")))
    head += "- tree: %s (the device's copy of the tree may show a stale git HEAD: give the tree the lead sent)\n" % \
        envd.get("tree", "?")
    calls = [l for l in read(os.path.join(out, "calls.txt")).splitlines() if l]
    head += "- commands (UTC): %s\n" % ("; ".join(calls) if calls else "`%s`" % envd.get("command", "bench/scale.sh"))
    head += "- mpirun: %s; NCCL_NVLS_ENABLE=%s (NVLink multicast off)\n" % (
        envd.get("mpirun", "mpirun"), envd.get("NCCL_NVLS_ENABLE", "?"))
    for k in ("driver", "nvcc", "torch"):
        if k in envd:
            head += "- %s: %s\n" % (k, envd[k])
    head += "\n## Against issue 10's targets\n\n| measure | target | result | met |\n|---|---|---|---|\n"
    head += "".join("| %s | %s | %s | %s |\n" % t for t in targets)
    if not targets:
        head += "| – | – | nothing was measured | – |\n"
    tail = "" if not (notes or problems) else "\n## Notes\n\n" + "".join("- %s\n" % n for n in notes + problems)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(head + "\n" + "\n".join(md_parts) + tail)
    print("scale_report: wrote %s" % os.path.join(out, "summary.md"))
    for p in problems:
        print("scale_report: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
