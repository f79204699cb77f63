#!/usr/bin/env bash
# Runs every pgdurable benchmark and prints one markdown table of the figures.
#
# If the anchors' venv exists (${ANCHOR_VENV:-/tmp/anchor-venv}, made by a first ../shared/anchors/run.sh),
# the anchor benchmarks (DBOS Transact, pgqueuer) run first, in this same invocation, and the table shows
# their figures beside ours with ratios where the two measure the same thing. pgbench (if installed) gives
# the single-client commit latency that ms/step is read against (target: ms/step <= 1.6x of it).
#
# Usage: bench/run_all.sh [--small] [--no-anchors] [--no-pgbench] [N]
#   N             workflows in part A and in the anchors (default 2000, as run.sh); jobs are 10 N, as run.sh
#                 gives pgqueuer
#   --small       tiny sizes, to check that everything runs (about half a minute; the figures mean little)
#   --no-anchors  skip the anchors even if their venv exists
#   --no-pgbench  skip pgbench
# env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench; the server's
#      other databases are reached by replacing its database name), PGBENCH_SECONDS (default 10),
#      ANCHOR_VENV, ANCHOR_PG (default: the server of PGDURABLE_BENCH_URL)
# All output, the figures (results.json) and the table (table.md) are kept in a directory under /tmp.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
small=0 anchors=1 use_pgbench=1 N=2000
for arg in "$@"; do
  case "$arg" in
    --small) small=1 ;;
    --no-anchors) anchors=0 ;;
    --no-pgbench) use_pgbench=0 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) N=$arg ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

URL=${PGDURABLE_BENCH_URL:-postgresql://postgres@127.0.0.1:5432/pgdurable_bench}
PG_BASE=${URL%/*}
export PGDURABLE_BENCH_URL=$URL
py=$repo/.venv/bin/python
venv=${ANCHOR_VENV:-/tmp/anchor-venv}
out=$(mktemp -d /tmp/pgdurable-bench.XXXXXX)
results=$out/results.json
failed=()

if [ "$small" = 1 ]; then
  [ "$N" = 2000 ] && N=200
  seconds=${PGBENCH_SECONDS:-1}
  throughput_args=(--steps "$N" --jobs $((N * 10)) --bulk 5000 --bulk-chunk 1000 --backlog 1000 --latency-n 50
                   --single-enqueues 100 --roundtrips 5)
  scale_args=(-n 500 --workers 1,2 --concurrencies 10,1000 --history 10000 --claim-jobs 1000 --explains 5)
  memory_args=(-n 10000 --chunk 2000 --every 2000)
  costs_args=(--rounds 1 --seconds 1 --calls 200 --steps 100 --clients 8)
  rings_args=(--seconds 1 8@300 8@max)
  bloat_args=(--rounds 3 --jobs 300 --keep-seconds 1)
else
  seconds=${PGBENCH_SECONDS:-10}
  throughput_args=(--jobs $((N * 10)))
  scale_args=()
  memory_args=()
  costs_args=()
  rings_args=()
  bloat_args=()
fi

step() {  # step NAME COMMAND...: run, tee the output to $out/NAME.txt, note a failure and go on
  local name=$1; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    failed+=("$name (exit $rc)")
  fi
}

# 1. The anchors, first, in this invocation.
anchor_file=()
if [ "$anchors" = 1 ] && [ -d "$venv" ]; then
  export ANCHOR_PG=${ANCHOR_PG:-$PG_BASE}
  # run.sh passes its environment to run_peers.sh (Absurd, procrastinate), which keeps a venv of its own: so
  # ANCHOR_VENV goes to run.sh alone, and only when it differs from run.sh's default.
  if [ "$venv" = /tmp/anchor-venv ]; then
    step anchors "$repo/../shared/anchors/run.sh" "$N"
  else
    step anchors env ANCHOR_VENV="$venv" "$repo/../shared/anchors/run.sh" "$N"
  fi
  anchor_file=(--anchors "$out/anchors.txt")
elif [ "$anchors" = 1 ]; then
  echo "== anchors: skipped ($venv does not exist; run ../shared/anchors/run.sh once to create it)"
fi

# 2. pgbench: one-row INSERT commits from 1 and from 32 clients, on a scratch database.
pgbench_files=()
if [ "$use_pgbench" = 1 ] && command -v pgbench >/dev/null; then
  scratch=pgdurable_pgbench_scratch
  psql "$PG_BASE/postgres" -qc "DROP DATABASE IF EXISTS $scratch" -c "CREATE DATABASE $scratch" >/dev/null
  trap 'psql "$PG_BASE/postgres" -qc "DROP DATABASE IF EXISTS $scratch" >/dev/null 2>&1' EXIT
  echo 'INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, CURRENT_TIMESTAMP);' \
    > "$out/insert.sql"
  step pgbench-init pgbench -i -q "$PG_BASE/$scratch"
  step pgbench-c1 pgbench -n -c 1 -T "$seconds" -f "$out/insert.sql" "$PG_BASE/$scratch"
  step pgbench-c32 pgbench -n -c 32 -j 2 -T "$seconds" -f "$out/insert.sql" "$PG_BASE/$scratch"
  psql "$PG_BASE/postgres" -qc "DROP DATABASE IF EXISTS $scratch" >/dev/null
  pgbench_files=(--pgbench-c1 "$out/pgbench-c1.txt" --pgbench-c32 "$out/pgbench-c32.txt")
elif [ "$use_pgbench" = 1 ]; then
  echo "== pgbench: skipped (not installed)"
fi

# 3. Ours, one after the other.
cd "$repo"
# Sync 3-step workflows (like the DBOS anchor) on a worker with 64 slots; step-less jobs as async handlers
# with 256 slots (like pgqueuer's async entrypoints). Light-load latency does not depend on the slots.
step throughput "$py" bench/throughput.py "$N" -c 64 --parts ABCEFL "${throughput_args[@]}" --results "$results"
step jobs "$py" bench/throughput.py "$N" -c 256 --kind async --parts D "${throughput_args[@]}" --results "$results"
step throughput-threads "$py" bench/throughput.py "$N" -c 64 --parts A --enqueue-threads 4 --results "$results"
step costs "$py" bench/costs.py "${costs_args[@]}" --results "$results"
step rings "$py" bench/rings.py "${rings_args[@]}" --results "$results"
step scale "$py" bench/scale.py "${scale_args[@]}" --results "$results"
step memory "$py" bench/memory.py "${memory_args[@]}" --results "$results"
# Autovacuum on for its run if the server has it off (this machine's CI configuration does), then restored;
# its naptime at 10 s (docs/reliability.md recommends a lower naptime for this churn): at the default 60 s,
# 40 rounds (about 4 minutes) see four or five passes, too few for the verdict to read a plateau (2026-12-03:
# 1.05x-1.24x in 40 rounds at 60 s). 80 rounds (about 9 minutes): the steps' index filled up to round 40 of a
# 110-round run at 10 s and stayed flat after, so 40 rounds read its last growth as 1.16x.
step bloat "$py" bench/bloat.py --enable-autovacuum --autovacuum-naptime 10 --rounds 80 "${bloat_args[@]}" \
  --results "$results"

echo
"$py" bench/report.py --results "$results" "${anchor_file[@]}" "${pgbench_files[@]}" | tee "$out/table.md"
echo
echo "(all output in $out)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
