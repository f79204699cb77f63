"""What a worker's batch statements cost beside many running executions, by batch size.

A worker writes its checkpoints and completions in batches (write_steps, write_completions,
write_checkpoints; write_step for a batch of one step). Each write is fenced: it lands only while its
execution is running under the writer's lease, so each statement looks its executions up in
workflow_executions. This measures, for R running executions beside a history of H finished ones, how long
each statement takes for batches of K rows, as the worker runs it: prepared, autocommit, PostgreSQL's plan
cache deciding between custom and generic plans. Each batch runs in a transaction that is rolled back, so
the same running rows serve every round. It also prints how the generic plan of a small batch finds its
executions (the index it reads): a lookup by primary key costs the same however many run; a hash join over
the running executions costs more the more there are (docs/benchmarks.md, "Batches beside many running
executions").

Usage: .venv/bin/python bench/running.py [--running 1000,10000] [--history 200000] [--sizes 1,2,8,32,500]
       [--rounds 40] [--url URL]
env PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import DEFAULT_URL, connect, drop_schema, ensure_database
from pgdurable import App, store
from pgdurable.sqlfiles import query

T0 = "2026-01-01T00:00:00+00:00"
STATEMENTS = ("write_step", "write_steps", "write_completions", "write_checkpoints")


def make_schema(url: str, running: int, history: int) -> tuple[str, list[tuple[str, int]]]:
    """A migrated schema with ``history`` finished executions and ``running`` claimed ones (lease: an hour),
    analyzed as autovacuum would; returns its name and the running executions' (id, attempt)."""
    schema = f"running_{secrets.token_hex(4)}"
    app = App(url, schema=schema)
    try:
        app.migrate()
    finally:
        app.close()
    with connect(url, schema) as conn:
        if history:
            conn.execute("SELECT enqueue_workflow('w', '{}', 'history') FROM generate_series(1, %s)", (history,))
            conn.execute("UPDATE workflow_executions SET status = 'succeeded', output = '1', completed_at = now()"
                         " WHERE queue = 'history'")
        conn.execute("SELECT enqueue_workflow('w', '{}', 'q') FROM generate_series(1, %s)", (running,))
        claimed = store.run(conn, store.claims.claim(queue="q", names=["w"], owner="bench", lease=3600,
                                                     limit=running, version="v"))
        conn.execute("VACUUM ANALYZE workflow_executions")
    return schema, sorted((c.id, c.attempt) for c in claimed)


def params(name: str, rows: list[tuple[str, int]]) -> dict[str, Any]:
    steps = json.dumps([[id, attempt, 0, "s0", 1, T0, {"v": 1}, None] for id, attempt in rows])
    done = json.dumps([[id, attempt, "succeeded", "1", None] for id, attempt in rows])
    if name == "write_step":
        (id, attempt), = rows
        return {"execution_id": id, "attempt": attempt, "step_id": 0, "step_name": "s0", "tries": 1,
                "started_at": T0, "output": '{"v": 1}', "error": None}
    if name == "write_steps":
        return {"rows": steps}
    if name == "write_completions":
        return {"rows": done, "bells": "[]"}
    return {"steps": steps, "completions": done, "bells": "[]"}


def timed(conn: psycopg.Connection[Any], name: str, running: list[tuple[str, int]], size: int,
          rounds: int) -> float:
    """Median ms of ``name`` on batches of ``size`` running executions (a different slice each round)."""
    took = []
    for round_ in range(rounds):
        start = (round_ * size) % max(1, len(running) - size + 1)
        rows = running[start:start + size]
        with conn.transaction(force_rollback=True):
            started = time.perf_counter()
            written = conn.execute(query(name), params(name, rows), prepare=True).fetchall()
            took.append(time.perf_counter() - started)
        assert len(written) == size * (2 if name == "write_checkpoints" else 1), (name, size, len(written))
    return statistics.median(took[rounds // 4:]) * 1000  # the first quarter: plans settling


def access_path(conn: psycopg.Connection[Any], name: str, rows: list[tuple[str, int]]) -> str:
    """The index (or scan) by which the generic plan of ``name`` reads workflow_executions."""
    text, values = query(name), params(name, rows)
    for i, key in enumerate(values):
        text = text.replace(f"%({key})s", f"${i + 1}")
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE bench_running ({', '.join(['text'] * len(values))}) AS {text}")
        with psycopg.ClientCursor(conn) as cursor:
            plan = [line for (line,) in cursor.execute(
                f"EXPLAIN (COSTS OFF) EXECUTE bench_running ({', '.join(['%s'] * len(values))})",
                list(values.values()))]
        conn.execute("DEALLOCATE bench_running")  # (prepared statements outlive the transaction)
    scans = {line.strip().split(" on workflow_executions")[0].removeprefix("->  ").strip()
             for line in plan if " on workflow_executions " in line}
    return "; ".join(sorted(scans))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", default="1000,10000", help="running executions, comma-separated")
    parser.add_argument("--history", type=int, default=200_000, help="finished executions beside them")
    parser.add_argument("--sizes", default="1,2,8,32,500", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL))
    args = parser.parse_args()
    ensure_database(args.url)
    for count in (int(r) for r in args.running.split(",")):
        schema, running = make_schema(args.url, count, args.history)
        try:
            with connect(args.url, schema) as conn:
                print(f"{count:,} running, {args.history:,} finished; ms per statement (median of "
                      f"{args.rounds - args.rounds // 4} rounds), by batch size:", flush=True)
                for size in (int(s) for s in args.sizes.split(",") if int(s) <= count):
                    figures = [f"{name} {timed(conn, name, running, size, args.rounds):.3f}"
                               for name in STATEMENTS if name != "write_step" or size == 1]
                    print(f"  {size:>4} rows: " + ", ".join(figures), flush=True)
                for name in STATEMENTS:
                    print(f"  a batch of one, {name} reads workflow_executions by: "
                          f"{access_path(conn, name, running[:1])}", flush=True)
        finally:
            drop_schema(args.url, schema)


if __name__ == "__main__":
    main()
