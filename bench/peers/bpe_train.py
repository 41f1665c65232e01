#!/usr/bin/env python3
"""The peer of `tessera bench tokenizer-train`: Hugging Face tokenizers' BpeTrainer on the same text.

Peer mode (what the bench runs):
  bpe_train.py --text FILE --vocab-size N --threads T [--special TEXT ...]
trains a byte-level BPE (the ByteLevel pre-tokenizer with GPT-2's regex and no prefix space, the 256 bytes as the
initial alphabet) with Tokenizer.train([FILE]) and prints one JSON line: the seconds of train(), the process's peak
RSS (getrusage) before and after, and the merges as hex byte pairs (bytes_to_unicode undone), so that the bench can
say how many of the first merges agree with tessera's. Hugging Face reads the file line by line and breaks ties by
its own pair order, not CS336's: the merges agree only up to the first tie that the two orders break differently.

Corpus mode:
  bpe_train.py --make-corpus OUT [--mb 100] [--seed 0]
writes a reproducible English corpus of at least MB megabytes: the docstrings (ast.get_docstring of every module,
class and function) of the Python files of the site-packages of this interpreter, of /usr/lib/python3.11 and of
/usr/lib/python3/dist-packages, in sorted path order, cut into paragraphs at blank lines; then paragraphs drawn with
replacement by random.Random(seed) until the size is reached, separated by blank lines. Its distinct pre-tokens are
those of the docstrings (about 23 MB of them on the machine that recorded the results), not of 100 MB of fresh text.
"""
import argparse
import json
import os
import resource
import sys
import time


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


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def peer(args):
    # Read when rayon's pool starts, on the first parallel work: set before tokenizers is imported.
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        import tokenizers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        print(f"tokenizers not installed ({e})")
        return 0
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=0, show_progress=False,
                                  special_tokens=args.special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    before = peak_rss_mib()
    t0 = time.perf_counter()
    tok.train([args.text], trainer)
    seconds = time.perf_counter() - t0
    after = peak_rss_mib()
    model = json.loads(tok.to_str())["model"]
    back = {c: b for b, c in bytes_to_unicode().items()}

    def hexed(s):
        return bytes(back[c] for c in s).hex()

    merges = []
    for m in model["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        merges.append([hexed(a), hexed(b)])
    print(json.dumps({"peer": f"tokenizers {tokenizers.__version__}", "seconds": seconds, "threads": args.threads,
                      "rss_before_mib": before, "peak_rss_mib": after, "vocab": tok.get_vocab_size(),
                      "merges": merges}))
    return 0


def docstrings(roots):
    import ast
    for root in roots:
        paths = []
        for d, dirs, files in os.walk(root):
            dirs.sort()
            paths += [os.path.join(d, f) for f in sorted(files) if f.endswith(".py")]
        for p in paths:
            try:
                with open(p, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    s = ast.get_docstring(node)
                    if s:
                        yield s


def make_corpus(args):
    import random
    import sysconfig
    roots = [os.path.realpath(sysconfig.get_paths()["purelib"]), "/usr/lib/python3.11", "/usr/lib/python3/dist-packages"]
    paragraphs = []
    for s in docstrings([r for r in roots if os.path.isdir(r)]):
        paragraphs += [p.strip() for p in s.split("\n\n") if p.strip()]
    rng = random.Random(args.seed)
    target = int(args.mb * 1e6)
    size = 0
    tmp = args.make_corpus + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for p in paragraphs:  # every paragraph once, then draws
            f.write(p + "\n\n")
            size += len(p.encode()) + 2
        while size < target:
            p = paragraphs[rng.randrange(len(paragraphs))]
            f.write(p + "\n\n")
            size += len(p.encode()) + 2
    os.replace(tmp, args.make_corpus)
    print(f"wrote {args.make_corpus}: {size / 1e6:.1f} MB from {len(paragraphs)} paragraphs", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text")
    ap.add_argument("--vocab-size", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--special", action="append", default=[])
    ap.add_argument("--make-corpus", metavar="OUT")
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.make_corpus:
        return make_corpus(args)
    if not args.text:
        ap.error("--text FILE or --make-corpus OUT")
    return peer(args)


if __name__ == "__main__":
    sys.exit(main())
