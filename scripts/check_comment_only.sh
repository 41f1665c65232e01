#!/usr/bin/env bash
# scripts/check_comment_only.sh BASE [FILE ...]
#
# Proves that a branch changed only comments: each C / C++ / CUDA source file that differs from where the branch
# left BASE (git merge-base BASE HEAD, so that BASE's later commits are not counted; or each FILE given) is stripped of its comments by the preprocessor alone (gcc -fpreprocessed: no include is read, no macro
# expanded) on both sides, and the two must be identical, once blank lines and trailing blanks are dropped (a
# reflowed comment moves lines). String literals are kept, so a changed message is a change. Files other than
# source (Markdown, scripts) are listed and not compared. Exit 0 when every source file's code is unchanged, 1 with
# one line per file whose code differs (and its diff), 2 on bad arguments.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/check_comment_only.sh BASE [FILE ...]" >&2
  exit 2
fi
base=$1
shift
git rev-parse --verify --quiet "$base^{commit}" >/dev/null || { echo "check_comment_only: no commit '$base'" >&2; exit 2; }
cd "$(git rev-parse --show-toplevel)"
base=$(git merge-base "$base" HEAD)
if [[ $# -gt 0 ]]; then files=("$@"); else mapfile -t files < <(git diff --name-only "$base" --); fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT

strip() { gcc -w -fpreprocessed -dD -E -P -x c++ - | sed -e 's/[[:space:]]*$//' -e '/^$/d'; }

bad=0 checked=0
for f in "${files[@]}"; do
  case "$f" in
    *.h|*.hpp|*.cpp|*.cc|*.c|*.cu|*.cuh) ;;
    *) echo "not source, not compared: $f"; continue ;;
  esac
  if ! git cat-file -e "$base:$f" 2>/dev/null || [[ ! -f "$f" ]]; then
    echo "$f: added or removed against $base (not a comment-only change)"
    bad=1
    continue
  fi
  if ! diff <(git show "$base:$f" | strip) <(strip <"$f") >"$out"; then
    echo "$f: its code differs from $base:"
    sed 's/^/    /' "$out"
    bad=1
  fi
  checked=$((checked + 1))
done
echo "$checked source files compared against ${base:0:12}: $([[ $bad == 0 ]] && echo 'comments only' || echo 'CODE CHANGED')"
exit $bad
