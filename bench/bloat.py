"""Bloat under steady churn: do pgdurable's tables stop growing when executions keep arriving, running and
being deleted by retention? (Issue #13, target 4: "the table's bloat bounded".)

In a fresh schema of the benchmark database (dropped at the end), one worker process (concurrency C) serves
the work queue. Each round enqueues J three-step workflows (one ``enqueue_many`` call), waits until the worker
has run them all, then deletes what finished more than K seconds ago with the engine's retention
(``app.cleanup``, the statements the leader's automatic retention runs). After a few rounds the number of
rows stays about the same: J x (K / round time) executions, three step outputs each. Every row of
workflow_executions is written four times on its way (insert, claim, completion, delete), none of them HOT,
so the space they leave is reclaimed only by VACUUM: autovacuum, with the per-table settings migrate gives
the tables (sql/schema.sql: vacuum at 1% dead rows, index cleanup on every pass).

After each round it records, from the catalog and pg_stat_user_tables: the size of each table and of its
indexes, live and dead rows, and how many (auto)vacuums ran; and the round's drain rate. The verdict compares
the largest size of the last third of the rounds with the largest of the middle third (the first third is the
warm-up, while the kept history fills): within 1.10x is called bounded.

Autovacuum must be on, as in production. This machine's CI configuration turns it off server-wide; with
--enable-autovacuum the script turns it on for its run (ALTER SYSTEM, reload; a superuser) and restores the
previous setting at the end; --autovacuum-naptime S does the same for the server's autovacuum_naptime (60 s
by default: how often autovacuum looks at each database). --vacuum-each-round runs VACUUM (ANALYZE) on the
two tables after each round instead (a bound on what autovacuum can reach, for comparison).

Usage, from the repository root:
    .venv/bin/python bench/bloat.py [--rounds R] [--jobs J] [--keep-seconds K] [-c C] [--enable-autovacuum]
        [--autovacuum-naptime S] [--vacuum-each-round] [--url URL] [--results FILE]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench)
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

if __package__ in (None, ""):  # run as a script: make the repository root importable, as the workers do
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import server_settings
from bench.throughput import (
    DEFAULT_URL,
    WORK_QUEUE,
    Pending,
    Results,
    WorkerProcess,
    build,
    connect,
    drop_schema,
    enqueue_chunks,
    ensure_database,
)

TABLES = ("workflow_executions", "operation_outputs")
BOUNDED = 1.10

SIZES = """
SELECT t.relname, pg_relation_size(t.relid), pg_indexes_size(t.relid), t.n_dead_tup, t.autovacuum_count
FROM pg_stat_user_tables t
WHERE t.schemaname = %s AND t.relname = ANY (%s)
"""

INDEX_SIZES = """
SELECT i.indexrelname, pg_relation_size(i.indexrelid)
FROM pg_stat_user_indexes i
WHERE i.schemaname = %s AND i.relname = ANY (%s)
ORDER BY 1
"""


class TableSize(NamedTuple):
    heap: int  # bytes
    indexes: int  # bytes
    dead: int  # dead row versions
    autovacuums: int  # autovacuum runs so far


@dataclass
class Round:
    number: int
    rows: int  # executions in the table after the round's retention
    drain_per_s: float
    tables: dict[str, TableSize]
    indexes: dict[str, int]  # bytes


def measure(conn: psycopg.Connection[Any], schema: str) -> tuple[dict[str, TableSize], dict[str, int]]:
    conn.execute("SELECT pg_stat_clear_snapshot()")  # read this moment's counters, not the first read's
    tables = {r[0]: TableSize(*(int(v) for v in r[1:])) for r in conn.execute(SIZES, (schema, list(TABLES)))}
    indexes = {r[0]: int(r[1]) for r in conn.execute(INDEX_SIZES, (schema, list(TABLES)))}
    return tables, indexes


def mb(n: float) -> str:
    return f"{n / 1048576:.1f}"


def set_server(url: str, name: str, value: str | None) -> None:
    """Set (None: reset) a server-wide setting for the run; autovacuum and its naptime need no restart."""
    server_settings.reload(url, name, value)
    time.sleep(1.0)  # the postmaster and the autovacuum launcher read the file on SIGHUP


def thirds(series: list[Any]) -> tuple[list[Any], list[Any]]:
    """The middle and the last third of the rounds (the first is the warm-up, while the kept history fills)."""
    third = max(1, len(series) // 3)
    return series[third:2 * third] or series, series[2 * third:] or series


def verdict(series: list[int]) -> tuple[float, str]:
    """Largest of the last third over the largest of the middle third."""
    middle, last = thirds(series)
    ratio = max(last) / max(max(middle), 1)
    return ratio, ("bounded" if ratio <= BOUNDED else "GROWING")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=5000, help="three-step workflows per round")
    parser.add_argument("--keep-seconds", type=float, default=30.0, help="retention: keep what finished since")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("--enable-autovacuum", action="store_true",
                        help="turn autovacuum on for the run if the server has it off (restored after)")
    parser.add_argument("--autovacuum-naptime", type=int, metavar="S",
                        help="autovacuum_naptime for the run, in seconds (server-wide; restored after)")
    parser.add_argument("--vacuum-each-round", action="store_true",
                        help="VACUUM the two tables after each round instead of relying on autovacuum")
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--results")
    args = parser.parse_args()
    ensure_database(args.url)
    results = Results(args.results)

    changed: list[str] = []  # server settings to reset at the end
    if server_settings.current(args.url, "autovacuum") != "on" and args.enable_autovacuum:
        set_server(args.url, "autovacuum", "on")
        changed.append("autovacuum")
    if args.autovacuum_naptime is not None:
        set_server(args.url, "autovacuum_naptime", f"{args.autovacuum_naptime}s")
        changed.append("autovacuum_naptime")
    if server_settings.current(args.url, "autovacuum") != "on" and not args.vacuum_each_round:
        sys.exit("autovacuum is off on this server: pass --enable-autovacuum (or --vacuum-each-round)")
    mode = ("VACUUM after each round" if args.vacuum_each_round
            else f"autovacuum (naptime {server_settings.current(args.url, 'autovacuum_naptime')})")

    schema = f"bloat_{secrets.token_hex(4)}"
    bench = build(args.url, schema)
    app, flow = bench.app, bench.flows["sync"]["three"]
    app.migrate()
    conn = connect(args.url, schema)
    worker = WorkerProcess(args.url, schema, WORK_QUEUE, args.concurrency)
    pending = Pending(args.url, schema)
    rounds: list[Round] = []
    print(f"bloat: {args.rounds} rounds of {args.jobs} three-step workflows, retention keeps {args.keep_seconds:g} s, "
          f"one worker C={args.concurrency}, {mode}; schema {schema}", flush=True)
    print("round  rows  drain/s  executions MB (heap+indexes)  dead  steps MB (heap+indexes)  autovacuums",
          flush=True)
    try:
        for number in range(1, args.rounds + 1):
            now = time.time()
            items = [(i, now) for i in range(args.jobs)]
            started = time.time()
            enqueue_chunks(app, flow, items, None, 5000)
            ended = pending.wait_empty(WORK_QUEUE, [worker], interval=0.05)
            drain = args.jobs / (ended - started)
            app.cleanup(args.keep_seconds)
            if args.vacuum_each_round:
                for table in TABLES:
                    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
            row = conn.execute("SELECT count(*) FROM workflow_executions").fetchone()
            assert row is not None
            tables, indexes = measure(conn, schema)
            rounds.append(Round(number, int(row[0]), drain, tables, indexes))
            e, s = tables["workflow_executions"], tables["operation_outputs"]
            print(f"{number:5d} {row[0]:6d} {drain:8.0f}  {mb(e.heap):>6} + {mb(e.indexes):<6}              "
                  f"{e.dead:6d}  {mb(s.heap):>6} + {mb(s.indexes):<6}          {e.autovacuums}/{s.autovacuums}",
                  flush=True)
    finally:
        worker.stop()
        pending.conn.close()
        conn.close()
        app.close()
        drop_schema(args.url, schema)
        for name in changed:
            set_server(args.url, name, None)
            print(f"({name} back to the server's setting: {server_settings.current(args.url, name)})", flush=True)

    print("\nlargest size of the last third of the rounds / largest of the middle third "
          f"(bounded: <= {BOUNDED:.2f}x):")
    series = {
        "executions heap": [r.tables["workflow_executions"].heap for r in rounds],
        "executions indexes": [r.tables["workflow_executions"].indexes for r in rounds],
        "steps heap": [r.tables["operation_outputs"].heap for r in rounds],
        "steps indexes": [r.tables["operation_outputs"].indexes for r in rounds],
        "rows kept": [r.rows for r in rounds],
    }
    for label, values in series.items():
        ratio, word = verdict(values)
        last_value = f"{values[-1]} rows" if label == "rows kept" else f"{mb(values[-1])} MB"
        print(f"  {label:20s} {ratio:5.2f}x  {word}  (last round {last_value})")
        results[f"bloat.{label.replace(' ', '_')}_ratio"] = ratio
    first, last = rounds[len(rounds) // 3], rounds[-1]
    executions, steps = last.tables["workflow_executions"], last.tables["operation_outputs"]
    print(f"space per execution kept, at the end: {(executions.heap + executions.indexes) / max(last.rows, 1):.0f} "
          f"B in workflow_executions, {(steps.heap + steps.indexes) / max(last.rows, 1):.0f} B in "
          "operation_outputs (heap and indexes)")
    results["bloat.rounds"] = len(rounds)
    results["bloat.mode"] = mode
    results["bloat.bytes_per_execution"] = (executions.heap + executions.indexes) / max(last.rows, 1)
    print("each index of the two tables, at the end of the first third and at the end (MB):")
    for name in sorted(last.indexes):
        print(f"  {name:45s} {mb(first.indexes.get(name, 0)):>7} -> {mb(last.indexes[name]):>7}")
    middle, last_third = thirds([r.drain_per_s for r in rounds])
    print(f"drain rate, median of the middle third {statistics.median(middle):.0f}/s, "
          f"of the last third {statistics.median(last_third):.0f}/s")
    results.save()


if __name__ == "__main__":
    main()
