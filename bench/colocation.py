"""Commit -> start latency of a workflow enqueued inside the caller's own transaction.

One worker process (`python -m pgdurable worker bench.colocation:app`) serves a fresh schema of the benchmark
database. This process holds one plain psycopg connection; each transaction on it inserts an order into an
application table and enqueues a one-line workflow for it, then commits, and time.time() is taken right
after the commit returns. The workflow's first line takes time.time() and returns it. The latency is the
second minus the first (both processes run on this machine): how long after the caller's commit the
workflow is running, which is NOTIFY at commit, claim, and dispatch to a workflow thread.

Two ways of enqueuing, each --n times, one transaction every --interval seconds (open loop), after a few
warm-up transactions that are not counted:

  py   app.enqueue(workflow, order_id, workflow_id=..., conn=conn)
  sql  SELECT <schema>.enqueue_workflow('colo.started', '{"order_id": ...}', workflow_id => ...), as psql or
       any other driver would send it

Usage, from the repository root:
    .venv/bin/python bench/colocation.py [-n 200] [--interval 0.02] [-c 4] [--url URL]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench; created if missing)

The run's schemas (the engine's, and <schema>_app for the orders) are dropped at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgdurable import App, Workflow

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/pgdurable_bench"
REPO = Path(__file__).resolve().parent.parent
WORKFLOW = "colo.started"
WARMUP = 10


def build(url: str, schema: str) -> tuple[App, Workflow[[int], float]]:
    """The App the worker serves, with its one workflow. Builds no connection."""
    app = App(url, schema=schema)

    @app.workflow(name=WORKFLOW)
    def started(order_id: int) -> float:
        return time.time()  # the first line of the body: when the workflow is running

    return app, started


# What `python -m pgdurable worker bench.colocation:app` serves; this script sets both variables for it.
app, started = build(os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL),
                     os.environ.get("PGDURABLE_BENCH_SCHEMA", "colocation_bench"))


def ensure_database(url: str) -> None:
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
        dbname = conninfo_to_dict(url)["dbname"]
        with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(dbname))))


class WorkerProcess:
    """`python -m pgdurable worker bench.colocation:app`, logging to a temporary file."""

    def __init__(self, url: str, schema: str, concurrency: int) -> None:
        env = {**os.environ, "PGDURABLE_BENCH_URL": url, "PGDURABLE_BENCH_SCHEMA": schema}
        fd, self.log = tempfile.mkstemp(prefix="pgdurable-bench-colocation-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgdurable", "worker", "bench.colocation:app", "--concurrency", str(concurrency)],
            cwd=REPO, env=env, stdout=fd, stderr=subprocess.STDOUT)
        os.close(fd)

    def check(self) -> None:
        if self.proc.poll() is not None:
            log = Path(self.log).read_text(errors="replace")
            raise RuntimeError(f"worker {self.proc.pid} exited with {self.proc.returncode}; log:\n{log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode == 0:
            os.unlink(self.log)
        else:
            print(f"colocation  (worker {self.proc.pid} exited with {self.proc.returncode}; log kept at {self.log})",
                  file=sys.stderr)


def wait_until(predicate: Callable[[], bool], worker: WorkerProcess, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        worker.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def count(conn: psycopg.Connection[Any], query: sql.Composed, params: tuple[Any, ...]) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def finished(conn: psycopg.Connection[Any], done: sql.Composed, ids: list[str]) -> bool:
    return count(conn, done, (ids,)) == len(ids)


def run_mode(mode: str, client: App, workflow: Workflow[[int], float], url: str, schema: str,
             orders: sql.Composable, n: int, interval: float, first_order: int) -> tuple[dict[str, float], list[float]]:
    """``n`` transactions of INSERT order + enqueue + COMMIT, one every ``interval`` seconds. Returns the
    time.time() right after each commit, by workflow id, and how long each transaction took (seconds)."""
    enqueue_sql = sql.SQL("SELECT {}.enqueue_workflow(%s, %s::jsonb, workflow_id => %s)").format(
        sql.Identifier(schema))
    insert = sql.SQL("INSERT INTO {} (id, mode) VALUES (%s, %s)").format(orders)
    committed: dict[str, float] = {}
    took: list[float] = []
    with psycopg.connect(url) as conn:  # a plain connection: not autocommit, the application's own settings
        next_at = time.monotonic()
        for i in range(n):
            order_id = first_order + i
            workflow_id = f"{mode}-{order_id}"
            begin = time.perf_counter()
            conn.execute(insert, (order_id, mode))
            if mode == "py":
                client.enqueue(workflow, order_id, workflow_id=workflow_id, conn=conn)
            else:
                conn.execute(enqueue_sql, (WORKFLOW, json.dumps({"order_id": order_id}), workflow_id))
            conn.commit()
            committed[workflow_id] = time.time()
            took.append(time.perf_counter() - begin)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    return committed, took


def pct(values: list[float], q: float) -> float:
    """values[int(n * q)] of the sorted values, as bench/throughput.py and the anchors pick."""
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200, help="measured enqueues per mode (default 200)")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between transactions (default 0.02)")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="worker concurrency (default 4)")
    parser.add_argument("--modes", default="py,sql", help="comma-separated: py, sql (default both)")
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL),
                        help="database URL (env PGDURABLE_BENCH_URL; created if missing)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"py", "sql"}:
        parser.error("--modes takes py and/or sql")

    ensure_database(args.url)
    schema = f"colo_{secrets.token_hex(4)}"
    app_schema = f"{schema}_app"
    orders = sql.Identifier(app_schema, "orders")
    client, workflow = build(args.url, schema)
    worker: WorkerProcess | None = None
    print(f"colocation  setup: {args.url} schema {schema}, worker concurrency {args.concurrency}, "
          f"{args.n} transactions per mode every {args.interval * 1000:.0f} ms (+{WARMUP} warm-up), "
          f"python {sys.version.split()[0]}", flush=True)
    try:
        client.migrate()
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(app_schema)))
            conn.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, mode text NOT NULL, "
                                 "created_at timestamptz NOT NULL DEFAULT now())").format(orders))
        worker = WorkerProcess(args.url, schema, args.concurrency)
        with psycopg.connect(args.url, autocommit=True) as db:
            workers = sql.SQL("SELECT count(*) FROM {}.workers WHERE pid = %s").format(sql.Identifier(schema))
            wait_until(lambda: count(db, workers, (worker.proc.pid,)) > 0, worker, 60, "the worker to register")
            done = sql.SQL("SELECT count(*) FROM {}.workflow_executions WHERE id = ANY(%s) AND status = 'succeeded'"
                           ).format(sql.Identifier(schema))
            outputs = sql.SQL("SELECT id, output FROM {}.workflow_executions WHERE id = ANY(%s)").format(
                sql.Identifier(schema))
            first_order = 0
            for mode in modes:
                warm, _ = run_mode(mode, client, workflow, args.url, schema, orders, WARMUP, args.interval,
                                   first_order)
                first_order += WARMUP
                committed, took = run_mode(mode, client, workflow, args.url, schema, orders, args.n,
                                           args.interval, first_order)
                first_order += args.n
                ids = list(committed)
                expected = ids + list(warm)
                wait_until(functools.partial(finished, db, done, expected), worker, 30,
                           f"the {mode} workflows to finish")
                began: dict[str, Any] = dict(db.execute(outputs, (ids,)).fetchall())
                latency = [(float(began[i]) - committed[i]) * 1000 for i in ids]
                stored = count(db, sql.SQL("SELECT count(*) FROM {} WHERE mode = %s").format(orders), (mode,))
                assert stored == args.n + WARMUP, f"{stored} orders stored for {mode}"
                how = "app.enqueue(..., conn=conn)" if mode == "py" else f"SELECT {schema}.enqueue_workflow(...)"
                print(f"colocation  {mode:<3} {how}: n={len(ids)}, commit->start p50 {pct(latency, 0.5):.2f} ms, "
                      f"p99 {pct(latency, 0.99):.2f} ms, max {max(latency):.2f} ms (min {min(latency):.2f} ms); "
                      f"INSERT+enqueue+COMMIT p50 {pct(took, 0.5) * 1000:.2f} ms", flush=True)
    finally:
        if worker is not None:
            worker.stop()
        client.close()
        with psycopg.connect(args.url, autocommit=True) as conn:
            for name in (app_schema, schema):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
