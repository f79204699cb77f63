"""What a worker's batch statements cost beside many running executions, by batch size.

A worker writes its checkpoints and completions in batches (write_steps, write_completions,
write_checkpoints; write_step for a batch of one step; the _few forms of the three, planned for a few rows,
for a batch of at most batch_plan.FEW_ROWS). Each write is fenced: it lands only while its
execution is running under the writer's lease, so each statement looks its executions up in
workflow_executions. This measures, for R running executions beside a history of H finished ones, how long
each statement takes for batches of K rows, as the worker's writer runs it: prepared, the plan cache
choosing between custom and generic plans. Each batch runs in a transaction that is
rolled back (by a ROLLBACK psycopg does not see: on one it sees it forgets its prepared statements), so the
same running rows serve every round; the times are the statements' alone, without a commit. It also prints
how the generic plan of a one-row batch reads workflow_executions: by primary key, a write costs the same
however many executions run; through the lease index (a hash join over the running executions, as before
2026-12-05), it costs more the more there are (docs/benchmarks.md, "Batches beside many running
executions").

With --workflows N (and --concurrency C), end to end instead: N async workflows of three steps that each
wait on I/O for 0.2-4 s (drawn at random, seeded), enqueued at once and run by one worker process at
concurrency C, so that C executions run and a few of them write at any moment: workflows/s and the
PostgreSQL server's CPU per workflow.

Usage: .venv/bin/python bench/running.py [--running 1000,10000] [--history 200000] [--sizes 1,2,8,32,500]
       [--rounds 40] [--url URL]
       .venv/bin/python bench/running.py --workflows 12000 --concurrency 4000
env PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import (
    DEFAULT_URL,
    WORK_QUEUE,
    CpuMeter,
    WorkerProcess,
    build,
    connect,
    drop_schema,
    ensure_database,
)
from pgdurable import App, store
from pgdurable.sqlfiles import query

T0 = "2026-01-01T00:00:00+00:00"
STATEMENTS = ("write_step", "write_steps", "write_steps_few", "write_completions", "write_completions_few",
              "write_checkpoints", "write_checkpoints_few")


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
    if name.startswith("write_steps"):
        return {"rows": steps}
    if name.startswith("write_completions"):
        return {"rows": done, "bells": "[]"}
    return {"steps": steps, "completions": done, "bells": "[]"}


def timed(conn: psycopg.Connection[Any], name: str, running: list[tuple[str, int]], size: int,
          rounds: int) -> float:
    """Median ms of ``name`` on batches of ``size`` running executions (a different slice each round)."""
    took = []
    for round_ in range(rounds):
        start = (round_ * size) % max(1, len(running) - size + 1)
        rows = running[start:start + size]
        conn.execute("BEGIN")
        started = time.perf_counter()
        written = conn.execute(query(name), params(name, rows), prepare=True).fetchall()
        took.append(time.perf_counter() - started)
        # Undone by a ROLLBACK psycopg does not see: on one it sees, it forgets its prepared statements, and
        # every round would be planned afresh, unlike the worker's.
        conn.pgconn.exec_(b"ROLLBACK")
        assert len(written) == size * (2 if name.startswith("write_checkpoints") else 1), (name, size, len(written))
    return statistics.median(took[rounds // 4:]) * 1000  # the first quarter: plans settling


def access_path(conn: psycopg.Connection[Any], name: str, rows: list[tuple[str, int]]) -> str:
    """The index (or scan) by which the generic plan of ``name`` reads workflow_executions."""
    text, values = query(name), params(name, rows)
    for i, key in enumerate(values):
        text = text.replace(f"%({key})s", f"${i + 1}")
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE bench_running AS {text}")  # (the parameters' types from the statement)
        with psycopg.ClientCursor(conn) as cursor:
            plan = [line for (line,) in cursor.execute(
                f"EXPLAIN (COSTS OFF) EXECUTE bench_running ({', '.join(['%s'] * len(values))})",
                list(values.values()))]
        conn.execute("DEALLOCATE bench_running")  # (prepared statements outlive the transaction)
    scans = {line.strip().split(" on workflow_executions")[0].removeprefix("->  ").strip()
             for line in plan if " on workflow_executions " in line}
    return "; ".join(sorted(scans))


def end_to_end(url: str, workflows: int, concurrency: int) -> None:
    schema = f"running_{secrets.token_hex(4)}"
    bench = build(url, schema)
    bench.app.migrate()
    draw = random.Random(13)
    worker = WorkerProcess(url, schema, WORK_QUEUE, concurrency)
    try:
        with connect(url, schema) as conn:
            while not conn.execute("SELECT count(*) FROM workers").fetchone()[0]:  # (the worker is up)
                worker.check()
                time.sleep(0.1)
            bench.app.enqueue_many(bench.flows["async"]["io"],
                                   [([round(draw.uniform(0.2, 4.0), 3) for _ in range(3)],)
                                    for _ in range(workflows)])
            meter, started = CpuMeter(worker.pid), time.monotonic()
            while conn.execute("SELECT count(*) FROM workflow_executions WHERE status <> 'succeeded'"
                               ).fetchone()[0]:
                worker.check()
                time.sleep(0.2)
            wall = time.monotonic() - started
            server = meter.postgres_seconds()
        print(f"{workflows:,} workflows of three I/O waits of 0.2-4 s, one worker at C={concurrency}: "
              f"{workflows / wall:,.0f} workflows/s; PostgreSQL CPU {server:.2f} s = "
              f"{server * 1e6 / workflows:,.0f} us a workflow", flush=True)
        print(meter.line("end to end", wall), flush=True)
    finally:
        worker.stop()
        bench.app.close()
        drop_schema(url, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", default="1000,10000", help="running executions, comma-separated")
    parser.add_argument("--history", type=int, default=200_000, help="finished executions beside them")
    parser.add_argument("--sizes", default="1,2,8,32,500", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--workflows", type=int, help="end to end: this many I/O-bound workflows")
    parser.add_argument("--concurrency", type=int, default=4000, help="end to end: the worker's concurrency")
    args = parser.parse_args()
    ensure_database(args.url)
    if args.workflows:
        end_to_end(args.url, args.workflows, args.concurrency)
        return
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
