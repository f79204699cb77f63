"""How punctual the durable waits are, through one worker process.

  sleep    W workflows each sleep S seconds (durably: suspended, then woken by a worker's timer); the
           lateness is the time from the recorded wake-up to the step after the sleep (both database
           clock times, read back from operation_outputs): p50, p99, max.
  message  W workflows each wait on recv(); this process sends each a message once it is waiting; the
           latency is from just before app.send to the start of the step after the receive
           (time.time() on this machine, recorded by the step).
  fanout   one parent starts K children and gathers their results: seconds from enqueue to result.

Usage, from the repository root:
    .venv/bin/python bench/waits.py [-w W] [-s SECONDS] [-k K] [--url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgdurable
from bench.throughput import WorkerProcess, add_common_arguments, connect, drop_schema, ensure_database, pct

QUEUE = "waits"


def build(url: str, schema: str) -> tuple[pgdurable.App, dict[str, Any]]:
    app = pgdurable.App(url, schema=schema)

    @app.step()
    def now() -> float:
        return time.time()

    @app.workflow(queue=QUEUE)
    def sleeper(seconds: float) -> float:
        pgdurable.sleep(seconds)
        return now()

    @app.workflow(queue=QUEUE)
    def listener() -> float:
        pgdurable.recv("go")
        return now()

    @app.workflow(queue=QUEUE)
    def leaf(i: int) -> int:
        return i

    @app.workflow(queue=QUEUE)
    def parent(k: int) -> int:
        return sum(pgdurable.gather([app.enqueue(leaf, i) for i in range(k)]))

    return app, {"sleeper": sleeper, "listener": listener, "parent": parent}


# What the worker process serves (`python -m pgdurable worker bench.waits:app`).
app = build(os.environ.get("PGDURABLE_BENCH_URL", ""), os.environ.get("PGDURABLE_BENCH_SCHEMA", "x"))[0]


def lateness_ms(url: str, schema: str) -> list[float]:
    """For each sleeper: (completion of the step after the sleep) - (the recorded wake-up), on the database
    clock: the recorded wake-up time is step 0's output, the next step's started_at is when it resumed."""
    with connect(url, schema) as conn:
        rows = conn.execute(
            "SELECT (s.output #>> '{}')::timestamptz, n.started_at FROM operation_outputs s "
            "JOIN operation_outputs n ON n.execution_id = s.execution_id AND n.step_id = 1 "
            "WHERE s.step_name = 'pgdurable.sleep'").fetchall()
    return sorted((started - wake).total_seconds() * 1000 for wake, started in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-w", "--workflows", type=int, default=200)
    parser.add_argument("-s", "--seconds", type=float, default=1.0)
    parser.add_argument("-k", "--children", type=int, default=1000)
    add_common_arguments(parser)
    args = parser.parse_args()
    args.schema = args.schema or f"bench_waits_{os.getpid()}"
    ensure_database(args.url)
    bench_app, flows = build(args.url, args.schema)
    bench_app.migrate()
    os.environ["PGDURABLE_BENCH_URL"], os.environ["PGDURABLE_BENCH_SCHEMA"] = args.url, args.schema
    worker = WorkerProcess(args.url, args.schema, QUEUE, 64, target="bench.waits:app")
    try:
        handles = [bench_app.enqueue(flows["sleeper"], args.seconds) for _ in range(args.workflows)]
        for h in handles:
            h.result(timeout=120)
        late = lateness_ms(args.url, args.schema)
        print(f"waits sleep W={args.workflows} S={args.seconds}: woken late by p50 {pct(late, 0.5):.1f} ms, "
              f"p99 {pct(late, 0.99):.1f} ms, max {late[-1]:.1f} ms (database clock)", flush=True)

        listeners = [bench_app.enqueue(flows["listener"]) for _ in range(args.workflows)]
        latencies = []
        for h in listeners:
            while h.get().status != "waiting":
                time.sleep(0.005)
            sent = time.time()
            bench_app.send(h.workflow_id, None, topic="go")
            latencies.append((h.result(timeout=60) - sent) * 1000)
        latencies.sort()
        print(f"waits message W={args.workflows}: send -> receiver running again p50 {pct(latencies, 0.5):.1f} ms, "
              f"p99 {pct(latencies, 0.99):.1f} ms", flush=True)

        began = time.perf_counter()
        total = bench_app.enqueue(flows["parent"], args.children).result(timeout=600)
        took = time.perf_counter() - began
        assert total == sum(range(args.children))
        print(f"waits fanout K={args.children}: parent with {args.children} children done in {took:.2f} s "
              f"({args.children / took:,.0f} children/s)", flush=True)
    finally:
        worker.stop()
        bench_app.close()
        if not args.keep_schema:
            drop_schema(args.url, args.schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())

