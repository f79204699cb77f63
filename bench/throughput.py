"""pgdurable throughput benchmark, to read beside the anchors in ../shared/anchors (DBOS Transact, pgqueuer).

  A  N queued workflows of three trivial steps (add_one), run by ONE worker process
     (`python -m pgdurable worker bench.throughput:app`); this process only enqueues (app.enqueue, one at a
     time, from --enqueue-threads K threads; default 1 as in dbos_queue.py) and waits. workflows/s and
     steps/s from the first enqueue to the last result; enqueue->start latency as seen by the workflow body
     (time.time() in the workflow minus time.time() just before enqueue, both processes on this machine).
  B  one workflow of S sequential steps, run in this process with app.start: ms/step. Like dbos_steps.py.
  C  enqueue->result round trip of a one-step workflow through the worker, R times in a row: p50, max.
     Like the second half of dbos_steps.py.
  D  J workflows without steps (plain background jobs), enqueued first with app.enqueue_many in batches of
     1000 (as pgqueuer_jobs.py does), then drained by one fresh worker process: jobs/s from its first claim
     to the last completion (database timestamps). Like pgqueuer_jobs.py. The one-at-a-time app.enqueue rate
     is measured separately on a few jobs sent to a queue no worker serves.
  E  bulk enqueue rate: app.enqueue_many of step-less workflows, in calls of 10,000, no worker running.
  F  worker capacity: N three-step workflows enqueued with enqueue_many BEFORE the worker starts, then
     drained by one worker process: workflows/s and steps/s from the first claim to the last completion.
  L  latency at light load: one one-step workflow every 20 ms (open loop), through the worker of A and C:
     enqueue->start p50/p99 (as in A) and enqueue->result round trip p50/p99 (a second thread waits on the
     results).
  K  --together K workflows of --together-steps sequential steps each, enqueued at once, through the worker
     of A and C: steps/s in all and ms/step per workflow (workflows stepping side by side, each waiting for
     its checkpoints: what the worker's group commit must not slow down). Not in the default parts.

Every run uses a fresh schema (dropped at the end) in a benchmark database that is created if missing.

Usage, from the repository root:
    .venv/bin/python bench/throughput.py [N] [-c CONCURRENCY] [--kind sync|async] [--parts ABCDEFLK]
        [--enqueue-threads K] [--steps S] [--roundtrips R] [--jobs J] [--bulk B] [--backlog F]
        [--latency-n L] [--together K] [--together-steps S] [--url URL] [--schema NAME] [--results FILE]
        [--py-spy FILE] [--worker-pgoptions OPTIONS]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench)

The worker processes import this file as the module ``bench.throughput`` and serve its ``app``, configured
from PGDURABLE_BENCH_URL and PGDURABLE_BENCH_SCHEMA, which this script sets for them. bench/scale.py and
bench/memory.py reuse its workflows and helpers.
"""


from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue as queue_module
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgdurable import App

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/pgdurable_bench"
REPO = Path(__file__).resolve().parent.parent
WORK_QUEUE, JOBS_QUEUE = "default", "jobs"
# Queues no worker serves: rows put there only measure the enqueue.
IDLE_QUEUE, BULK_QUEUE = "idle", "bulk"


# ---- the workflows (imported by the worker processes too) ---------------------------------------------------

@dataclass
class Bench:
    app: App
    flows: dict[str, dict[str, Any]]  # kind ("sync" or "async") -> role -> workflow


def build(url: str, schema: str) -> Bench:
    """An App with the benchmark workflows, in a sync and an async flavour. Builds no connection."""
    app = App(url, schema=schema)

    @app.step(name="add_one")
    def add_one(x: int) -> int:
        return x + 1

    @app.step(name="add_one_async")
    async def add_one_async(x: int) -> int:
        return x + 1

    # The start latency is measured on the first line of the body, as in dbos_queue.py, and returned with
    # the result so that it is read back from workflow_executions.output afterwards.
    @app.workflow(name="three_steps", queue=WORK_QUEUE)
    def three_steps(i: int, t_enqueued: float) -> dict[str, float]:
        start_latency = time.time() - t_enqueued
        return {"value": add_one(add_one(add_one(i))), "start_latency": start_latency}

    @app.workflow(name="three_steps_async", queue=WORK_QUEUE)
    async def three_steps_async(i: int, t_enqueued: float) -> dict[str, float]:
        start_latency = time.time() - t_enqueued
        return {"value": await add_one_async(await add_one_async(await add_one_async(i))),
                "start_latency": start_latency}

    @app.workflow(name="one_step", queue=WORK_QUEUE)
    def one_step(i: int, t_enqueued: float) -> dict[str, float]:
        start_latency = time.time() - t_enqueued
        return {"value": add_one(i), "start_latency": start_latency}

    @app.workflow(name="one_step_async", queue=WORK_QUEUE)
    async def one_step_async(i: int, t_enqueued: float) -> dict[str, float]:
        start_latency = time.time() - t_enqueued
        return {"value": await add_one_async(i), "start_latency": start_latency}

    @app.workflow(name="many_steps", queue=WORK_QUEUE)
    def many_steps(n: int) -> int:
        x = 0
        for _ in range(n):
            x = add_one(x)
        return x

    @app.workflow(name="many_steps_async", queue=WORK_QUEUE)
    async def many_steps_async(n: int) -> int:
        x = 0
        for _ in range(n):
            x = await add_one_async(x)
        return x

    @app.workflow(name="job", queue=JOBS_QUEUE)
    def job(i: int) -> None:
        return None

    @app.workflow(name="job_async", queue=JOBS_QUEUE)
    async def job_async(i: int) -> None:
        return None

    # A one-step job on the jobs queue (bench/memory.py --steps 1).
    @app.workflow(name="job_one_step", queue=JOBS_QUEUE)
    def job_one_step(i: int) -> int:
        return add_one(i)

    @app.workflow(name="job_one_step_async", queue=JOBS_QUEUE)
    async def job_one_step_async(i: int) -> int:
        return await add_one_async(i)

    # Three steps that each wait on I/O for as long as told (bench/running.py: many executions running, few
    # of them writing at any moment).
    @app.step(name="wait_io")
    async def wait_io(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @app.workflow(name="io_bound_async", queue=WORK_QUEUE)
    async def io_bound_async(waits: list[float]) -> float:
        return sum([await wait_io(seconds) for seconds in waits])

    return Bench(app, {
        "sync": {"three": three_steps, "one": one_step, "many": many_steps, "job": job,
                 "job1": job_one_step},
        "async": {"three": three_steps_async, "one": one_step_async, "many": many_steps_async,
                  "job": job_async, "job1": job_one_step_async, "io": io_bound_async},
    })


# What `python -m pgdurable worker bench.throughput:app` serves. Building it opens no connection.
app = build(os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL),
            os.environ.get("PGDURABLE_BENCH_SCHEMA", "pgdurable_bench")).app


# ---- helpers ------------------------------------------------------------------------------------------------

def ensure_database(url: str) -> None:
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
        dbname = conninfo_to_dict(url)["dbname"]
        with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(dbname))))


def schema_exists(url: str, schema: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def connect(url: str, schema: str) -> psycopg.Connection[Any]:
    """An autocommit connection with the benchmark schema on its search_path. The caller closes it."""
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    return conn


def query(url: str, schema: str, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connect(url, schema) as conn:
        return conn.execute(text, params).fetchall()


def execute(url: str, schema: str, *statements: str) -> None:
    """Run statements (VACUUM too: autocommit) on one connection."""
    with connect(url, schema) as conn:
        for statement in statements:
            conn.execute(statement)


def claim_statements(args: argparse.Namespace, id_pattern: str) -> int:
    """How many claim statements took these executions: rows claimed together share started_at = now()."""
    (count,), = query(args.url, args.schema,
                      "SELECT count(DISTINCT started_at) FROM workflow_executions WHERE id LIKE %s",
                      (id_pattern,))
    return int(count)


def drain_span(url: str, schema: str, id_pattern: str) -> tuple[float, int, int]:
    """(seconds from the first claim to the last completion, executions succeeded, executions in all) of
    the executions whose id matches, from the database's own timestamps."""
    (first_claim, last_done, done, total), = query(
        url, schema,
        "SELECT extract(epoch FROM min(started_at))::float8, extract(epoch FROM max(completed_at))::float8,"
        "       count(*) FILTER (WHERE status = 'succeeded'), count(*)"
        " FROM workflow_executions WHERE id LIKE %s", (id_pattern,))
    return float(last_done - first_claim), int(done), int(total)


def step_count(url: str, schema: str, id_pattern: str) -> int:
    (count,), = query(url, schema, "SELECT count(*) FROM operation_outputs WHERE execution_id LIKE %s",
                      (id_pattern,))
    return int(count)


def pct(sorted_values: list[float], q: float) -> float:
    """The same pick as the anchors: values[int(n * q)]."""
    return sorted_values[min(int(len(sorted_values) * q), len(sorted_values) - 1)]


class Results:
    """Headline figures by key, merged into a JSON file (``--results``) that bench/report.py turns into the
    table of bench/run_all.sh."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.values: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = value

    def save(self) -> None:
        if not self.path or not self.values:
            return
        merged: dict[str, Any] = {}
        target = Path(self.path)
        if target.exists() and target.read_text().strip():
            merged = json.loads(target.read_text())
        merged.update(self.values)
        target.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def enqueue_chunks(app: App, flow: Any, items: Sequence[tuple[Any, ...]], ids: Sequence[str] | None,
                   chunk: int, queue: str | None = None) -> list[float]:
    """app.enqueue_many in calls of ``chunk`` items; returns the seconds each call took."""
    took = []
    for start in range(0, len(items), chunk):
        t = time.perf_counter()
        app.enqueue_many(flow, items[start:start + chunk],
                         workflow_ids=None if ids is None else ids[start:start + chunk], queue=queue)
        took.append(time.perf_counter() - t)
    return took


class Pending:
    """Unfinished executions of a queue, counted on one connection through the partial indexes (enqueued:
    the claim index; running: the lease index), so polling stays cheap however large the table is."""

    def __init__(self, url: str, schema: str) -> None:
        self.conn = connect(url, schema)

    def count(self, queue: str) -> int:
        row = self.conn.execute(
            "SELECT (SELECT count(*) FROM workflow_executions WHERE status = 'enqueued' AND queue = %(q)s)"
            "     + (SELECT count(*) FROM workflow_executions WHERE status = 'running' AND queue = %(q)s)",
            {"q": queue}).fetchone()
        assert row is not None
        return int(row[0])

    def wait_empty(self, queue: str, workers: Sequence[WorkerProcess], timeout: float = 3600.0,
                   interval: float = 0.2) -> float:
        """Poll until nothing is left on the queue; returns time.time() when seen empty."""
        deadline = time.monotonic() + timeout
        while self.count(queue):
            for worker in workers:
                worker.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"queue {queue} not drained in {timeout:.0f} s")
            time.sleep(interval)
        return time.time()

    def workers(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM workers").fetchone()
        assert row is not None
        return int(row[0])

    def wait_workers(self, n: int, workers: Sequence[WorkerProcess], timeout: float = 60.0) -> None:
        """Until n worker processes have registered (they are about to claim)."""
        deadline = time.monotonic() + timeout
        while self.workers() < n:
            for worker in workers:
                worker.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} workers did not register in {timeout:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        self.conn.close()


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _postgres_cpu() -> dict[int, float]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    cpu = _proc_cpu(int(entry.name))
                    if cpu is not None:
                        found[int(entry.name)] = cpu
            except OSError:
                continue
    return found


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in kB, from /proc/PID/status."""
    found = {"VmRSS:": 0, "VmHWM:": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition("\t") if "\t" in line else line.partition(" ")
        if key in found:
            found[key] = int(rest.split()[0])
    return found["VmRSS:"], found["VmHWM:"]


class CpuMeter:
    """CPU seconds used by the workers, this process and the PostgreSQL server processes over an interval."""

    def __init__(self, worker_pids: int | Sequence[int] | None) -> None:
        self.worker_pids = [worker_pids] if isinstance(worker_pids, int) else list(worker_pids or [])
        self.worker0 = {pid: _proc_cpu(pid) or 0.0 for pid in self.worker_pids}
        self.self0 = sum(os.times()[:2])
        self.pg0 = _postgres_cpu()

    def postgres_seconds(self) -> float:
        return sum(cpu - self.pg0.get(pid, 0.0) for pid, cpu in _postgres_cpu().items())

    def worker_seconds(self) -> list[float]:
        return [(_proc_cpu(pid) or self.worker0[pid]) - self.worker0[pid] for pid in self.worker_pids]

    def line(self, label: str, wall: float) -> str:
        parts = []
        if self.worker_pids:
            used = self.worker_seconds()
            w = sum(used)
            each = f" = {' + '.join(f'{u:.2f}' for u in used)}" if len(used) > 1 else ""
            name = "worker" if len(used) == 1 else f"{len(used)} workers"
            parts.append(f"{name} {w:.2f} s{each} ({w / wall * 100:.0f}% of a core)")
        me = sum(os.times()[:2]) - self.self0
        parts.append(f"client {me:.2f} s ({me / wall * 100:.0f}%)")
        pg = self.postgres_seconds()
        parts.append(f"postgres {pg:.2f} s ({pg / wall * 100:.0f}%)")
        return f"pgdurable   {label} cpu over {wall:.2f} s wall: " + ", ".join(parts) + f" [{os.cpu_count()} cpus]"


class WorkerProcess:
    """`python -m pgdurable worker bench.throughput:app` serving one queue, logging to a temporary file."""

    def __init__(self, url: str, schema: str, queue: str, concurrency: int,
                 target: str = "bench.throughput:app", pgoptions: str | None = None) -> None:
        env = {**os.environ, "PGDURABLE_BENCH_URL": url, "PGDURABLE_BENCH_SCHEMA": schema}
        if pgoptions:  # server settings of the worker's sessions alone (libpq's PGOPTIONS)
            env["PGOPTIONS"] = f"{env.get('PGOPTIONS', '')} {pgoptions}".strip()
        fd, self.log = tempfile.mkstemp(prefix=f"pgdurable-bench-{queue}-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgdurable", "worker", target, "--queue", queue,
             "--concurrency", str(concurrency)],
            cwd=REPO, env=env, stdout=fd, stderr=subprocess.STDOUT)
        os.close(fd)
        self.pid = self.proc.pid

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.pid} exited with {self.proc.returncode}; log:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode == 0:
            os.unlink(self.log)
        else:
            print(f"pgdurable   (worker {self.pid} exited with {self.proc.returncode}; log kept at "
                  f"{self.log})", file=sys.stderr)


def wait_all(handles: list[Any], worker: WorkerProcess | None, timeout: float = 600.0) -> list[Any]:
    results = []
    for handle in handles:
        while True:
            try:
                results.append(handle.result(timeout=10.0))
                break
            except Exception as exc:
                if type(exc).__name__ != "ResultTimeout":
                    raise
                if worker is not None:
                    worker.check()
                timeout -= 10.0
                if timeout <= 0:
                    raise
    return results


class Profiler:
    """py-spy record on the worker while a part runs; stopped with SIGINT, which makes it write its file."""

    def __init__(self, pid: int, output: str | None, extra: str) -> None:
        self.proc = None
        if output:
            spy = Path(sys.executable).parent / "py-spy"
            self.proc = subprocess.Popen([str(spy), "record", "--pid", str(pid), *extra.split(),
                                          "--format", "raw", "-o", output],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # let it attach

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=60)


# ---- the parts ----------------------------------------------------------------------------------------------

def part_a(bench: Bench, args: argparse.Namespace, worker: WorkerProcess, results: Results) -> None:
    app, flow, n, k = bench.app, bench.flows[args.kind]["three"], args.n, args.enqueue_threads
    warm = app.enqueue(flow, 0, time.time())  # warm-up: also waits until the worker is up
    wait_all([warm], worker)

    def enqueue_range(lo: int, hi: int) -> list[Any]:
        return [app.enqueue(flow, i, time.time(), workflow_id=f"a-{i}") for i in range(lo, hi)]

    bounds = [1 + n * t // k for t in range(k + 1)]  # K contiguous slices of 1..N
    profiler = Profiler(worker.pid, args.py_spy, args.py_spy_args)
    meter = CpuMeter(worker.pid)
    t0 = time.time()
    if k == 1:
        handles = enqueue_range(1, n + 1)
    else:
        with ThreadPoolExecutor(max_workers=k, thread_name_prefix="enqueue") as pool:
            slices = [pool.submit(enqueue_range, bounds[t], bounds[t + 1]) for t in range(k)]
            handles = [h for s in slices for h in s.result()]
    t1 = time.time()
    values = wait_all(handles, worker)
    t2 = time.time()
    cpu = meter.line("A", t2 - t0)
    profiler.stop()
    assert [r["value"] for r in values] == [i + 3 for i in range(1, n + 1)], "wrong results"
    # Read the latencies back from the database rather than from the handles' results.
    rows = query(args.url, args.schema,
                 "SELECT (output->>'start_latency')::float8,"
                 "       extract(epoch FROM started_at - created_at)::float8,"
                 "       extract(epoch FROM completed_at - started_at)::float8,"
                 "       (SELECT count(*) FROM operation_outputs o WHERE o.execution_id = e.id)"
                 " FROM workflow_executions e WHERE id LIKE 'a-%%' AND status = 'succeeded'")
    assert len(rows) == n and all(r[3] == 3 for r in rows), "not every workflow recorded three steps"
    claims = claim_statements(args, "a-%")
    lat = sorted(r[0] for r in rows)
    claim = sorted(r[1] for r in rows)
    run = sorted(r[2] for r in rows)
    threads = f" enqueue-threads={k}" if k > 1 else ""
    print(f"pgdurable mode=queue kind={args.kind} C={args.concurrency}{threads} N={n}: "
          f"enqueue {n / (t1 - t0):.0f}/s, "
          f"{n / (t2 - t0):.0f} workflows/s ({3 * n / (t2 - t0):.0f} steps/s), "
          f"enqueue->start p50 {pct(lat, .5) * 1e3:.1f} ms p99 {pct(lat, .99) * 1e3:.1f} ms", flush=True)
    print(f"pgdurable   A detail: enqueue->claim (db clock) p50 {pct(claim, .5) * 1e3:.1f} ms "
          f"p99 {pct(claim, .99) * 1e3:.1f} ms; claim->completed p50 {pct(run, .5) * 1e3:.1f} ms "
          f"p99 {pct(run, .99) * 1e3:.1f} ms; {claims} claim statements (mean batch {n / claims:.1f}); "
          f"enqueue phase {t1 - t0:.2f} s, wall {t2 - t0:.2f} s",
          flush=True)
    print(cpu, flush=True)
    if args.py_spy:
        print(f"pgdurable   A profile of the worker: {args.py_spy}", flush=True)
    key = "A" if k == 1 else f"A{k}"
    results[f"{key}.n"] = n
    results[f"{key}.enqueue_threads"] = k
    results[f"{key}.concurrency"] = args.concurrency
    results[f"{key}.kind"] = args.kind
    results[f"{key}.enqueue_per_s"] = n / (t1 - t0)
    results[f"{key}.wf_per_s"] = n / (t2 - t0)
    results[f"{key}.steps_per_s"] = 3 * n / (t2 - t0)
    results[f"{key}.start_p50_ms"] = pct(lat, .5) * 1e3
    results[f"{key}.start_p99_ms"] = pct(lat, .99) * 1e3


def part_k(bench: Bench, args: argparse.Namespace, worker: WorkerProcess, results: Results) -> None:
    app, flow, k, s = bench.app, bench.flows[args.kind]["many"], args.together, args.together_steps
    wait_all([app.enqueue(flow, 5)], worker)  # warm-up
    t = time.perf_counter()
    values = wait_all([app.enqueue(flow, s) for _ in range(k)], worker)
    dt = time.perf_counter() - t
    assert values == [s] * k, "wrong results"
    print(f"pgdurable {k} workflows together kind={args.kind} ({s} sequential steps each, one worker): "
          f"{k * s / dt:.0f} steps/s in all, {dt / s * 1e3:.3f} ms/step per workflow", flush=True)
    results["K.workflows"] = k
    results["K.steps_per_s"] = k * s / dt


def part_b(bench: Bench, args: argparse.Namespace, results: Results) -> None:
    app, flow, s = bench.app, bench.flows[args.kind]["many"], args.steps
    assert app.start(flow, 10).result(timeout=60) == 10  # warm-up
    meter = CpuMeter(None)
    t = time.perf_counter()
    assert app.start(flow, s).result(timeout=600) == s
    dt = time.perf_counter() - t
    print(f"pgdurable sequential steps kind={args.kind} (app.start, in-process): {s} in {dt:.2f} s = "
          f"{dt / s * 1e3:.3f} ms/step", flush=True)
    print(meter.line("B", dt), flush=True)
    results["B.steps"] = s
    results["B.ms_per_step"] = dt / s * 1e3


def part_c(bench: Bench, args: argparse.Namespace, worker: WorkerProcess, results: Results) -> None:
    app, flow = bench.app, bench.flows[args.kind]["many"]
    wait_all([app.enqueue(flow, 1)], worker)  # warm-up
    lat, enqueue_calls, seen_at = [], [], {}
    for i in range(args.roundtrips):
        t = time.perf_counter()
        handle = app.enqueue(flow, 1, workflow_id=f"c-{i}")
        enqueue_calls.append(time.perf_counter() - t)
        assert wait_all([handle], worker) == [1]
        seen_at[f"c-{i}"] = time.time()
        lat.append(time.perf_counter() - t)
    lat.sort()
    enqueue_calls.sort()
    print(f"pgdurable enqueue->result round trip kind={args.kind} ({args.roundtrips}x, one-step workflow, "
          f"one worker): p50 {pct(lat, .5) * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms", flush=True)
    # Where the time went: the enqueue call (the client's clock); enqueue -> claim -> completion on the
    # database's clock (each timestamp is its transaction's start); then until the waiter had the result
    # (the completion's commit, its NOTIFY, the waiter's wake-up and read; the client's clock against the
    # completion's timestamp, one machine).
    rows = query(args.url, args.schema,
                 "SELECT id, extract(epoch FROM started_at - created_at)::float8,"
                 "       extract(epoch FROM completed_at - started_at)::float8,"
                 "       extract(epoch FROM completed_at)::float8"
                 " FROM workflow_executions WHERE id LIKE 'c-%%'")
    to_claim, to_done = sorted(r[1] for r in rows), sorted(r[2] for r in rows)
    to_seen = sorted(seen_at[r[0]] - r[3] for r in rows)
    print(f"pgdurable   C detail: enqueue call p50 {pct(enqueue_calls, .5) * 1e3:.2f} ms; "
          f"enqueue->claim (db clock) p50 {pct(to_claim, .5) * 1e3:.2f} ms "
          f"p90 {pct(to_claim, .9) * 1e3:.2f} ms p99 {pct(to_claim, .99) * 1e3:.2f} ms max {to_claim[-1] * 1e3:.1f} ms "
          f"({sum(x > 0.02 for x in to_claim)} over 20 ms); "
          f"claim->completed p50 {pct(to_done, .5) * 1e3:.2f} ms "
          f"p90 {pct(to_done, .9) * 1e3:.2f} ms; completed->result seen p50 {pct(to_seen, .5) * 1e3:.2f} ms",
          flush=True)
    results["C.roundtrip_p50_ms"] = pct(lat, .5) * 1e3
    results["C.roundtrip_max_ms"] = lat[-1] * 1e3


def part_d(bench: Bench, args: argparse.Namespace, results: Results) -> None:
    app, flow, j, batch = bench.app, bench.flows[args.kind]["job"], args.jobs, args.jobs_batch
    single = ""
    if args.single_enqueues:  # the one-at-a-time rate, on a queue no worker serves
        app.enqueue(flow, 0, queue=IDLE_QUEUE)  # warm-up
        m = args.single_enqueues
        t = time.perf_counter()
        for i in range(m):
            app.enqueue(flow, i, queue=IDLE_QUEUE)
        single_rate = m / (time.perf_counter() - t)
        single = f", one at a time {single_rate:.0f}/s ({m} jobs)"
        results["D.enqueue_single_per_s"] = single_rate
    ids = [f"d-{i}" for i in range(j)]
    items = [(i,) for i in range(j)]
    t0 = time.perf_counter()
    enqueue_chunks(app, flow, items, ids, batch)
    enqueue_rate = j / (time.perf_counter() - t0)
    pending = Pending(args.url, args.schema)
    t1 = time.time()
    worker = WorkerProcess(args.url, args.schema, JOBS_QUEUE, args.concurrency)
    try:
        meter = CpuMeter(worker.pid)
        t2 = pending.wait_empty(JOBS_QUEUE, [worker])
        cpu = meter.line("D (incl. worker start-up)", t2 - t1)
    finally:
        worker.stop()
        pending.close()
    drain, done, total = drain_span(args.url, args.schema, "d-%")
    claims = claim_statements(args, "d-%")
    assert done == total == j, f"D: {done} of {total} succeeded, {j} enqueued"
    print(f"pgdurable jobs kind={args.kind} C={args.concurrency} N={j}: enqueue {enqueue_rate:.0f}/s "
          f"(enqueue_many, batches of {batch}{single}), drain {done / drain:.0f} jobs/s (first claim -> last "
          f"completion, one worker; done {done})", flush=True)
    print(f"pgdurable   D detail: drain {drain:.2f} s; from worker spawn to queue seen empty {t2 - t1:.2f} s; "
          f"{claims} claim statements (mean batch {j / claims:.1f})",
          flush=True)
    print(cpu, flush=True)
    results["D.jobs"] = j
    results["D.concurrency"] = args.concurrency
    results["D.kind"] = args.kind
    results["D.enqueue_per_s"] = enqueue_rate
    results["D.drain_jobs_per_s"] = done / drain


def part_e(bench: Bench, args: argparse.Namespace, results: Results) -> None:
    app, flow, total, chunk = bench.app, bench.flows[args.kind]["job"], args.bulk, args.bulk_chunk
    enqueue_chunks(app, flow, [(i,) for i in range(100)], None, 100, queue=BULK_QUEUE)  # warm-up
    meter = CpuMeter(None)
    t = time.perf_counter()
    took = enqueue_chunks(app, flow, [(i,) for i in range(total)], None, chunk, queue=BULK_QUEUE)
    dt = time.perf_counter() - t
    cpu = meter.line("E", dt)
    (count,), = query(args.url, args.schema,
                      "SELECT count(*) FROM workflow_executions WHERE queue = %s AND status = 'enqueued'",
                      (BULK_QUEUE,))
    assert count == total + 100, f"E: {count} rows enqueued, expected {total + 100}"
    print(f"pgdurable bulk enqueue kind={args.kind}: {total} step-less workflows with enqueue_many in calls of "
          f"{chunk}: {total / dt:.0f} workflows/s ({dt:.2f} s; per call min {min(took) * 1e3:.0f} ms, "
          f"max {max(took) * 1e3:.0f} ms)", flush=True)
    print(cpu, flush=True)
    # Leave the table as the other parts expect it.
    execute(args.url, args.schema, f"DELETE FROM workflow_executions WHERE queue = '{BULK_QUEUE}'",
            "VACUUM workflow_executions")
    results["E.workflows"] = total
    results["E.chunk"] = chunk
    results["E.enqueue_per_s"] = total / dt


def part_f(bench: Bench, args: argparse.Namespace, results: Results) -> None:
    app, flow, n = bench.app, bench.flows[args.kind]["three"], args.backlog
    t = time.perf_counter()
    enqueue_chunks(app, flow, [(i, 0.0) for i in range(n)], [f"f-{i}" for i in range(n)], 10_000)
    enqueue_s = time.perf_counter() - t
    pending = Pending(args.url, args.schema)
    t1 = time.time()
    worker = WorkerProcess(args.url, args.schema, WORK_QUEUE, args.concurrency)
    try:
        meter = CpuMeter(worker.pid)
        t2 = pending.wait_empty(WORK_QUEUE, [worker])
        cpu = meter.line("F (incl. worker start-up)", t2 - t1)
    finally:
        worker.stop()
        pending.close()
    drain, done, total = drain_span(args.url, args.schema, "f-%")
    steps = step_count(args.url, args.schema, "f-%")
    claims = claim_statements(args, "f-%")
    assert done == total == n and steps == 3 * n, f"F: {done} of {n} succeeded, {steps} steps"
    print(f"pgdurable capacity kind={args.kind} C={args.concurrency} N={n} (enqueued first, one worker): "
          f"{n / drain:.0f} workflows/s ({steps / drain:.0f} steps/s) from first claim to last completion",
          flush=True)
    print(f"pgdurable   F detail: drain {drain:.2f} s; enqueue_many {n / enqueue_s:.0f}/s; from worker spawn "
          f"to queue seen empty {t2 - t1:.2f} s; {claims} claim statements (mean batch {n / claims:.1f})",
          flush=True)
    print(cpu, flush=True)
    results["F.n"] = n
    results["F.concurrency"] = args.concurrency
    results["F.wf_per_s"] = n / drain
    results["F.steps_per_s"] = steps / drain


def part_l(bench: Bench, args: argparse.Namespace, worker: WorkerProcess, results: Results) -> None:
    app, flow, n, interval = bench.app, bench.flows[args.kind]["one"], args.latency_n, args.latency_interval
    for _ in range(3):  # warm-up
        wait_all([app.enqueue(flow, 0, time.time())], worker)
    inbox: queue_module.Queue[tuple[Any, float] | None] = queue_module.Queue()
    round_trips: list[float] = []
    failures: list[BaseException] = []

    def wait_results() -> None:  # the round trip: from just before enqueue to the result in hand
        while (item := inbox.get()) is not None:
            handle, t_enqueued = item
            try:
                value = handle.result(timeout=60)
                round_trips.append(time.time() - t_enqueued)
                assert value["value"] == int(handle.workflow_id[2:]) + 1
            except BaseException as exc:
                failures.append(exc)

    waiter = threading.Thread(target=wait_results, name="results")
    waiter.start()
    try:
        start = time.perf_counter()
        for i in range(n):
            ahead = start + i * interval - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            t = time.time()
            inbox.put((app.enqueue(flow, i, t, workflow_id=f"l-{i}"), t))
    finally:
        inbox.put(None)
        waiter.join()
    if failures:
        raise failures[0]
    rows = query(args.url, args.schema,
                 "SELECT (output->>'start_latency')::float8, extract(epoch FROM started_at - created_at)::float8"
                 " FROM workflow_executions WHERE id LIKE 'l-%%' AND status = 'succeeded'")
    assert len(rows) == n == len(round_trips), f"L: {len(rows)} of {n} succeeded"
    lat = sorted(r[0] for r in rows)
    claim = sorted(r[1] for r in rows)
    rt = sorted(round_trips)
    print(f"pgdurable latency kind={args.kind} C={args.concurrency} (one one-step workflow every "
          f"{interval * 1e3:.0f} ms, {n}x): enqueue->start p50 {pct(lat, .5) * 1e3:.1f} ms "
          f"p99 {pct(lat, .99) * 1e3:.1f} ms; enqueue->result round trip p50 {pct(rt, .5) * 1e3:.1f} ms "
          f"p99 {pct(rt, .99) * 1e3:.1f} ms", flush=True)
    print(f"pgdurable   L detail: enqueue->claim (db clock) p50 {pct(claim, .5) * 1e3:.1f} ms "
          f"p99 {pct(claim, .99) * 1e3:.1f} ms; max start {lat[-1] * 1e3:.1f} ms, max round trip "
          f"{rt[-1] * 1e3:.1f} ms", flush=True)
    results["L.n"] = n
    results["L.start_p50_ms"] = pct(lat, .5) * 1e3
    results["L.start_p99_ms"] = pct(lat, .99) * 1e3
    results["L.roundtrip_p50_ms"] = pct(rt, .5) * 1e3
    results["L.roundtrip_p99_ms"] = pct(rt, .99) * 1e3


# ---- main ---------------------------------------------------------------------------------------------------

def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL),
                        help="database URL (env PGDURABLE_BENCH_URL; created if missing)")
    parser.add_argument("--schema", help="schema to create for this run and drop at the end "
                                         "(default bench_<random>; must not exist yet)")
    parser.add_argument("--keep-schema", action="store_true", help="do not drop the schema at the end")
    parser.add_argument("--results", metavar="FILE",
                        help="merge the headline figures into this JSON file (for bench/report.py)")


def setup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Bench:
    """Fresh schema in the benchmark database, migrated; the App of the benchmark workflows on it."""
    args.schema = args.schema or f"bench_{secrets.token_hex(4)}"
    ensure_database(args.url)
    if schema_exists(args.url, args.schema):
        parser.error(f"schema {args.schema} already exists; the benchmark only uses (and drops) a fresh one")
    bench = build(args.url, args.schema)
    bench.app.migrate()
    return bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", nargs="?", type=int, default=2000,
                        help="workflows in part A (default 2000, as ../shared/anchors/run.sh)")
    parser.add_argument("-c", "--concurrency", type=int, default=16, help="worker concurrency (default 16)")
    parser.add_argument("--kind", choices=("sync", "async"), default="sync",
                        help="def or async def workflows and steps (default sync, like the DBOS anchors)")
    parser.add_argument("--parts", default="ABCDEFL", help="which parts to run (default ABCDEFL)")
    parser.add_argument("--enqueue-threads", type=int, default=1, metavar="K",
                        help="part A enqueues from K threads (default 1, as dbos_queue.py)")
    parser.add_argument("--steps", type=int, help="sequential steps in part B (default N)")
    parser.add_argument("--roundtrips", type=int, default=20, help="round trips in part C (default 20)")
    parser.add_argument("--jobs", type=int, help="jobs in part D (default 10 N, as run.sh gives pgqueuer)")
    parser.add_argument("--jobs-batch", type=int, default=1000,
                        help="enqueue_many batch in part D (default 1000, as pgqueuer_jobs.py)")
    parser.add_argument("--single-enqueues", type=int, default=1000,
                        help="part D also times this many one-at-a-time enqueues (default 1000; 0: skip)")
    parser.add_argument("--bulk", type=int, default=50_000, help="workflows enqueued in part E (default 50000)")
    parser.add_argument("--bulk-chunk", type=int, default=10_000,
                        help="workflows per enqueue_many call in part E (default 10000)")
    parser.add_argument("--backlog", type=int, default=10_000,
                        help="three-step workflows enqueued before the worker starts in part F (default 10000)")
    parser.add_argument("--together", type=int, default=8, help="workflows at once in part K (default 8)")
    parser.add_argument("--together-steps", type=int, default=400,
                        help="sequential steps of each workflow in part K (default 400)")
    parser.add_argument("--latency-n", type=int, default=200, help="workflows in part L (default 200)")
    parser.add_argument("--latency-interval", type=float, default=0.02,
                        help="seconds between enqueues in part L (default 0.02)")
    add_common_arguments(parser)
    parser.add_argument("--py-spy", metavar="FILE", help="py-spy record (raw format) of the worker in part A")
    parser.add_argument("--py-spy-args", default="--rate 100 --nonblocking",
                        help="extra py-spy record options (default: %(default)s; add --gil for on-CPU Python only)")
    parser.add_argument("--worker-pgoptions", metavar="OPTIONS",
                        help="server settings for the worker of A, C, L and K only, as libpq's PGOPTIONS (e.g. "
                             "--worker-pgoptions='-c synchronous_commit=off'): for experiments, never for the "
                             "figures reported")
    args = parser.parse_args()
    args.steps = args.steps or args.n
    args.jobs = args.jobs or 10 * args.n
    args.parts = args.parts.upper()
    if args.enqueue_threads < 1:
        parser.error("--enqueue-threads must be at least 1")

    bench = setup(parser, args)
    # One pooled connection per enqueuing thread (the pool opens on first use; the default holds 4).
    bench.app.db.pool_size = max(bench.app.db.pool_size, args.enqueue_threads + 1)
    results = Results(args.results)
    print(f"pgdurable   setup: {args.url} schema {args.schema}, python {sys.version.split()[0]}, "
          f"parts {args.parts}", flush=True)
    worker = None
    try:
        if any(part in args.parts for part in "ACLK"):
            worker = WorkerProcess(args.url, args.schema, WORK_QUEUE, args.concurrency,
                                   pgoptions=args.worker_pgoptions)
            if "A" in args.parts:
                part_a(bench, args, worker, results)
            if "C" in args.parts:
                part_c(bench, args, worker, results)
            if "L" in args.parts:
                part_l(bench, args, worker, results)
            if "K" in args.parts:
                part_k(bench, args, worker, results)
            worker.stop()
            worker = None
        if "B" in args.parts:
            part_b(bench, args, results)
        if "D" in args.parts:
            part_d(bench, args, results)
        if "E" in args.parts:
            part_e(bench, args, results)
        if "F" in args.parts:
            part_f(bench, args, results)
        results.save()
    finally:
        if worker is not None:
            worker.stop()
        bench.app.close()
        if not args.keep_schema:
            drop_schema(args.url, args.schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
