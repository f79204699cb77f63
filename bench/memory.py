"""pgdurable memory benchmark: does one long-running worker process keep a flat resident set?

One worker process (`python -m pgdurable worker bench.throughput:app --queue jobs`) runs N (default
200,000) step-less workflows (--steps 1: one step each), enqueued with app.enqueue_many in chunks of
--chunk (default 10,000). The worker starts idle and its VmRSS is read from /proc/PID/status; then two
chunks are enqueued, and one more whenever less than a chunk is left, so the worker never runs dry. Every
~--every (default 10,000) completions the worker's VmRSS is read again. It prints the samples, first
(idle), last and max, and the growth from the first sample after warm-up (--every completions) to the last.

A fresh schema per run, dropped at the end, in the benchmark database (created if missing).

Usage, from the repository root:
    .venv/bin/python bench/memory.py [-n N] [--chunk K] [--every E] [-c C] [--kind sync|async] [--steps 0|1]
        [--url URL] [--results FILE]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg

if __package__ in (None, ""):  # run as a script: make the repository root importable, as the workers do
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import (
    JOBS_QUEUE,
    CpuMeter,
    Pending,
    Results,
    WorkerProcess,
    add_common_arguments,
    drain_span,
    drop_schema,
    enqueue_chunks,
    rss_kb,
    setup,
)


def table_health(url: str, schema: str) -> str:
    """Size, live and dead tuples, and autovacuum runs of the engine's two big tables."""
    parts = []
    with psycopg.connect(url) as conn:
        for table in ("workflow_executions", "operation_outputs"):
            row = conn.execute(
                "SELECT pg_total_relation_size(c.oid), s.n_live_tup, s.n_dead_tup, s.autovacuum_count "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE n.nspname = %s AND c.relname = %s",
                (schema, table)).fetchone()
            if row:
                size, live, dead, vacuums = row
                parts.append(f"{table} {size / 1048576:.1f} MB, {live} live, {dead} dead, "
                             f"{vacuums} autovacuums")
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200_000, help="workflows run by the worker (default 200000)")
    parser.add_argument("--chunk", type=int, default=10_000, help="workflows per enqueue_many call (default 10000)")
    parser.add_argument("--every", type=int, default=10_000,
                        help="sample the worker's RSS every this many completions (default 10000)")
    parser.add_argument("-c", "--concurrency", type=int, default=16, help="worker concurrency (default 16)")
    parser.add_argument("--kind", choices=("sync", "async"), default="sync", help="workflow flavour (default sync)")
    parser.add_argument("--steps", type=int, choices=(0, 1), default=0, help="steps per workflow (default 0)")
    parser.add_argument("--poll", type=float, default=0.25,
                        help="seconds between counts of the unfinished workflows (default 0.25)")
    add_common_arguments(parser)
    args = parser.parse_args()
    n, chunk, every = args.n, args.chunk, args.every
    bench = setup(parser, args)
    flow = bench.flows[args.kind]["job1" if args.steps else "job"]
    results = Results(args.results)
    print(f"pgdurable   setup: {args.url} schema {args.schema}, python {sys.version.split()[0]}; {n} "
          f"{args.kind} workflows with {args.steps} steps, C={args.concurrency}, chunks of {chunk}", flush=True)

    enqueued = 0

    def enqueue_next() -> None:
        nonlocal enqueued
        k = min(chunk, n - enqueued)
        enqueue_chunks(bench.app, flow, [(i,) for i in range(enqueued, enqueued + k)],
                       [f"m-{i}" for i in range(enqueued, enqueued + k)], chunk)
        enqueued += k

    samples: list[tuple[int, float, int]] = []  # (completions, seconds since the first claim, VmRSS kB)
    pending = Pending(args.url, args.schema)
    worker = None
    try:
        worker = WorkerProcess(args.url, args.schema, JOBS_QUEUE, args.concurrency)
        pending.wait_workers(1, [worker])
        time.sleep(0.5)
        rss, _ = rss_kb(worker.pid)
        samples.append((0, 0.0, rss))
        print(f"pgdurable   memory: {0:>8} done, idle worker, VmRSS {rss / 1024:7.1f} MB", flush=True)
        print(f"pgdurable   tables before: {table_health(args.url, args.schema)}", flush=True)
        meter = CpuMeter(worker.pid)
        t0 = time.time()
        enqueue_next()
        if enqueued < n:
            enqueue_next()
        next_sample = every
        while True:
            left = pending.count(JOBS_QUEUE)
            done = enqueued - left
            if done >= next_sample:
                rss, _ = rss_kb(worker.pid)
                samples.append((done, time.time() - t0, rss))
                print(f"pgdurable   memory: {done:>8} done, {time.time() - t0:7.1f} s, VmRSS {rss / 1024:7.1f} MB; "
                      f"{table_health(args.url, args.schema)}", flush=True)
                next_sample = (done // every + 1) * every
            if done >= n:
                break
            if enqueued < n and left < chunk:
                enqueue_next()
                continue
            worker.check()
            time.sleep(args.poll)
        wall = time.time() - t0
        cpu = meter.line("memory", wall)
        print(f"pgdurable   tables after: {table_health(args.url, args.schema)}", flush=True)
        rss, hwm = rss_kb(worker.pid)
        if samples[-1][0] < n:
            samples.append((n, wall, rss))
    finally:
        if worker is not None:
            worker.stop()
        pending.close()
    try:
        drain, succeeded, total = drain_span(args.url, args.schema, "m-%")
        assert succeeded == total == n, f"{succeeded} of {n} succeeded"
    finally:
        bench.app.close()
        if not args.keep_schema:
            drop_schema(args.url, args.schema)

    values = [s[2] for s in samples]
    warm = next((s[2] for s in samples if s[0] >= every), values[0])
    growth = (values[-1] - warm) / warm * 100
    print(f"pgdurable memory: one worker ran {n} {args.kind} workflows ({args.steps} steps) at "
          f"{n / drain:.0f}/s; VmRSS first {values[0] / 1024:.1f} MB (idle), after {every} "
          f"{warm / 1024:.1f} MB, last {values[-1] / 1024:.1f} MB, max {max(values) / 1024:.1f} MB "
          f"(VmHWM {hwm / 1024:.1f} MB); growth after warm-up {growth:+.1f}%", flush=True)
    print(cpu, flush=True)
    print("samples (completions: VmRSS MB): " + ", ".join(f"{d}: {r / 1024:.1f}" for d, _, r in samples))
    results["memory.n"] = n
    results["memory.rss_first_mb"] = values[0] / 1024
    results["memory.rss_warm_mb"] = warm / 1024
    results["memory.rss_last_mb"] = values[-1] / 1024
    results["memory.rss_max_mb"] = max(values) / 1024
    results["memory.growth_pct"] = growth
    results["memory.wf_per_s"] = n / drain
    results.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
