"""Transactional steps run by real worker processes (``python -m pgdurable worker tests.apps.bank:app``) that
are SIGKILLed at random, fail between their writes and their commit, or are SIGSTOPped inside their open
transaction; the assertions are on what the application schema and the engine's tables hold afterwards."""

from __future__ import annotations

import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import bank
from tests.harness import WAIT, WorkerHarness, wait_for

TARGET = "tests.apps.bank:app"
ACCOUNTS, OPENING = 20, 1000


class Harness(WorkerHarness):
    """Bank workers on this test's engine schema, the bank's own schema, and queries on both."""

    def __init__(self, spawn_worker: Callable[..., subprocess.Popen[bytes]], tmp_path: Path,
                 db: psycopg.Connection[Any], client: pgdurable.App, wf: SimpleNamespace, bank_schema: str) -> None:
        super().__init__(spawn_worker, TARGET, tmp_path, db, client, wf)
        self.trace_path = tmp_path / "trace.log"
        self.bank = bank_schema

    def spawn(self, *args: str, wait: bool = True, **env: str) -> subprocess.Popen[bytes]:
        return self.start(args, {"BANK_SCHEMA": self.bank, "BANK_TRACE": str(self.trace_path), **env}, wait)

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(bank=sql.Identifier(self.bank))

    def balances(self) -> dict[int, int]:
        return dict(self.rows(self.q("SELECT id, balance FROM {bank}.accounts")))

    def applied(self) -> Counter[tuple[str, str]]:
        """How many rows the log holds for each (transfer_id, kind)."""
        return Counter({(t, k): n for t, k, n in self.rows(
            self.q("SELECT transfer_id, kind, count(*) FROM {bank}.applied GROUP BY 1, 2"))})

    def trace(self) -> list[tuple[str, str, int, float]]:
        """Every run of a step body that got as far as its writes: (transfer_id, kind, pid, time)."""
        if not self.trace_path.exists():
            return []
        runs = []
        for line in self.trace_path.read_text().splitlines():
            transfer_id, kind, pid, at = line.split()
            runs.append((transfer_id, kind, int(pid), float(at)))
        return runs

    def steps(self, workflow_id: str) -> list[tuple[Any, ...]]:
        """(step_id, step_name, recorded_by_attempt, attempts, output) of every recorded step, in order."""
        return self.rows("SELECT step_id, step_name, recorded_by_attempt, attempts, output FROM operation_outputs "
                         "WHERE execution_id = %s ORDER BY step_id", (workflow_id,))

    def unfinished(self, ids: list[str]) -> int:
        """Executions of ``ids`` not yet succeeded; fails at once if any failed or was cancelled."""
        counts = dict(self.rows("SELECT status, count(*) FROM workflow_executions WHERE id = ANY(%s) GROUP BY 1",
                                (ids,)))
        if counts.get("failed") or counts.get("cancelled"):
            pytest.fail(f"executions ended badly: {counts}; " + repr(self.rows(
                "SELECT id, status, error FROM workflow_executions WHERE id = ANY(%s) "
                "AND status IN ('failed', 'cancelled') LIMIT 5", (ids,))))
        return len(ids) - int(counts.get("succeeded", 0))

    def lock_holders(self) -> list[tuple[int, str]]:
        """(backend pid, state) of the sessions, other than ours, that hold a lock on the bank's accounts."""
        return [(int(pid), str(state)) for pid, state in self.rows(
            "SELECT a.pid, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'relation' AND l.relation = %s::regclass AND l.granted "
            "AND a.pid <> pg_backend_pid()", (f"{self.bank}.accounts",))]


@pytest.fixture
def bank_schema(database_url: str) -> Iterator[str]:
    """A fresh application schema in the same database: the accounts and the log of applied effects."""
    name = f"bank_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        bank.create(conn, name, ACCOUNTS, OPENING)
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def h(spawn_worker: Callable[..., subprocess.Popen[bytes]], make_app: Callable[..., pgdurable.App],
      database_url: str, schema: str, bank_schema: str, tmp_path: Path) -> Iterator[Harness]:
    client = make_app()
    wf = bank.define(client)
    client.migrate()  # before any worker starts, so workers and the test agree on a ready schema
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield Harness(spawn_worker, tmp_path, conn, client, wf, bank_schema)


# -- 1. exactly once while workers are SIGKILLed at random --------------------------------------------------

# How long the test goes on killing workers before it lets the rest finish.
KILLING_SECONDS = 90.0


def test_transfers_apply_exactly_once_while_workers_are_killed_at_random(h: Harness) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    transfers = []
    for i in range(200):
        source, target = rng.sample(range(ACCOUNTS), 2)
        # each step pauses twice, up to 0.2 s each time, inside its transaction (before and after its writes)
        transfers.append((f"tr-{i:03d}", source, target, rng.randint(1, 100), 0.2))
    ids = [t[0] for t in transfers]
    expected = dict.fromkeys(range(ACCOUNTS), OPENING)
    for _, source, target, amount, _ in transfers:
        expected[source] -= amount
        expected[target] += amount

    workers = [h.spawn(wait=False) for _ in range(3)]
    for proc in workers:
        h.wait_registered(proc)
    started = time.monotonic()
    h.client.enqueue_many(h.wf.transfer, transfers, workflow_ids=ids)

    kills, in_flight, victims = 0, 0, []
    # About 20 s on an idle machine, killing all along. Kills come on a clock (every 0.3-1 s), not per unit of
    # progress, so on a machine loaded enough that a new worker needs most of that to start, they would stop
    # all progress: after KILLING_SECONDS the survivors finish the rest unharmed.
    killing_until = started + KILLING_SECONDS
    while h.unfinished(ids) and time.monotonic() < killing_until:
        pause_until = time.monotonic() + rng.uniform(0.3, 1.0)
        while time.monotonic() < pause_until and h.unfinished(ids):
            time.sleep(0.05)
        if not h.unfinished(ids):
            break
        index = rng.randrange(len(workers))
        victim = workers[index]
        # what it holds right now (it may claim more before the signal lands)
        in_flight += int(h.scalar("SELECT count(*) FROM workflow_executions WHERE status = 'running' "
                                  "AND split_part(owner_id, ':', 2) = %s", (str(victim.pid),)))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=WAIT)
        assert victim.returncode == -signal.SIGKILL, h.log(victim)
        kills += 1
        victims.append(victim.pid)
        workers[index] = h.spawn(wait=False)
    wait_for(lambda: h.unfinished(ids) == 0, 3 * WAIT,
             f"the transfers to finish after {kills} kills (killing stopped after {KILLING_SECONDS:.0f} s)",
             interval=0.1)
    elapsed = time.monotonic() - started

    # Every workflow succeeded, each step is recorded exactly once.
    assert h.unfinished(ids) == 0
    assert h.scalar("SELECT count(*) FROM operation_outputs WHERE execution_id = ANY(%s)", (ids,)) == 2 * len(ids)
    assert h.rows("SELECT execution_id FROM operation_outputs WHERE execution_id = ANY(%s) "
                  "GROUP BY 1 HAVING array_agg(step_name ORDER BY step_id) <> %s",
                  (ids, ["bank.debit", "bank.credit"])) == []
    # Money is neither created nor lost, and every account holds exactly what the transfers imply.
    balances = h.balances()
    assert sum(balances.values()) == ACCOUNTS * OPENING
    assert balances == expected
    # Each transfer's debit and credit were applied exactly once: no missing and no duplicate log rows.
    applied = h.applied()
    duplicates = sum(n - 1 for n in applied.values() if n > 1)
    missing = [(t, k) for t in ids for k in ("debit", "credit") if applied[(t, k)] == 0]
    assert duplicates == 0, [key for key, n in applied.items() if n > 1]
    assert missing == []
    assert set(applied) == {(t, k) for t in ids for k in ("debit", "credit")}
    # Each log row is the effect its transfer asked for, on the right account.
    logged = {(t, k): (account, amount) for t, k, account, amount in h.rows(
        h.q("SELECT transfer_id, kind, account, amount FROM {bank}.applied"))}
    for transfer_id, source, target, amount, _ in transfers:
        assert logged[(transfer_id, "debit")] == (source, -amount)
        assert logged[(transfer_id, "credit")] == (target, amount)

    # The kills really landed on work: executions were taken over, and some step bodies ran, wrote, and
    # were rolled back (their process died before the commit) before running again elsewhere.
    recovered = int(h.scalar("SELECT count(*) FROM workflow_executions WHERE id = ANY(%s) AND recoveries > 0",
                             (ids,)))
    taken_over_steps = int(h.scalar("SELECT count(*) FROM operation_outputs WHERE execution_id = ANY(%s) "
                                    "AND recorded_by_attempt > 1", (ids,)))
    trace = h.trace()
    rerun = len(trace) - len(applied)  # bodies that wrote, then were rolled back, and ran again
    killed = set(victims)
    rolled_back_by_kill = sum(1 for *_, pid, _ in trace if pid in killed) - int(h.scalar(
        h.q("SELECT count(*) FROM {bank}.applied WHERE pid = ANY(%s)"), (list(killed),)))
    print(f"\nexactly-once: {len(ids)} workflows, {kills} kills ({in_flight} executions in flight at the kills, "
          f"{recovered} recovered, {taken_over_steps} steps recorded by a later attempt, {rerun} step bodies "
          f"rolled back and re-run, {rolled_back_by_kill} by a kill), duplicates {duplicates}, "
          f"elapsed {elapsed:.1f}s, seed {seed}")
    assert kills >= 5
    assert in_flight > 0 and recovered > 0
    for proc in workers:
        assert proc.poll() is None, h.log(proc)


# -- 2. a step that fails between its writes and its commit ------------------------------------------------

def test_step_failing_after_its_writes_leaves_no_trace(h: Harness) -> None:
    marker = h.tmp_path / "failed-once"
    proc = h.spawn("-c", "2")
    handle = h.client.enqueue(h.wf.flaky_deposit, "dep-1", 3, 250, str(marker), workflow_id="dep-1")
    assert handle.result(timeout=WAIT) == OPENING + 250  # not + 500: the first try's UPDATE was rolled back

    first_pid, first_balance = marker.read_text().split()
    assert int(first_pid) == proc.pid  # the first try ran in the worker process, wrote, saw its write, failed
    assert int(first_balance) == OPENING + 250
    assert [(t, k, pid) for t, k, pid, _ in h.trace()] == [("dep-1", "deposit", proc.pid)] * 2  # two tries

    assert h.balances() == {**dict.fromkeys(range(ACCOUNTS), OPENING), 3: OPENING + 250}
    assert h.applied() == {("dep-1", "deposit"): 1}
    execution = h.execution("dep-1")
    assert execution["status"] == "succeeded" and execution["attempt"] == 1 and execution["recoveries"] == 0
    # one record, made by the second try of the step in the same attempt
    assert h.steps("dep-1") == [(0, "bank.deposit_failing_once", 1, 2, OPENING + 250)]
    assert proc.poll() is None
    assert "Traceback" not in h.log(proc)


# -- 3. a worker paused inside its open transaction -------------------------------------------------------

def test_worker_paused_inside_its_transaction_loses_its_locks_and_cannot_commit(h: Harness) -> None:
    # Also its step transactions' idle_in_transaction_session_timeout. The successor must claim the execution
    # between the zombie's lease running out and the server ending its session: a window of almost a heartbeat
    # period (lease / 3), long enough here for a successor sweeping every 0.3 s on a loaded machine.
    zombie_lease = 7.5
    heartbeat = zombie_lease / 3
    marker = h.tmp_path / "paused"
    zombie = h.spawn("-c", "2", BANK_LEASE=str(zombie_lease))
    wid = "slow-1"
    # The step writes, then (first time only) pauses, running SELECT 1 every 50 ms: unpaused, it commits.
    h.client.enqueue(h.wf.slow_deposit, wid, 7, 500, str(marker), 2 * zombie_lease, workflow_id=wid)
    # the marker is created, then written: wait for its content, not just for the file
    wait_for(lambda: marker.exists() and marker.read_text().strip() != "", WAIT,
             "the step to write and begin its pause", interval=0.002)
    assert int(marker.read_text()) == zombie.pid
    # The successor starts now (not registered yet, it cannot take a live lease), so that its start-up, slow
    # on a loaded machine, overlaps the wait below instead of eating into the window it must claim within.
    successor = h.spawn("-c", "2", wait=False)  # lease 2 s

    def lease() -> Any:
        return h.scalar("SELECT lease_expires FROM workflow_executions WHERE id = %s", (wid,))

    # Stop the zombie shortly before its next heartbeat: its lease then runs out most of a heartbeat period
    # before the server's idle timer (started by its last statement, just before the stop) ends its session,
    # so the successor claims the execution while the zombie's transaction still holds the row lock.
    claimed = lease()
    wait_for(lambda: lease() != claimed, WAIT, "a heartbeat of the zombie", interval=0.003)
    time.sleep(heartbeat - 0.5)
    zombie.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        holders = wait_for(lambda: [x for x in h.lock_holders() if x[1].startswith("idle in transaction")],
                           WAIT, "the paused transaction to sit idle")
        assert len(holders) == 1, holders
        zombie_backend = holders[0][0]
        assert h.balances()[7] == OPENING  # written, not committed

        h.wait_registered(successor)
        # The server ends the paused session after a lease of idling in its transaction, although the client
        # is still stopped (so the session was not closed from the client's side). Meanwhile the successor,
        # which took the execution over when the lease ran out, waits for the zombie's row lock.
        last_seen, blocked = time.time(), set()
        while True:
            looked = time.time()  # before the query: the session was alive at some moment after this
            if not h.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (zombie_backend,)):
                break
            last_seen = looked
            blocked.update(r[0] for r in h.rows("SELECT pid FROM pg_stat_activity "
                                                "WHERE %s = ANY (pg_blocking_pids(pid))", (zombie_backend,)))
            assert time.monotonic() - stopped < WAIT, "the paused session was not ended"
            time.sleep(0.01)
        ended_after = time.monotonic() - stopped
        assert zombie.poll() is None
        assert len(blocked) == 1, "the successor's step should have waited for the zombie's row lock"

        # Once the lock is free, the successor's step commits.
        h.wait_status(wid, {"succeeded"}, timeout=WAIT)
        assert h.execution(wid)["attempt"] == 2
    finally:
        zombie.send_signal(signal.SIGCONT)

    # The zombie wakes inside the step: its session is gone, and it learns it lost the lease. It must
    # neither commit nor run the step again.
    # "stopped" is logged once the zombie's attempt has ended: nothing of it can change anything after that
    wait_for(lambda: f"{wid} attempt 1: stopped, no longer owned" in h.log(zombie), WAIT,
             "the zombie to stop its attempt")

    execution = h.execution(wid)
    assert execution["status"] == "succeeded" and execution["attempt"] == 2 and execution["recoveries"] == 1
    assert execution["owner_id"] is None
    assert execution["output"]["pid"] == successor.pid
    assert h.balances() == {**dict.fromkeys(range(ACCOUNTS), OPENING), 7: OPENING + 500}
    assert h.applied() == {(wid, "deposit"): 1}
    assert h.scalar(h.q("SELECT pid FROM {bank}.applied")) == successor.pid
    [(step_id, name, recorded_by, _, output)] = h.steps(wid)
    assert (step_id, name, recorded_by) == (0, "bank.deposit_pausing_once", 2)
    assert output["pid"] == successor.pid and output["balance"] == OPENING + 500
    # The successor's step began while the zombie still held the row lock (it was seen blocked, above),
    # and its UPDATE returned only after the server had ended the zombie's session. (last_seen is sampled
    # every 10 ms, so the step's start is compared with a sampling period of slack.)
    step_started = float(h.scalar("SELECT extract(epoch FROM started_at)::float8 FROM operation_outputs "
                                  "WHERE execution_id = %s", (wid,)))
    assert step_started < last_seen + 0.05 and last_seen < output["written_at"]
    runs = [(transfer_id, pid) for transfer_id, _, pid, _ in h.trace()]
    assert runs == [(wid, zombie.pid), (wid, successor.pid)]  # the zombie did not run the body again
    zombie_log = h.log(zombie)
    # It learnt it lost the execution either from its own clock (paused past its lease, the step gives up
    # instead of running the body again) or from a heartbeat that no longer found it owned.
    assert f"{wid} attempt 1: stopped, no longer owned" in zombie_log
    print(f"\nzombie: session ended by the server {ended_after:.2f}s after SIGSTOP (lease {zombie_lease:.1f}s); "
          f"the successor's step waited {output['written_at'] - step_started:.2f}s for the row lock")
    assert zombie.poll() is None and successor.poll() is None  # both live on as healthy workers
