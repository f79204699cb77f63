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

Every run uses a fresh schema (dropped at the end) in a benchmark database that is created if missing.

Usage, from the repository root:
    .venv/bin/python bench/throughput.py [N] [-c CONCURRENCY] [--kind sync|async] [--parts ABCDEFL]
        [--enqueue-threads K] [--steps S] [--roundtrips R] [--jobs J] [--bulk B] [--backlog F]
        [--latency-n L] [--url URL] [--schema NAME] [--results FILE] [--py-spy FILE]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench)

The worker processes import this file as the module ``bench.throughput`` and serve its ``app``, configured
from PGDURABLE_BENCH_URL and PGDURABLE_BENCH_SCHEMA, which this script sets for them. bench/scale.py and
bench/memory.py reuse its workflows and helpers.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
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

    return Bench(app, {
        "sync": {"three": three_steps, "many": many_steps, "job": job},
        "async": {"three": three_steps_async, "many": many_steps_async, "job": job_async},
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


def query(url: str, schema: str, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return conn.execute(text, params).fetchall()


def claim_statements(args: argparse.Namespace, id_pattern: str) -> int:
    """How many claim statements took these executions: rows claimed together share started_at = now()."""
    (count,), = query(args.url, args.schema,
                      "SELECT count(DISTINCT started_at) FROM workflow_executions WHERE id LIKE %s",
                      (id_pattern,))
    return int(count)


def pct(sorted_values: list[float], q: float) -> float:
    """The same pick as the anchors: values[int(n * q)]."""
    return sorted_values[min(int(len(sorted_values) * q), len(sorted_values) - 1)]


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


class CpuMeter:
    """CPU seconds used by the worker, this process and the PostgreSQL server processes over an interval."""

    def __init__(self, worker_pid: int | None) -> None:
        self.worker_pid = worker_pid
        self.worker0 = _proc_cpu(worker_pid) if worker_pid else None
        self.self0 = sum(os.times()[:2])
        self.pg0 = _postgres_cpu()

    def line(self, label: str, wall: float) -> str:
        parts = []
        if self.worker_pid and self.worker0 is not None:
            w = (_proc_cpu(self.worker_pid) or self.worker0) - self.worker0
            parts.append(f"worker {w:.2f} s ({w / wall * 100:.0f}% of a core)")
        me = sum(os.times()[:2]) - self.self0
        parts.append(f"client {me:.2f} s ({me / wall * 100:.0f}%)")
        pg1 = _postgres_cpu()
        pg = sum(cpu - self.pg0.get(pid, 0.0) for pid, cpu in pg1.items())
        parts.append(f"postgres {pg:.2f} s ({pg / wall * 100:.0f}%)")
        return f"pgdurable   {label} cpu over {wall:.2f} s wall: " + ", ".join(parts) + f" [{os.cpu_count()} cpus]"


class WorkerProcess:
    """`python -m pgdurable worker bench.throughput:app` serving one queue, logging to a temporary file."""

    def __init__(self, url: str, schema: str, queue: str, concurrency: int) -> None:
        env = {**os.environ, "PGDURABLE_BENCH_URL": url, "PGDURABLE_BENCH_SCHEMA": schema}
        fd, self.log = tempfile.mkstemp(prefix=f"pgdurable-bench-{queue}-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgdurable", "worker", "bench.throughput:app", "--queue", queue,
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

def part_a(bench: Bench, args: argparse.Namespace, worker: WorkerProcess) -> None:
    app, flow, n = bench.app, bench.flows[args.kind]["three"], args.n
    warm = app.enqueue(flow, 0, time.time())  # warm-up: also waits until the worker is up
    wait_all([warm], worker)
    profiler = Profiler(worker.pid, args.py_spy, args.py_spy_args)
    meter = CpuMeter(worker.pid)
    t0 = time.time()
    handles = [app.enqueue(flow, i, time.time(), workflow_id=f"a-{i}") for i in range(1, n + 1)]
    t1 = time.time()
    results = wait_all(handles, worker)
    t2 = time.time()
    cpu = meter.line("A", t2 - t0)
    profiler.stop()
    assert [r["value"] for r in results] == [i + 3 for i in range(1, n + 1)], "wrong results"
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
    print(f"pgdurable mode=queue kind={args.kind} C={args.concurrency} N={n}: enqueue {n / (t1 - t0):.0f}/s, "
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


def part_b(bench: Bench, args: argparse.Namespace) -> None:
    app, flow, s = bench.app, bench.flows[args.kind]["many"], args.steps
    assert app.start(flow, 10).result(timeout=60) == 10  # warm-up
    meter = CpuMeter(None)
    t = time.perf_counter()
    assert app.start(flow, s).result(timeout=600) == s
    dt = time.perf_counter() - t
    print(f"pgdurable sequential steps kind={args.kind} (app.start, in-process): {s} in {dt:.2f} s = "
          f"{dt / s * 1e3:.3f} ms/step", flush=True)
    print(meter.line("B", dt), flush=True)


def part_c(bench: Bench, args: argparse.Namespace, worker: WorkerProcess) -> None:
    app, flow = bench.app, bench.flows[args.kind]["many"]
    wait_all([app.enqueue(flow, 1)], worker)  # warm-up
    lat = []
    for _ in range(args.roundtrips):
        t = time.perf_counter()
        assert wait_all([app.enqueue(flow, 1)], worker) == [1]
        lat.append(time.perf_counter() - t)
    lat.sort()
    print(f"pgdurable enqueue->result round trip kind={args.kind} ({args.roundtrips}x, one-step workflow, "
          f"one worker): p50 {pct(lat, .5) * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms", flush=True)


def part_d(bench: Bench, args: argparse.Namespace) -> None:
    app, flow, j = bench.app, bench.flows[args.kind]["job"], args.jobs
    t0 = time.time()
    handles = [app.enqueue(flow, i, workflow_id=f"d-{i}") for i in range(j)]
    t1 = time.time()
    worker = WorkerProcess(args.url, args.schema, JOBS_QUEUE, args.concurrency)
    try:
        meter = CpuMeter(worker.pid)
        wait_all(handles, worker)
        t2 = time.time()
        cpu = meter.line("D (incl. worker start-up)", t2 - t1)
    finally:
        worker.stop()
    (first_claim, last_done, done), = query(
        args.url, args.schema,
        "SELECT extract(epoch FROM min(started_at))::float8, extract(epoch FROM max(completed_at))::float8,"
        "       count(*) FILTER (WHERE status = 'succeeded')"
        " FROM workflow_executions WHERE id LIKE 'd-%%'")
    drain = last_done - first_claim
    claims = claim_statements(args, "d-%")
    print(f"pgdurable jobs kind={args.kind} C={args.concurrency} N={j}: enqueue {j / (t1 - t0):.0f}/s "
          f"(one at a time), drain {done / drain:.0f} jobs/s (first claim -> last completion, one worker; "
          f"done {done})", flush=True)
    print(f"pgdurable   D detail: drain {drain:.2f} s; from worker spawn to last result {t2 - t1:.2f} s; "
          f"{claims} claim statements (mean batch {j / claims:.1f})",
          flush=True)
    print(cpu, flush=True)


# ---- main ---------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", nargs="?", type=int, default=2000,
                        help="workflows in part A (default 2000, as ../shared/anchors/run.sh)")
    parser.add_argument("-c", "--concurrency", type=int, default=16, help="worker concurrency (default 16)")
    parser.add_argument("--kind", choices=("sync", "async"), default="sync",
                        help="def or async def workflows and steps (default sync, like the DBOS anchors)")
    parser.add_argument("--parts", default="ABCD", help="which parts to run (default ABCD)")
    parser.add_argument("--steps", type=int, help="sequential steps in part B (default N)")
    parser.add_argument("--roundtrips", type=int, default=20, help="round trips in part C (default 20)")
    parser.add_argument("--jobs", type=int, help="jobs in part D (default N)")
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL),
                        help="database URL (env PGDURABLE_BENCH_URL; created if missing)")
    parser.add_argument("--schema", help="schema to create for this run and drop at the end "
                                         "(default bench_<random>; must not exist yet)")
    parser.add_argument("--keep-schema", action="store_true", help="do not drop the schema at the end")
    parser.add_argument("--py-spy", metavar="FILE", help="py-spy record (raw format) of the worker in part A")
    parser.add_argument("--py-spy-args", default="--rate 100 --nonblocking",
                        help="extra py-spy record options (default: %(default)s; add --gil for on-CPU Python only)")
    args = parser.parse_args()
    args.steps = args.steps or args.n
    args.jobs = args.jobs or args.n
    args.schema = args.schema or f"bench_{secrets.token_hex(4)}"
    args.parts = args.parts.upper()

    ensure_database(args.url)
    if schema_exists(args.url, args.schema):
        parser.error(f"schema {args.schema} already exists; the benchmark only uses (and drops) a fresh one")
    bench = build(args.url, args.schema)
    print(f"pgdurable   setup: {args.url} schema {args.schema}, python {sys.version.split()[0]}, "
          f"parts {args.parts}", flush=True)
    worker = None
    try:
        bench.app.migrate()
        if "A" in args.parts or "C" in args.parts:
            worker = WorkerProcess(args.url, args.schema, WORK_QUEUE, args.concurrency)
            if "A" in args.parts:
                part_a(bench, args, worker)
            if "C" in args.parts:
                part_c(bench, args, worker)
            worker.stop()
            worker = None
        if "B" in args.parts:
            part_b(bench, args)
        if "D" in args.parts:
            part_d(bench, args)
    finally:
        if worker is not None:
            worker.stop()
        bench.app.close()
        if not args.keep_schema:
            drop_schema(args.url, args.schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
