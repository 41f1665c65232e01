#!/usr/bin/env python3
"""The sacrebleu package as the oracle of `tessera eval --bleu` (src/tessera/infer/bleu.h).

  bleu_oracle.py --tessera BIN --workdir DIR

For every corpus below (random and real-looking sentences: punctuation, numbers, HTML entities, Unicode letters,
digits, punctuation, symbols and spaces of every kind, empty lines, one to four references, no match at all,
identical corpora, short segments without 3- and 4-grams) and every tokenizer (13a, intl, none), case kept and
lowercased: tessera's JSON must equal sacrebleu's BLEU(...).corpus_score on the same lines: the score to 1e-9
(and as printed, to 0.01), the counts, totals, lengths, verbose score and signature, and exact match as counted here.

Exit 77 (a skip) where sacrebleu is missing, unless TESSERA_REQUIRE_HF=1.
"""
import argparse
import json
import os
import random
import subprocess
import sys

try:
    import sacrebleu
    from sacrebleu.metrics import BLEU
except ImportError as e:
    if os.environ.get("TESSERA_REQUIRE_HF") == "1":
        print(f"FAIL: TESSERA_REQUIRE_HF=1 but {e} (with {sys.executable}; run scripts/install_deps.sh)")
        sys.exit(1)
    print(f"SKIP: {e}")
    sys.exit(77)

# The release tessera's C++ reproduces (bleu.h's kSacreBleuVersion): its signature names it.
PINNED = "2.4.3"

WORDS = ("the cat sat on mat a dog ran to house it is not what we said they were here "
         "Peter's don't U.S. e.g. naïve café Zürich straße Σοφία Москва 東京 مرحبا שלום 😀 ﬁne İstanbul").split()
PUNCT = list(".,;:!?\"'()[]{}<>-/\\&@#$%^*_+=|~`") + ["...", "--", "&amp;", "&quot;", "&lt;", "&gt;", "&#39;",
                                                     "<skipped>", "«", "»", "—", "…", "¿", "¡", "“", "”", "、", "。"]
NUMBERS = ["3", "42", "3.14", "1,000", "1,000.50", "2-3", "10-", "-5", "5.", ".5", "1999.", "٣", "½", "²", "Ⅻ"]
SYMBOLS = ["€", "$", "©", "±", "→", "∑", "°", "♥", "^", "`", "¥"]
SPACES = [" ", " ", " ", "\t", "\u00a0", "\u3000", "\u2009", "\u1680", "\x1c", "\x85", "\u2028", "\x0b", "\r"]


def random_cp(rng):
    # Any code point a UTF-8 line can hold: not a surrogate, a newline or NUL.
    while True:
        cp = rng.choice([rng.randrange(0x20, 0x250), rng.randrange(0x250, 0x3000), rng.randrange(0x3000, 0x110000)])
        if not (0xD800 <= cp <= 0xDFFF):
            return chr(cp)


def sentence(rng, n_tokens, unicode_noise):
    parts = []
    for _ in range(n_tokens):
        r = rng.random()
        if r < 0.55:
            t = rng.choice(WORDS)
        elif r < 0.75:
            t = rng.choice(PUNCT)
        elif r < 0.87:
            t = rng.choice(NUMBERS)
        elif r < 0.93:
            t = rng.choice(SYMBOLS)
        else:
            t = "".join(random_cp(rng) for _ in range(rng.randint(1, 3))) if unicode_noise else rng.choice(WORDS)
        # Glue some tokens to their neighbour, as punctuation is in real text.
        parts.append(t if rng.random() < 0.35 and parts else " " + t)
        if rng.random() < 0.1:
            parts.append(rng.choice(SPACES))
    s = "".join(parts)
    return s.lstrip(" ") if rng.random() < 0.7 else s


def mutate(rng, s):
    toks = s.split(" ")
    out = []
    for t in toks:
        r = rng.random()
        if r < 0.15:
            continue
        if r < 0.3:
            out.append(rng.choice(WORDS))
        elif r < 0.35:
            out += [t, rng.choice(PUNCT)]
        elif r < 0.45:
            # A change of case only, which --lowercase forgives: in every script (ß.upper() is SS, İ.lower() i̇).
            out.append(rng.choice([t.upper(), t.swapcase(), t.capitalize()]))
        else:
            out.append(t)
    if rng.random() < 0.2:
        rng.shuffle(out)
    return " ".join(out)


def corpora():
    rng = random.Random(50)
    cases = []

    def random_corpus(n, n_refs, max_tokens, noise, empty_share=0.05):
        hyps = [sentence(rng, rng.randint(0, max_tokens), noise) if rng.random() > empty_share else ""
                for _ in range(n)]
        refs = [[mutate(rng, h) if rng.random() > empty_share else "" for h in hyps] for _ in range(n_refs)]
        # Some hypotheses equal a reference outright, for exact match.
        for i in range(n):
            if rng.random() < 0.2:
                hyps[i] = refs[rng.randrange(n_refs)][i]
        return hyps, refs

    for k in range(24):
        cases.append((f"random{k}", *random_corpus(rng.randint(1, 40), rng.randint(1, 4), rng.choice([5, 15, 40]),
                                                    noise=k % 2 == 1)))
    real_h = ["The U.S. economy grew 3.5% in 2019, the fastest pace since 2015.",
              "\"It's not what we said,\" she told reporters on Tuesday.",
              "Prices rose from $1,000.50 to $1,200 -- a 20-per-cent jump!",
              "Das Haus (gebaut 1999-2001) steht in Zürich; es ist groß.",
              "",
              "Москва — столица России. Население: 12,6 млн.",
              "東京は日本の首都です。",
              "He said: &quot;yes&quot; &amp; left.<skipped>"]
    real_r = ["The US economy grew by 3.5 % in 2019, its fastest pace since 2015.",
              "\"That is not what we said,\" she told reporters Tuesday.",
              "Prices rose from $1,000.50 to $1,200 - a 20 per cent jump.",
              "Das Haus (gebaut 1999–2001) steht in Zürich; es ist gross.",
              "",
              "Москва - столица России. Население: 12,6 млн.",
              "東京は日本の首都である。",
              "He said \"yes\" & left."]
    cases.append(("real", real_h, [real_r]))
    cases.append(("real_2refs", real_h, [real_r, [mutate(rng, r) for r in real_r]]))
    cases.append(("identical", real_h[:4], [real_h[:4]]))
    cases.append(("identical_multi", real_h, [[mutate(rng, r) for r in real_r], real_h]))
    cases.append(("case_only", ["ÀÉÎ Straße МОСКВА İstanbul ǅemal ΣΟΦΊΑ Ⅻ Ꭰ 𐐀x", "The END"],
                  [["àéî STRASSE москва i̇stanbul ǆemal σοφία ⅻ ꭰ 𐐨x", "the end"]]))
    cases.append(("zero_match", ["alpha beta gamma", "delta"], [["one two three four", "five six"]]))
    cases.append(("all_empty_hyp", ["", ""], [["a b c", "d"]]))
    cases.append(("all_empty", ["", ""], [["", ""]]))
    cases.append(("short_no_4grams", ["a b", "c d e", "f"], [["a b", "c d x", "f"]]))
    cases.append(("one_token", ["word"], [["word"]]))
    cases.append(("hyp_longer", ["the cat the cat the cat sat on the mat"], [["the cat sat"]]))
    cases.append(("ties_refs", ["a b c d e"], [["a b c d"], ["a b c d e f"]]))
    cases.append(("digits_and_dots", ["1.5,2 3-4 a-b 5. .6 x.y z,w 7-"], [["1.5 , 2 3 - 4 a-b 5 . . 6"]]))
    cases.append(("unicode_noise", ["".join(random_cp(rng) for _ in range(200)) for _ in range(20)],
                  [["".join(random_cp(rng) for _ in range(200)) for _ in range(20)]]))
    return cases


def tessera_score(binary, workdir, name, hyps, refs, tok, lowercase):
    hyp_file = os.path.join(workdir, f"{name}.hyp")
    with open(hyp_file, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(h + "\n" for h in hyps))
    args = [binary, "eval", "--bleu", "--json", "--hyp", hyp_file, "--tokenize", tok]
    for k, ref in enumerate(refs):
        ref_file = os.path.join(workdir, f"{name}.ref{k}")
        with open(ref_file, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(r + "\n" for r in ref))
        args += ["--ref", ref_file]
    if lowercase:
        args.append("--lowercase")
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}: {p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if sacrebleu.__version__ != PINNED:
        print(f"FAIL: sacrebleu {sacrebleu.__version__} is installed; tessera reproduces {PINNED} "
              "(scripts/install_deps.sh pins it)")
        return 1
    failures, checked = [], 0
    for name, hyps, refs in corpora():
        for tok in ("13a", "intl", "none"):
            for lowercase in (False, True):
                # Python's str.lower() writes a final sigma where a capital sigma ends a word, which tessera's
                # lowercasing does not (bleu_unicode.h): lowercased cases hold no capital sigma.
                if lowercase:
                    hyps_c = [h.replace("Σ", "S") for h in hyps]
                    refs_c = [[r.replace("Σ", "S") for r in ref] for ref in refs]
                else:
                    hyps_c, refs_c = hyps, refs
                label = f"{name} tok={tok} lowercase={lowercase}"
                bleu = BLEU(tokenize=tok, lowercase=lowercase)
                want = bleu.corpus_score(hyps_c, refs_c)
                sig = str(bleu.get_signature())
                got = tessera_score(args.tessera, args.workdir, f"{name}_{tok}_{int(lowercase)}", hyps_c, refs_c,
                                    tok, lowercase)
                matched = sum(any(h == ref[i] for ref in refs_c) for i, h in enumerate(hyps_c))
                problems = []
                if abs(got["score"] - want.score) > 1e-9:
                    problems.append(f"score {got['score']!r} != {want.score!r}")
                if f"{got['score']:.2f}" != f"{want.score:.2f}":
                    problems.append(f"printed score {got['score']:.2f} != {want.score:.2f}")
                for key, w in (("counts", list(want.counts)), ("totals", list(want.totals)),
                               ("hyp_len", want.sys_len), ("ref_len", want.ref_len),
                               ("verbose_score", want._verbose), ("signature", sig)):
                    if got[key] != w:
                        problems.append(f"{key} {got[key]!r} != {w!r}")
                if got["exact_match"]["matched"] != matched or got["exact_match"]["lines"] != len(hyps_c):
                    problems.append(f"exact match {got['exact_match']} != {matched} of {len(hyps_c)}")
                if problems:
                    failures.append(f"{label}: " + "; ".join(problems))
                checked += 1
    # The corpora must reach both ends of the scale, or the checks above prove less than they say.
    for name, want_score in (("identical", 100.0), ("zero_match", 0.0)):
        got = tessera_score(args.tessera, args.workdir, name + "_end", *[c[1:] for c in corpora()
                                                                         if c[0] == name][0], "13a", False)
        if abs(got["score"] - want_score) > 1e-9:
            failures.append(f"{name}: BLEU {got['score']} where {want_score} is due")
        checked += 1
    for f in failures:
        print("FAIL:", f)
    print(f"bleu_oracle: {checked - len(failures)} of {checked} cases agree with sacrebleu {sacrebleu.__version__}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
