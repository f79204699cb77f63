"""What queue policies cost: drain throughput of the same backlog under each policy, with several worker
processes claiming at once, and a check that each limit held.

For each scenario, J step-less async jobs (bench.throughput's ``job_async``) are enqueued on a queue of
their own with enqueue_many, the queue's policy is stored, and W worker processes of concurrency C drain
it. Throughput is jobs/s from the first claim to the last completion (database timestamps). Scenarios:

  plain      no policy (the fast claim path)
  global     a global concurrency limit of --limit running at once (SKIP LOCKED slot semaphore)
  keyed      key_concurrency 1 over --keys tenants (concurrency_key set on each job)
  rated      a rate limit of --rate starts per second (reported against the expected J / rate seconds)

Usage, from the repository root:
    .venv/bin/python bench/policies.py [--jobs J] [--workers W] [-c C] [--limit L] [--keys K] [--rate R]
        [--scenarios plain,global,keyed,rated] [--url URL]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import (
    CpuMeter,
    Pending,
    WorkerProcess,
    add_common_arguments,
    connect,
    drain_span,
    drop_schema,
    enqueue_chunks,
    setup,
)

# The most executions of a queue that ran at once: +1 at each start, -1 at each completion, a running
# sum in time order (an end at the same instant as a start counts first). %(key)s: per concurrency key.
MAX_RUNNING = """
    SELECT coalesce(max(running), 0) FROM (
        SELECT sum(delta) OVER (PARTITION BY CASE WHEN %(per_key)s THEN concurrency_key END
                                ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS running
        FROM (SELECT concurrency_key, started_at AS at, 1 AS delta FROM workflow_executions
              WHERE queue = %(queue)s
              UNION ALL
              SELECT concurrency_key, completed_at, -1 FROM workflow_executions WHERE queue = %(queue)s) e
    ) r"""


def max_running(url: str, schema: str, queue: str, per_key: bool) -> int:
    with connect(url, schema) as conn:
        row = conn.execute(MAX_RUNNING, {"queue": queue, "per_key": per_key}).fetchone()
    return int(row[0]) if row else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    parser.add_argument("--limit", type=int, default=32, help="global concurrency limit (default 32)")
    parser.add_argument("--keys", type=int, default=100, help="tenants in the keyed scenario (default 100)")
    parser.add_argument("--rate", type=int, default=1000, help="starts per second in the rated scenario")
    parser.add_argument("--scenarios", default="plain,global,keyed,rated")
    add_common_arguments(parser)
    args = parser.parse_args()
    bench = setup(parser, args)
    app, flow = bench.app, bench.flows["async"]["job"]
    results: dict[str, float] = {}
    try:
        for scenario in args.scenarios.split(","):
            queue = f"p_{scenario}"
            if scenario == "global":
                app.queue(queue, concurrency=args.limit)
            elif scenario == "keyed":
                app.queue(queue, key_concurrency=1)
            elif scenario == "rated":
                app.queue(queue, rate_limit=args.rate, rate_period=1.0)
            app.apply_queue_policies()
            ids = [f"{scenario}-{i}" for i in range(args.jobs)]
            enqueue_chunks(app, flow, [(i,) for i in range(args.jobs)], ids, 1000, queue=queue)
            if scenario == "keyed":  # enqueue_many takes no per-row keys: set them before the workers start
                with connect(args.url, args.schema) as conn:
                    conn.execute("UPDATE workflow_executions SET concurrency_key = 'tenant-' || (seq %% %s) "
                                 "WHERE queue = %s", (args.keys, queue))
            pending = Pending(args.url, args.schema)
            workers = [WorkerProcess(args.url, args.schema, queue, args.concurrency) for _ in range(args.workers)]
            try:
                meter = CpuMeter(workers[0].pid)
                t0 = time.time()
                pending.wait_empty(queue, workers)
                cpu = meter.line(scenario, time.time() - t0)
            finally:
                for worker in workers:
                    worker.stop()
                pending.close()
            drain, done, total = drain_span(args.url, args.schema, f"{scenario}-%")
            assert done == total == args.jobs, f"{scenario}: {done} of {total} succeeded"
            rate = done / drain
            results[scenario] = rate
            peak = max_running(args.url, args.schema, queue, per_key=False)
            peak_key = max_running(args.url, args.schema, queue, per_key=True)
            check = {"global": f"max running {peak} (limit {args.limit})",
                     "keyed": f"max running per tenant {peak_key} (limit 1), max running {peak}",
                     "rated": f"expected >= {args.jobs / args.rate:.2f} s at {args.rate}/s",
                     "plain": f"max running {peak}"}[scenario]
            print(f"policies {scenario:<6} J={args.jobs} W={args.workers} C={args.concurrency}: "
                  f"{rate:,.0f} jobs/s (drain {drain:.2f} s); {check}", flush=True)
            print(f"  {cpu}", flush=True)
            if scenario == "global":
                assert peak <= args.limit, f"global limit broken: {peak} > {args.limit}"
            if scenario == "keyed":
                assert peak_key <= 1, f"per-key limit broken: {peak_key}"
        if "plain" in results:
            for scenario, rate in results.items():
                if scenario != "plain":
                    print(f"policies {scenario}: {rate / results['plain']:.2f}x the plain queue's throughput")
    finally:
        if not args.keep_schema:
            drop_schema(args.url, args.schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
