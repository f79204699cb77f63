"""How often enqueues wake a live worker, and how soon it claims: pgbench clients enqueue (each transaction one
SELECT enqueue_workflow(...)) into a queue one worker process serves, at the rates given; a listener counts the
NOTIFYs the doorbells send. For each run: tps, pgbench's transaction latency, NOTIFYs per enqueue, and
enqueue->claim p50/p90/p99 from the rows' own timestamps (created_at -> started_at, the database's clock).

Usage: .venv/bin/python bench/rings.py [CLIENTS@RATE ...] [--seconds T] [--concurrency C] [--url URL]
       [--results FILE]
       (RATE: transactions a second over all clients, or max; default 1@50 8@100 8@300 32@600 8@1000 8@max)
env PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import JOBS_QUEUE, Results, WorkerProcess, build, connect, drop_schema, ensure_database
from pgdurable import channels

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/pgdurable_bench"
DEFAULT_RUNS = ["1@50", "8@100", "8@300", "32@600", "8@1000", "8@max"]


class NotifyCounter:
    """Counts the NOTIFYs for ``queue`` on the schema's work channel while in use."""

    def __init__(self, url: str, schema: str, queue: str) -> None:
        self.url, self.schema, self.queue = url, schema, queue
        self.count = 0
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="notify-counter", daemon=True)

    def __enter__(self) -> NotifyCounter:
        self._thread.start()
        if not self._listening.wait(30):
            raise RuntimeError("the NOTIFY counter did not start listening")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _listen(self) -> None:
        with connect(self.url, self.schema) as conn:
            conn.execute(channels.listen(self.schema, "work"))
            self._listening.set()
            while not self._stop.is_set():
                for notice in conn.notifies(timeout=0.1):
                    if notice.payload == self.queue:
                        self.count += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", default=DEFAULT_RUNS)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64, help="the worker's slots")
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--results")
    args = parser.parse_args()
    results = Results(args.results)
    figures: dict[str, dict[str, float]] = {}
    ensure_database(args.url)
    schema = f"bench_{secrets.token_hex(4)}"
    bench = build(args.url, schema)
    bench.app.migrate()
    script = Path(tempfile.mkdtemp(prefix="pgdurable-rings-")) / "enqueue.sql"
    qualified = sql.Identifier(schema).as_string(None)
    script.write_text(f"SELECT {qualified}.enqueue_workflow('job', '{{\"i\": 1}}', '{JOBS_QUEUE}');\n")
    worker = WorkerProcess(args.url, schema, JOBS_QUEUE, args.concurrency)
    try:
        with NotifyCounter(args.url, schema, JOBS_QUEUE) as notifies:
            time.sleep(3)  # the worker started and asleep on the queue
            for run in args.runs:
                clients, rate = run.split("@")
                before = notifies.count
                with connect(args.url, schema) as conn:
                    started = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
                out = subprocess.run(
                    ["pgbench", "-n", "-c", clients, "-j", str(min(int(clients), 2)), "-T", str(args.seconds),
                     "-f", str(script), *([] if rate == "max" else ["-R", rate]), args.url],
                    capture_output=True, text=True, check=True).stdout
                tps = float(re.search(r"^tps = ([0-9.]+)", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
                latency = re.search(r"latency average = ([0-9.]+)", out).group(1)  # type: ignore[union-attr]
                time.sleep(0.5)  # the last enqueues claimed, their NOTIFYs heard
                worker.check()
                with connect(args.url, schema) as conn:
                    p50, p90, p99 = conn.execute(
                        "SELECT percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP"
                        " (ORDER BY extract(epoch FROM started_at - created_at) * 1000)"
                        " FROM workflow_executions WHERE started_at IS NOT NULL AND created_at >= %s",
                        (started,)).fetchone()[0]  # type: ignore[index]
                sent = notifies.count - before
                figures[run] = {"tps": tps, "notifies_per_enqueue": sent / (tps * args.seconds),
                                "claim_p50_ms": p50, "claim_p90_ms": p90, "claim_p99_ms": p99}
                print(f"{clients:>3} clients at {rate:>5}/s: {tps:6.0f} tps, latency avg {latency} ms, {sent} NOTIFYs"
                      f" = {sent / (tps * args.seconds):.3f} per enqueue; enqueue->claim p50 {p50:.2f}"
                      f" p90 {p90:.2f} p99 {p99:.2f} ms", flush=True)
                time.sleep(1)
    finally:
        worker.stop()
        bench.app.close()
        drop_schema(args.url, schema)
    results["rings"] = figures
    results.save()


if __name__ == "__main__":
    main()
