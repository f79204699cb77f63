"""What one enqueue and one checkpoint cost, against PostgreSQL's own floor, measured side by side.

Each figure is a ratio to a pgbench run made in the same round, and rounds alternate the two sides, so that
a noisy machine moves both (the medians over rounds are reported):

  enqueue       app.enqueue one at a time (one client, a queue no worker serves), ms per call, against
                pgbench's one-row INSERT commit at one client (``ck``: id, uuid, step, jsonb; the floor).
                Also from a thread other than the main one (``enqueue_thread``), as a web framework's worker
                thread calls it (both run their statements through libpq: store/prepared.py).
  driver        the floor's INSERT sent from this process by psycopg (prepared, autocommit, one cursor), ms
                per call: what any Python client pays before an engine does anything. Enqueue and
                checkpoint are also given as ratios to it (a Python engine's share of the cost).
  sql_enqueue   SELECT enqueue_workflow(...) from pgbench at one client, against the same floor.
  checkpoint    a workflow of S sequential steps run in this process (app.start), ms per step, against the
                same floor.
  contention    pgbench, C clients each running SELECT enqueue_workflow(...) in its own transaction, with
                wake-ups (a worker sleeping on the queue that goes back to sleep as soon as a ring wakes it,
                by the producer's rules: its bell armed again at once unless the queue is hot) and without
                (no bell armed: no enqueue notifies, no worker): what the wake-ups cost transactions that
                enqueue. A third side has the same worker poll every 5 ms with no bell (a worker without
                wake-ups still looks at the queue): against it, the cost of the wake-ups alone. The sides
                take turns going first. (Until 2026-12-04 the reference was the same run
                with triggers off, session_replication_role=replica; since wake-ups moved from a trigger
                into the insert function (migration 17), that ran the very same statements, and the ratio
                measured only which of the two runs went second.)
  wake          at light load (one every 20 ms, open loop), SELECT enqueue_workflow(...) committed on a plain
                connection (as any language would), then the result of that step-less workflow awaited
                (app.handle(id).result()) from a worker process: p50 and p99 of the round trip (the
                target's figure), and p50 from the COMMIT's return (the wake-up path without the client's
                own round trips to enqueue). This is what doorbells must not slow down.

Usage: .venv/bin/python bench/costs.py [--rounds R] [--seconds T] [--clients 8,32,64] [--calls N] [--steps S]
       [--url URL] [--results FILE]
env PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.throughput import (
    IDLE_QUEUE,
    JOBS_QUEUE,
    Results,
    WorkerProcess,
    build,
    connect,
    drop_schema,
    ensure_database,
    pct,
)
from pgdurable import channels
from pgdurable.worker.producer import HotQueue, Producer

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/pgdurable_bench"
# The contention benchmark's sides: a worker asleep on the queue (wake-ups), the same worker polling with no
# bell, and no worker at all (no bell armed).
SIDES = ("with", "polling", "without")
# The floor: one row into a table with a primary key and one unique index, committed; run by pgbench and,
# for the driver's share, from this process by psycopg.
FLOOR_INSERT = "INSERT INTO pgdurable_costs_floor (wf, step, out) VALUES (gen_random_uuid(), 1, '{\"a\": 1}')"


def pgbench(url: str, script: str, clients: int, seconds: int, options: str | None = None) -> float:
    """Transactions per second of ``script`` (a file) from ``clients`` pgbench clients."""
    env = {**os.environ, **({"PGOPTIONS": options} if options else {})}
    out = subprocess.run(["pgbench", "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds),
                          "-f", script, url], capture_output=True, text=True, env=env, check=True).stdout
    match = re.search(r"^tps = ([0-9.]+)", out, re.MULTILINE)
    assert match, out
    return float(match.group(1))


def write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    Path(path).write_text(text)
    return path


class SleepingWorker:
    """While in use: a worker asleep on ``queue`` that does nothing but wake up, the worst case for the
    enqueuers: on every NOTIFY its ring sends it looks at the queue (as the claim a ring brings) and goes back
    to sleep at once, its doorbell armed again (one committed UPDATE, as a worker's arming claim), so that the
    next enqueue rings it again. It follows the producer's rule for a hot queue (worker/producer.py's
    HotQueue): when a look finds more than the execution that rang, it looks again every
    Producer.COALESCE_SECONDS instead, and arms only once the queue has stayed quiet; the claims a real worker
    would send are these looks (``rings`` and ``looks`` count them). (No timer: a probe that re-armed every
    millisecond cost the enqueuers its own polling.)
    With ``bell=False``: the same worker without wake-ups, looking every Producer.COALESCE_SECONDS and arming
    nothing (what a worker that only polls would cost the enqueuers)."""

    def __init__(self, url: str, schema: str, queue: str, bell: bool = True) -> None:
        self.url, self.schema, self.queue, self.bell = url, schema, queue, bell
        self.rings = 0
        self.looks = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._sleep, name="sleeping-worker")

    def __enter__(self) -> SleepingWorker:
        self._thread.start()
        if not self._listening.wait(30) or self.error is not None:
            self.__exit__()
            raise RuntimeError(f"the sleeping worker did not start listening: {self.error}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with connect(self.url, self.schema) as conn:
            conn.execute("DELETE FROM worker_doorbells WHERE worker_id = 'costs-sleeper'")
        if self.error is not None:  # a "with" side that stopped ringing would read as wake-ups that cost nothing
            raise RuntimeError(f"the sleeping worker failed: {self.error}") from self.error

    def _sleep(self) -> None:
        try:
            self._listen_and_rearm() if self.bell else self._poll()
        except BaseException as exc:
            self.error = exc
            self._listening.set()

    def _listen_and_rearm(self) -> None:
        # (Two connections: psycopg runs no statement on a connection while its notifies() waits.)
        with connect(self.url, self.schema) as listening, connect(self.url, self.schema) as conn:
            listening.execute(channels.listen(self.schema, "work"))
            conn.execute("INSERT INTO worker_doorbells (queue, worker_id) VALUES (%s, 'costs-sleeper')"
                         " ON CONFLICT (queue, worker_id) DO UPDATE SET armed = true", (self.queue,))
            seen = self._look(conn, 0)[1]
            self.looks = 0
            self._listening.set()
            hot = HotQueue()
            while not self._stop.is_set():
                for notice in listening.notifies(timeout=0.1):
                    if notice.payload != self.queue:
                        continue
                    self.rings += 1
                    found, seen = self._look(conn, seen)
                    hot.claimed(found, after_ring=True, now=time.monotonic())
                    while hot.polling and not self._stop.is_set():
                        time.sleep(Producer.COALESCE_SECONDS)
                        found, seen = self._look(conn, seen)
                        hot.claimed(found, after_ring=False, now=time.monotonic())
                    conn.execute("UPDATE worker_doorbells SET armed = true WHERE queue = %s"
                                 " AND worker_id = 'costs-sleeper'", (self.queue,))

    def _poll(self) -> None:
        with connect(self.url, self.schema) as conn:
            seen = self._look(conn, 0)[1]
            self.looks = 0
            self._listening.set()
            while not self._stop.is_set():
                time.sleep(Producer.COALESCE_SECONDS)
                seen = self._look(conn, seen)[1]

    def _look(self, conn: psycopg.Connection[Any], seen: int) -> tuple[int, int]:
        """How many executions were enqueued into the queue after ``seq`` ``seen``, and the last one's seq
        (along the claim index: nobody claims from this queue, and its priority is 0)."""
        self.looks += 1
        row = conn.execute("SELECT count(*), coalesce(max(seq), %s) FROM workflow_executions"
                           " WHERE status = 'enqueued' AND queue = %s AND priority = 0 AND seq > %s",
                           (seen, self.queue, seen)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


@contextlib.contextmanager
def no_bells(url: str, schema: str) -> Iterator[None]:
    """While in use: no doorbell armed (no enqueue notifies); those that were are armed again after."""
    with connect(url, schema) as conn:
        armed = conn.execute("UPDATE worker_doorbells SET armed = false WHERE armed"
                             " RETURNING queue, worker_id").fetchall()
    try:
        yield
    finally:
        with connect(url, schema) as conn:
            for queue, worker_id in armed:
                conn.execute("UPDATE worker_doorbells SET armed = true WHERE queue = %s AND worker_id = %s",
                             (queue, worker_id))


def light_load_round_trips(args: argparse.Namespace, app: Any, schema: str) -> tuple[list[float], list[float]]:
    """Milliseconds from sending SELECT enqueue_workflow(...) on a plain connection (then COMMIT) to having
    the result; and from the COMMIT's return to having it (the wake-up path alone, without the client's own
    round trips to enqueue)."""
    worker = WorkerProcess(args.url, schema, JOBS_QUEUE, 16)
    took: list[float] = []
    after_commit: list[float] = []
    try:
        with psycopg.connect(args.url) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.commit()
            for i in range(10 + args.wake_n):  # the first ten warm the worker up
                started = time.perf_counter()
                (workflow_id,), = conn.execute("SELECT enqueue_workflow('job', %s::jsonb, %s)",
                                               (json.dumps({"i": i}), JOBS_QUEUE)).fetchall()
                conn.commit()
                committed = time.perf_counter()
                app.handle(workflow_id).result(timeout=60)
                if i >= 10:
                    took.append((time.perf_counter() - started) * 1000)
                    after_commit.append((time.perf_counter() - committed) * 1000)
                worker.check()
                time.sleep(max(0.0, 0.02 - (time.perf_counter() - started)))
    finally:
        worker.stop()
    return sorted(took), sorted(after_commit)


def enqueue_loop(app: Any, job: Any, calls: int) -> float:
    """ms per app.enqueue, one at a time."""
    started = time.perf_counter()
    for i in range(calls):
        app.enqueue(job, i, queue=IDLE_QUEUE)
    return (time.perf_counter() - started) * 1000 / calls


def in_a_thread(fn: Any) -> float:
    """``fn()`` run on a thread other than the main one, as a web framework's worker thread would run it."""
    found: list[float] = []
    thread = threading.Thread(target=lambda: found.append(fn()))
    thread.start()
    thread.join()
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4, help="each pgbench run")
    parser.add_argument("--clients", default="8,32,64", help="contention runs (\"\": none)")
    parser.add_argument("--calls", type=int, default=2000, help="app.enqueue calls per round")
    parser.add_argument("--steps", type=int, default=1000, help="steps of the checkpoint workflow per round")
    parser.add_argument("--wake-n", type=int, default=200, help="light-load SQL enqueue -> result samples")
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--results")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",") if c]
    results = Results(args.results)
    ensure_database(args.url)
    schema = f"costs_{secrets.token_hex(4)}"
    bench = build(args.url, schema)
    app = bench.app
    app.migrate()
    tmp = tempfile.mkdtemp(prefix="pgdurable-costs-")
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS pgdurable_costs_floor")
        conn.execute("CREATE TABLE pgdurable_costs_floor (id bigserial PRIMARY KEY, wf uuid, step int, out jsonb,"
                     " UNIQUE (wf, step))")
    floor = write(tmp, "floor.sql",
                  f"{FLOOR_INSERT};\n")
    qualified = sql.Identifier(schema).as_string(None)
    enqueue_sql = write(tmp, "enqueue.sql",
                        f"SELECT {qualified}.enqueue_workflow('job', '{{\"i\": 1}}', '{IDLE_QUEUE}');\n")
    job = bench.flows["sync"]["job"]
    many_steps = bench.flows["sync"]["many"]
    rows: dict[str, list[float]] = {"floor_ms": [], "driver_ms": [], "enqueue_ms": [], "enqueue_thread_ms": [],
                                    "sql_enqueue_ms": [], "step_ms": []}
    contention: dict[int, list[tuple[float, float, float]]] = {c: [] for c in clients}  # tps of each of SIDES
    rings: dict[int, list[float]] = {c: [] for c in clients}  # wake-ups a second on the "with" side
    looks: dict[int, list[float]] = {c: [] for c in clients}  # and the sleeper's claims (looks) a second
    try:
        app.enqueue(job, 0)  # warm the pool
        for round_ in range(1, args.rounds + 1):
            rows["floor_ms"].append(1000 / pgbench(args.url, floor, 1, args.seconds))
            rows["driver_ms"].append(driver_floor(args.url, args.calls))
            rows["enqueue_ms"].append(enqueue_loop(app, job, args.calls))
            rows["enqueue_thread_ms"].append(in_a_thread(lambda: enqueue_loop(app, job, args.calls)))
            rows["sql_enqueue_ms"].append(1000 / pgbench(args.url, enqueue_sql, 1, args.seconds))
            started = time.perf_counter()
            app.start(many_steps, args.steps).result()
            rows["step_ms"].append((time.perf_counter() - started) * 1000 / args.steps)
            sides = SIDES[round_ % 3:] + SIDES[:round_ % 3]
            for c in clients:
                # The sides take turns going first: whichever ran second came out 9-18% ahead (six rounds at
                # 32 clients of the same statements on both sides).
                tps: dict[str, float] = {}
                for side in sides:
                    # Made only for the sides that use it: "with" (its bell) and "polling" (no bell).
                    sleeper = SleepingWorker(args.url, schema, IDLE_QUEUE, bell=side == "with") \
                        if side != "without" else None
                    with contextlib.ExitStack() as using:
                        if side != "with":
                            using.enter_context(no_bells(args.url, schema))
                        if sleeper is not None:
                            using.enter_context(sleeper)
                        tps[side] = pgbench(args.url, enqueue_sql, c, args.seconds)
                    if side == "with" and sleeper is not None:
                        rings[c].append(sleeper.rings / args.seconds)
                        looks[c].append(sleeper.looks / args.seconds)
                contention[c].append((tps["with"], tps["polling"], tps["without"]))
            floor_ms = rows["floor_ms"][-1]
            print(f"round {round_}: floor {floor_ms:.3f} ms; from psycopg {rows['driver_ms'][-1] / floor_ms:.2f}x; "
                  f"enqueue {rows['enqueue_ms'][-1] / floor_ms:.2f}x "
                  f"({rows['enqueue_thread_ms'][-1] / floor_ms:.2f}x from a thread); "
                  f"SQL enqueue {rows['sql_enqueue_ms'][-1] / floor_ms:.2f}x; "
                  f"step {rows['step_ms'][-1] / floor_ms:.2f}x" + (f"; contention ({sides[0]} first; with wake-ups"
                  " ÷ no worker, ÷ a polling worker) " if clients else "") + ", ".join(
                      f"{c}: {contention[c][-1][0] / contention[c][-1][2]:.2f}, "
                      f"{contention[c][-1][0] / contention[c][-1][1]:.2f} ({rings[c][-1]:.0f} rings/s, "
                      f"{looks[c][-1]:.0f} looks/s)"
                      for c in clients), flush=True)
        wake, wake_after_commit = light_load_round_trips(args, app, schema)
    finally:
        app.close()
        drop_schema(args.url, schema)
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS pgdurable_costs_floor")

    def ratio(name: str, to: str = "floor_ms") -> float:
        return statistics.median(a / b for a, b in zip(rows[name], rows[to], strict=True))

    summary: dict[str, Any] = {
        "floor_ms": statistics.median(rows["floor_ms"]),
        "driver_ms": statistics.median(rows["driver_ms"]), "driver_ratio": ratio("driver_ms"),
        "enqueue_to_driver": ratio("enqueue_ms", "driver_ms"), "step_to_driver": ratio("step_ms", "driver_ms"),
        "enqueue_ms": statistics.median(rows["enqueue_ms"]), "enqueue_ratio": ratio("enqueue_ms"),
        "enqueue_thread_ms": statistics.median(rows["enqueue_thread_ms"]),
        "enqueue_thread_ratio": ratio("enqueue_thread_ms"),
        "sql_enqueue_ms": statistics.median(rows["sql_enqueue_ms"]), "sql_enqueue_ratio": ratio("sql_enqueue_ms"),
        "step_ms": statistics.median(rows["step_ms"]), "step_ratio": ratio("step_ms"),
        "contention": {str(c): {"with_tps": statistics.median(w for w, _, _ in sides),
                                "polling_tps": statistics.median(p for _, p, _ in sides),
                                "without_tps": statistics.median(wo for _, _, wo in sides),
                                "ratio": statistics.median(w / wo for w, _, wo in sides),
                                "ratio_to_polling": statistics.median(w / p for w, p, _ in sides),
                                "polling_ratio": statistics.median(p / wo for _, p, wo in sides),
                                "rings_per_s": statistics.median(rings[c]),
                                "looks_per_s": statistics.median(looks[c])}
                       for c, sides in contention.items()},
        "rounds": args.rounds,
        "wake_p50_ms": pct(wake, 0.5), "wake_p99_ms": pct(wake, 0.99), "wake_n": len(wake),
        "wake_after_commit_p50_ms": pct(wake_after_commit, 0.5),
    }
    print(f"\nmedians over {args.rounds} rounds (ratios are per round, to the pgbench one-row commit of that round):")
    print(f"  pgbench one-row INSERT commit, 1 client: {summary['floor_ms']:.3f} ms")
    print(f"  the same INSERT from psycopg (prepared): {summary['driver_ms']:.3f} ms = {summary['driver_ratio']:.2f}x")
    print(f"  app.enqueue, one at a time:              {summary['enqueue_ms']:.3f} ms = "
          f"{summary['enqueue_ratio']:.2f}x (target <= 1.5x); {summary['enqueue_to_driver']:.2f}x the psycopg INSERT")
    print(f"  app.enqueue, from a thread (as a web framework's worker thread calls it): "
          f"{summary['enqueue_thread_ms']:.3f} ms = {summary['enqueue_thread_ratio']:.2f}x")
    print(f"  SELECT enqueue_workflow(), 1 client:     {summary['sql_enqueue_ms']:.3f} ms = "
          f"{summary['sql_enqueue_ratio']:.2f}x")
    print(f"  sequential step checkpoint:              {summary['step_ms']:.3f} ms = "
          f"{summary['step_ratio']:.2f}x (target <= 1.3x); {summary['step_to_driver']:.2f}x the psycopg INSERT")
    for c, figures in summary["contention"].items():
        print(f"  enqueue in app transactions, {c:>2} clients: {figures['with_tps']:.0f} tps with wake-ups vs "
              f"{figures['without_tps']:.0f} with no worker = {figures['ratio']:.2f}x (target >= 0.95x; "
              f"{figures['rings_per_s']:.0f} wake-ups and {figures['looks_per_s']:.0f} looks a second); vs "
              f"{figures['polling_tps']:.0f} beside a worker polling without a bell = "
              f"{figures['ratio_to_polling']:.2f}x (that worker ÷ no worker: {figures['polling_ratio']:.2f}x)")
    print(f"  SQL enqueue -> result, step-less workflow, 1 per 20 ms ({len(wake)}x): p50 "
          f"{summary['wake_p50_ms']:.2f} ms, p99 {summary['wake_p99_ms']:.2f} ms (target p50 <= 5 ms); from the "
          f"COMMIT's return, p50 {summary['wake_after_commit_p50_ms']:.2f} ms")
    results["costs"] = summary
    results.save()
    print(json.dumps(summary))


def driver_floor(url: str, calls: int) -> float:
    """The floor's INSERT from this process: psycopg, prepared, autocommit, one cursor; ms per call."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn, conn.cursor() as cursor:
        cursor.execute(FLOOR_INSERT)  # prepared by this first call
        started = time.perf_counter()
        for _ in range(calls):
            cursor.execute(FLOOR_INSERT)
        return (time.perf_counter() - started) * 1000 / calls


if __name__ == "__main__":
    main()
