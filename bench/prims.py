"""Rough figures for debounce and streams, through one worker process.

  debounce  T threads enqueue N times with one debounce key (a burst, debounce_seconds long enough that it
            never fires in the middle), then one last enqueue with debounce_seconds=0: how long the burst
            took, how many executions it made (must be 1), and that it ran with the last arguments.
  stream    one workflow writes V values (time.time() when written, one per small step), a reader in this
            process iterates app.read_stream: write -> read latency p50, p99 (the same machine's clock).

Usage, from the repository root:
    .venv/bin/python bench/prims.py [-n N] [-t T] [-v V] [--url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgdurable
from bench.throughput import WorkerProcess, add_common_arguments, drop_schema, ensure_database, pct

QUEUE = "prims"


def build(url: str, schema: str) -> tuple[pgdurable.App, dict[str, Any]]:
    app = pgdurable.App(url, schema=schema)

    @app.step()
    def pause(seconds: float) -> None:
        time.sleep(seconds)

    @app.workflow(queue=QUEUE)
    def summarize(n: int) -> int:
        return n

    @app.workflow(queue=QUEUE)
    def producer(values: int, gap: float) -> int:
        for _ in range(values):
            pgdurable.write_stream("t", time.time())
            pause(gap)
        pgdurable.close_stream("t")
        return values

    return app, {"summarize": summarize, "producer": producer}


# What the worker process serves (`python -m pgdurable worker bench.prims:app`).
app = build(os.environ.get("PGDURABLE_BENCH_URL", ""), os.environ.get("PGDURABLE_BENCH_SCHEMA", "x"))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--enqueues", type=int, default=1000)
    parser.add_argument("-t", "--threads", type=int, default=16)
    parser.add_argument("-v", "--values", type=int, default=200)
    add_common_arguments(parser)
    args = parser.parse_args()
    args.schema = args.schema or f"bench_prims_{os.getpid()}"
    ensure_database(args.url)
    bench_app, flows = build(args.url, args.schema)
    bench_app.migrate()
    os.environ["PGDURABLE_BENCH_URL"], os.environ["PGDURABLE_BENCH_SCHEMA"] = args.url, args.schema
    worker = WorkerProcess(args.url, args.schema, QUEUE, 16, target="bench.prims:app")
    try:
        summarize = flows["summarize"]
        began = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            ids = set(pool.map(lambda n: bench_app.enqueue(summarize, n, debounce_key="burst",
                                                           debounce_seconds=600).workflow_id, range(args.enqueues)))
        took = time.perf_counter() - began
        last = bench_app.enqueue(summarize, -1, debounce_key="burst", debounce_seconds=0)
        result = last.result(timeout=120)
        made = len(bench_app.list_workflows(name=summarize.name, limit=10))
        print(f"debounce burst: {args.enqueues} enqueues from {args.threads} threads in {took:.2f} s "
              f"({args.enqueues / took:,.0f}/s); executions made: {made} (ids seen: {len(ids)}); ran with the "
              f"last arguments: {result == -1}", flush=True)

        handle = bench_app.enqueue(flows["producer"], args.values, 0.01)
        latencies = [(time.time() - written) * 1000 for written in bench_app.read_stream(handle.workflow_id, "t")]
        handle.result(timeout=120)
        latencies.sort()
        print(f"stream: {len(latencies)} values, write -> reader p50 {pct(latencies, 0.5):.1f} ms, "
              f"p99 {pct(latencies, 0.99):.1f} ms, max {latencies[-1]:.1f} ms", flush=True)
    finally:
        worker.stop()
        bench_app.close()
        if not args.keep_schema:
            drop_schema(args.url, args.schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
