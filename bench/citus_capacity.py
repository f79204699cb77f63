"""pgdurable's capacity on a single-node PostgreSQL and on a Citus cluster, measured the same way, one table
(docs/scale-out.md, "Capacity").

For each database, in a fresh schema (migrated as `pgdurable migrate` would: on a Citus coordinator, in whatever
layout migrate chooses there; the table says which), dropped at the end:

  enqueue 1     app.enqueue one at a time from T client threads (default 4), on a queue no worker serves:
                enqueues/s
  enqueue many  app.enqueue_many in calls of 1,000 step-less workflows, no worker: workflows/s
  claim         the worker's own claim statement (LIMIT 1), timed from here, on a backlog of step-less jobs:
                p50 and p90 ms per statement
  drain         N three-step workflows enqueued first, then W worker processes at concurrency C start on them:
                workflows/s (and steps/s) from the first claim to the last completion (database timestamps)
  round trip    enqueue -> result of a one-step workflow through an idle worker, R times: p50 ms

Usage, from the repository root (a cluster: .ci/citus/cluster.sh start):
    .venv/bin/python bench/citus_capacity.py [--single URL] [--citus URL] [-n N] [--workers W] [-c C]
        [--threads T] [--enqueues E] [--bulk B] [--claims K] [--roundtrips R] [--rounds N]
    defaults: --single postgresql://postgres@127.0.0.1:5432/pgdurable_bench (created if missing),
              --citus postgresql://postgres@127.0.0.1:9700/postgres (cluster.sh's coordinator)

The two databases are measured in turn, --rounds times (default 3), and the table shows each figure's median.
Every figure shares the machine with everything else on it: on one machine the cluster's three servers share
its cores, so the comparison shows what the coordinator hop costs, not what more machines would add.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg

if __package__ in (None, ""):  # run as a script: make the repository root importable, as the workers do
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import (
    BULK_QUEUE,
    IDLE_QUEUE,
    JOBS_QUEUE,
    WORK_QUEUE,
    Bench,
    Pending,
    WorkerProcess,
    build,
    connect,
    drain_span,
    drop_schema,
    enqueue_chunks,
    ensure_database,
    pct,
    step_count,
    wait_all,
)
from pgdurable import citus, store

SINGLE_URL = "postgresql://postgres@127.0.0.1:5432/pgdurable_bench"
CITUS_URL = "postgresql://postgres@127.0.0.1:9700/postgres"


@dataclass
class Figures:
    label: str
    layout: str
    enqueue_one: float  # per second, all threads together
    enqueue_many: float  # workflows per second
    claim_p50_ms: float
    claim_p90_ms: float
    drain_wf: float  # workflows per second
    drain_steps: float
    roundtrip_p50_ms: float


def layout_of(url: str, schema: str) -> str:
    """The server, and where the schema's tables live: (Citus) on the coordinator, or distributed over how many
    shards."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT split_part(current_setting('server_version'), ' ', 1)").fetchone()
        server = f"PostgreSQL {row[0] if row else '?'}"
        if not citus.installed(conn):
            return server
        row = conn.execute(
            "SELECT count(DISTINCT p.logicalrelid), count(s.shardid) FROM pg_dist_partition p "
            "JOIN pg_class c ON c.oid = p.logicalrelid LEFT JOIN pg_dist_shard s ON s.logicalrelid = p.logicalrelid "
            "WHERE c.relnamespace = %s::regnamespace AND p.partmethod = 'h'", (schema,)).fetchone()
        tables, shards = row if row else (0, 0)
        nodes = conn.execute("SELECT citus_version(), count(*) FROM pg_dist_node WHERE noderole = 'primary' "
                             "AND shouldhaveshards GROUP BY 1").fetchone()
    version = str(nodes[0]).split()[1].rstrip(",") if nodes else "?"
    where = f"{tables} tables distributed over {shards} shards" if tables else "tables on the coordinator"
    return f"{server}, Citus {version}, {nodes[1] if nodes else 0} worker nodes, {where}"


def enqueue_one(bench: Bench, threads: int, total: int) -> float:
    app, flow = bench.app, bench.flows["sync"]["job"]
    app.enqueue(flow, 0, queue=IDLE_QUEUE)  # warm-up: the pool opens

    def run(k: int) -> None:
        for i in range(k, total, threads):
            app.enqueue(flow, i, workflow_id=f"one-{i}", queue=IDLE_QUEUE)

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(threads)))
    return total / (time.perf_counter() - t)


def enqueue_many(bench: Bench, total: int) -> float:
    app, flow = bench.app, bench.flows["sync"]["job"]
    enqueue_chunks(app, flow, [(i,) for i in range(100)], None, 100, queue=BULK_QUEUE)  # warm-up
    t = time.perf_counter()
    enqueue_chunks(app, flow, [(i,) for i in range(total)], None, 1000, queue=BULK_QUEUE)
    return total / (time.perf_counter() - t)


def claim_latency(bench: Bench, url: str, schema: str, claims: int) -> tuple[float, float]:
    """The claim statement of a worker (LIMIT 1) on a backlog of ``claims`` jobs: (p50, p90) in ms."""
    app, flow = bench.app, bench.flows["sync"]["job"]
    enqueue_chunks(app, flow, [(i,) for i in range(claims)], [f"claim-{i}" for i in range(claims)], 1000)
    ids = [f"claim-{i}" for i in range(claims)]
    took = []
    with connect(url, schema) as conn:
        # On the distributed layout a claim names its bucket (as the producer's do): claim i in the bucket of
        # job i, so that no claim finds its bucket empty. A single node claims in the whole queue.
        buckets: dict[str, int | None] = dict.fromkeys(ids)
        if citus.buckets(conn, schema) is not None:
            store.calls.remember_schema(conn, schema, citus=True)
            buckets.update(store.run(conn, store.claims.buckets_of(ids)))
        calls = [store.claims.claim(queue=JOBS_QUEUE, names=app.registry.names(), owner="capacity", lease=3600.0,
                                    limit=1, version=app.version, adopt=app.settings.adopt_after_seconds,
                                    bucket=buckets[i]) for i in ids]
        for claim in calls:
            t = time.perf_counter()
            got = store.run(conn, claim)
            took.append(time.perf_counter() - t)
            assert len(got) == 1, "the backlog ran out"
    took = sorted(took[1:])  # the first: a new session's catalog caches
    return pct(took, .5) * 1e3, pct(took, .9) * 1e3


def drain(bench: Bench, url: str, schema: str, n: int, workers: int, concurrency: int) -> tuple[float, float]:
    """N three-step workflows enqueued first, drained by fresh worker processes: (workflows/s, steps/s)."""
    flow = bench.flows["sync"]["three"]
    enqueue_chunks(bench.app, flow, [(i, 0.0) for i in range(n)], [f"drain-{i}" for i in range(n)], 1000)
    pending = Pending(url, schema)
    procs = [WorkerProcess(url, schema, WORK_QUEUE, concurrency) for _ in range(workers)]
    try:
        pending.wait_empty(WORK_QUEUE, procs)
    finally:
        for proc in procs:
            proc.stop()
        pending.close()
    seconds, done, total = drain_span(url, schema, "drain-%")
    steps = step_count(url, schema, "drain-%")
    assert done == total == n and steps == 3 * n, f"drain: {done} of {n} succeeded, {steps} steps"
    return n / seconds, steps / seconds


def roundtrip(bench: Bench, url: str, schema: str, times: int) -> float:
    app, flow = bench.app, bench.flows["sync"]["one"]
    worker = WorkerProcess(url, schema, WORK_QUEUE, 4)
    try:
        wait_all([app.enqueue(flow, 0, time.time())], worker)  # warm-up: the worker is up
        took = []
        for i in range(times):
            t = time.perf_counter()
            wait_all([app.enqueue(flow, i, time.time())], worker)
            took.append(time.perf_counter() - t)
    finally:
        worker.stop()
    return statistics.median(took) * 1e3


def measure(label: str, url: str, args: argparse.Namespace) -> Figures:
    schema = f"capacity_{secrets.token_hex(4)}"
    ensure_database(url)
    bench = build(url, schema)
    bench.app.db.pool_size = max(bench.app.db.pool_size, args.threads + 1)
    bench.app.migrate()
    try:
        layout = layout_of(url, schema)
        print(f"{label}: {url}, schema {schema}, {layout}", flush=True)
        one = enqueue_one(bench, args.threads, args.enqueues)
        print(f"  enqueue one at a time ({args.threads} threads): {one:.0f}/s", flush=True)
        many = enqueue_many(bench, args.bulk)
        print(f"  enqueue_many: {many:.0f} workflows/s", flush=True)
        p50, p90 = claim_latency(bench, url, schema, args.claims)
        print(f"  claim (LIMIT 1): p50 {p50:.2f} ms, p90 {p90:.2f} ms", flush=True)
        wf, steps = drain(bench, url, schema, args.n, args.workers, args.concurrency)
        print(f"  drain: {wf:.0f} workflows/s, {steps:.0f} steps/s", flush=True)
        rt = roundtrip(bench, url, schema, args.roundtrips)
        print(f"  round trip: p50 {rt:.1f} ms", flush=True)
    finally:
        bench.app.close()
        drop_schema(url, schema)
    return Figures(label, layout, one, many, p50, p90, wf, steps, rt)


def cell(rounds: list[Figures], name: str, digits: int) -> str:
    """The median of a figure over the rounds, and its range when there were several."""
    values = sorted(float(getattr(r, name)) for r in rounds)
    text = f"{statistics.median(values):,.{digits}f}"
    return text if len(values) == 1 else f"{text} ({values[0]:,.{digits}f}-{values[-1]:,.{digits}f})"


def table(databases: list[list[Figures]], args: argparse.Namespace) -> str:
    """One column per database: medians over its rounds, their range in parentheses."""
    lines = [f"| | {' | '.join(f'{r[0].label}: {r[0].layout}' for r in databases)} |",
             "|---|" + "---:|" * len(databases)]

    def line(name: str, field: str, digits: int) -> None:
        lines.append(f"| {name} | {' | '.join(cell(rounds, field, digits) for rounds in databases)} |")

    line(f"enqueue, one at a time ({args.threads} threads), /s", "enqueue_one", 0)
    line("enqueue_many (calls of 1,000), workflows/s", "enqueue_many", 0)
    line("claim statement (LIMIT 1), p50 ms", "claim_p50_ms", 2)
    line("claim statement (LIMIT 1), p90 ms", "claim_p90_ms", 2)
    line(f"drain of {args.n:,} queued 3-step workflows ({args.workers} workers x C={args.concurrency}), "
         "workflows/s", "drain_wf", 0)
    line("enqueue -> result round trip, one-step workflow, p50 ms", "roundtrip_p50_ms", 1)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", default=SINGLE_URL, help="single-node PostgreSQL (database created if missing)")
    parser.add_argument("--citus", default=CITUS_URL, help="the coordinator of a Citus cluster")
    parser.add_argument("-n", type=int, default=3000, help="three-step workflows drained (default 3000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes draining (default 2)")
    parser.add_argument("-c", "--concurrency", type=int, default=16, help="their concurrency (default 16)")
    parser.add_argument("--threads", type=int, default=4, help="client threads enqueuing one at a time (default 4)")
    parser.add_argument("--enqueues", type=int, default=2000, help="one-at-a-time enqueues (default 2000)")
    parser.add_argument("--bulk", type=int, default=20_000, help="workflows enqueued with enqueue_many (default 20000)")
    parser.add_argument("--claims", type=int, default=500, help="claim statements timed (default 500)")
    parser.add_argument("--roundtrips", type=int, default=50, help="round trips timed (default 50)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, the two databases in turn (default 3); the table shows medians")
    args = parser.parse_args(argv)
    single: list[Figures] = []
    cluster: list[Figures] = []
    for n in range(args.rounds):  # in turn, so that a busy moment of the machine hits both alike
        print(f"round {n + 1} of {args.rounds}", flush=True)
        single.append(measure("single node", args.single, args))
        cluster.append(measure("Citus", args.citus, args))
    print()
    print(f"medians of {args.rounds} rounds (their range)")
    print(table([single, cluster], args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
