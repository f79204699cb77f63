#!/usr/bin/env bash
# Queued workflows (A) and the enqueue->result round trip (C) of bench/throughput.py, for each commit given,
# each run twice, with this checkout's benchmark script and the commit's package (a git worktree): for finding
# where a latency or throughput change came in. Run commits interleaved (A B A B) on a quiet machine.
#   bench/compare_commits.sh fafb9b6 HEAD fafb9b6 HEAD
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)/tree
out=$(mktemp)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true; rm -f "$out"' EXIT
for rev in "$@"; do
  git worktree remove --force "$tree" >/dev/null 2>&1 || true
  git worktree add -q --detach "$tree" "$rev"
  line="$rev:"
  for _ in 1 2; do
    PYTHONPATH="$tree/src" timeout 300 .venv/bin/python bench/throughput.py 1000 --parts AC --roundtrips 400 >"$out" 2>&1
    rt=$(grep -oE "round trip.*p50 [0-9.]+ ms" "$out" | grep -oE "p50 [0-9.]+" | cut -d' ' -f2)
    call=$(grep "C detail" "$out" | grep -oE "enqueue call p50 [0-9.]+" | grep -oE "[0-9.]+$")
    claim=$(grep "C detail" "$out" | grep -oE "enqueue->claim \(db clock\) p50 [0-9.]+" | grep -oE "[0-9.]+$")
    claim90=$(grep "C detail" "$out" | grep -oE "enqueue->claim \(db clock\) p50 [0-9.]+ ms p90 [0-9.]+" | grep -oE "[0-9.]+$")
    run=$(grep "C detail" "$out" | grep -oE "claim->completed p50 [0-9.]+" | grep -oE "[0-9.]+$")
    seen=$(grep "C detail" "$out" | grep -oE "result seen p50 [0-9.]+" | grep -oE "[0-9.]+$")
    rates=$(grep -oE "enqueue [0-9]+/s, [0-9]+ workflows/s" "$out")
    line="$line [C round trip p50 $rt ms: enqueue call $call, enqueue->claim $claim (p90 $claim90), claim->completed $run, completed->seen $seen; A $rates]"
  done
  echo "$line"
done
