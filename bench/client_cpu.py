"""The client's share of an enqueue and of a step, for comparing two versions of the package side by side.

One process: ``app.enqueue`` N times, one at a time, into a queue no worker serves (after 300 to warm up),
then one workflow of K sequential steps run in this process (``app.start``). Prints one JSON line, in
microseconds: the enqueue's wall time and the calling thread's CPU time (``time.thread_time``); the step's
wall time and the process's CPU time (the workflow thread's, and the event loop's ticker).
bench/compare_client_cpu.sh runs it for two commits in alternating processes and reads the pairs: the
client's CPU is what a change in the Python path moves, and its wall time moves with the machine.

Usage: .venv/bin/python bench/client_cpu.py [N] [K]   (default 3000 3000; PYTHONPATH picks the package)
env PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import DEFAULT_URL, IDLE_QUEUE, build, drop_schema, ensure_database


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    url = os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL)
    ensure_database(url)
    schema = f"client_{secrets.token_hex(4)}"
    bench = build(url, schema)
    app = bench.app
    job, many = bench.flows["sync"]["job"], bench.flows["sync"]["many"]
    try:
        app.migrate()
        for i in range(300):
            app.enqueue(job, i, queue=IDLE_QUEUE)
        cpu, wall = time.thread_time(), time.perf_counter()
        for i in range(n):
            app.enqueue(job, i, queue=IDLE_QUEUE)
        enqueue_wall, enqueue_cpu = (time.perf_counter() - wall) / n * 1e6, (time.thread_time() - cpu) / n * 1e6
        app.start(many, 10).result()
        cpu, wall = _process_cpu(), time.perf_counter()
        app.start(many, k).result()
        step_wall, step_cpu = (time.perf_counter() - wall) / k * 1e6, (_process_cpu() - cpu) / k * 1e6
        print(json.dumps({"enqueue_wall_us": enqueue_wall, "enqueue_cpu_us": enqueue_cpu,
                          "step_wall_us": step_wall, "step_cpu_us": step_cpu}))
    finally:
        app.close()
        drop_schema(url, schema)


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
