#!/usr/bin/env bash
# The client's share of an enqueue and of a step (bench/client_cpu.py) for two commits, in alternating
# processes (OLD NEW, then NEW OLD, ...), each with the commit's package (a git worktree) and this checkout's
# script; then the medians and the median of the paired differences (OLD - NEW: positive means NEW is
# cheaper). Run on a quiet machine.
#   bench/compare_client_cpu.sh b6576ef HEAD [ROUNDS, default 16]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-16}
base=$(mktemp -d)
out=$base/runs.txt
trap 'git worktree remove --force "$base/old" >/dev/null 2>&1 || true
      git worktree remove --force "$base/new" >/dev/null 2>&1 || true; rm -rf "$base"' EXIT
git worktree add -q --detach "$base/old" "$old"
git worktree add -q --detach "$base/new" "$new"
for r in $(seq "$rounds"); do
  order="old new"
  [ $((r % 2)) = 0 ] && order="new old"
  for side in $order; do
    echo "$r $side $(PYTHONPATH="$base/$side/src" timeout 300 .venv/bin/python bench/client_cpu.py)" >>"$out"
  done
done
.venv/bin/python - "$out" "$old" "$new" <<'EOF'
import json, statistics, sys
runs: dict[str, dict[str, dict[str, float]]] = {}
for line in open(sys.argv[1]):
    r, side, figures = line.split(" ", 2)
    runs.setdefault(r, {})[side] = json.loads(figures)
pairs = [p for p in runs.values() if len(p) == 2]
for key in ("enqueue_cpu_us", "enqueue_wall_us", "step_cpu_us", "step_wall_us"):
    old = [p["old"][key] for p in pairs]
    new = [p["new"][key] for p in pairs]
    diff = statistics.median(p["old"][key] - p["new"][key] for p in pairs)
    print(f"{key}: {sys.argv[2]} {statistics.median(old):.1f}, {sys.argv[3]} {statistics.median(new):.1f}, "
          f"paired median difference {diff:.1f} ({len(pairs)} pairs)")
EOF
