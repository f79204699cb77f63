"""The workload of the fault-injection suite (``bench/chaos.py``), served by real worker processes:

    python -m pgdurable worker bench.chaos_app:app

``bench/chaos.py`` sets the environment of each worker:

  PGDURABLE_DATABASE_URL, PGDURABLE_SCHEMA   the engine's database and schema
  CHAOS_BANK_SCHEMA   the application schema (made by ``create``) that the transactional steps write
  CHAOS_LEASE         lease_seconds (default 2.0), also the steps' idle_in_transaction_session_timeout
  CHAOS_SWEEP         sweep_seconds (default 0.3)
  CHAOS_POLL          poll_seconds (default 0.5)
  CHAOS_TRACE         a file that every run of a plain step body appends one line to:
                      ``<execution_id> <step name> <pid>`` (one O_APPEND write, so lines never interleave)

The workflows:

- ``chaos.plain`` (sync) and ``chaos.plain_async`` (async): three plain steps; the result is a known function
  of the input, so a wrong replay shows up as a wrong output.
- ``chaos.transfer`` (sync) and ``chaos.transfer_async`` (async): a plain check, then two transactional
  steps that move money between two accounts (debit, then credit), then a plain step. Every effect is also
  a row of ``applied``, which has no unique constraint: an effect applied twice shows as two rows.
- ``chaos.doomed``: a plain step, then a step that always raises ``ChaosError``: the workflow must end
  ``failed`` with that error recorded.
- ``chaos.sleeper`` (sync) and ``chaos.sleeper_async``: a transfer with a durable sleep between the debit and the
  credit and another before the receipt (the execution gives its slot up and resumes, on any worker).
- ``chaos.receiver`` (sync) and ``chaos.receiver_async``: receive ``count`` messages on topic ``chaos`` (sent by
  the client during the run, with idempotency keys); each message moves its ``amount`` between two accounts
  in a transactional step (effect id ``<workflow id>#<seq>``); the result is the list of sequence numbers
  received, which must be ``0..count-1`` in order.
- ``chaos.parent`` (sync) and ``chaos.parent_async``: fan out transfer children (ids chosen by the client, so
  the checker knows them) and one doomed child, gather the transfers' receipts, then wait for the doomed one
  and return its error message after the receipts.
- ``chaos.forever`` (a step, then a durable sleep, forever; enqueued with ``timeout_seconds``),
  ``chaos.forever_async`` (async steps forever; ``timeout_seconds=FOREVER_TIMEOUT`` on the decorator) and
  ``chaos.forever_parent`` (waits forever for a ``chaos.forever`` child, which inherits its deadline): they
  must end ``failed`` with ``pgdurable.WorkflowTimeout``.
- ``chaos.hang`` (a sync step that blocks in ``time.sleep(HANG_SECONDS)``) and ``chaos.hang_async`` (an async
  step that awaits forever), enqueued with ``timeout_seconds``: they must end ``failed`` with
  ``pgdurable.WorkflowTimeout``; the async step must be cancelled (it traces ``chaos.ablock.cancelled``).

Every step sleeps a random part of ``pause`` so that workflows are in flight when a fault strikes.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import sql

import pgdurable

# Many lease expiries are expected while workers are killed, stopped and cut off: dead-lettering is not
# what this suite measures, so the workload's executions may be recovered this many times.
MAX_RECOVERIES = 1000
# The topic receivers listen on, and how long one waits for its next message before it gives up (a lost
# message then shows as a failed receiver instead of a workflow waiting forever).
TOPIC = "chaos"
RECV_TIMEOUT = 120.0
# chaos.forever_async's own time budget (the decorator's timeout_seconds).
FOREVER_TIMEOUT = 3.0
# How long a hung sync step blocks: for all practical purposes, forever (Python cannot kill a thread).
HANG_SECONDS = 3600.0
# chaos.timed / chaos.timed_async: a step with this timeout whose first attempt in each worker process hangs
# for TIMED_HANG_SECONDS (past it), so every such workflow recovers through a StepTimeout and a retry.
TIMED_STEP_TIMEOUT = 0.2
TIMED_HANG_SECONDS = 2.0
_hung_once: set[str | None] = set()


class ChaosError(Exception):
    """What the always-failing step raises."""


def create(conn: psycopg.Connection[Any], schema: str, accounts: int, balance: int) -> None:
    """The application schema: ``accounts`` accounts (ids 0..accounts-1) holding ``balance`` each, and the log
    of applied effects (deliberately without a unique constraint). ``effect`` names what was meant to happen
    once: the transfer id (one row per debit and per credit), or ``<receiver>#<seq>`` for a message."""
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    conn.execute(sql.SQL("CREATE TABLE {}.accounts (id integer PRIMARY KEY, balance bigint NOT NULL)").format(s))
    conn.execute(sql.SQL(
        "CREATE TABLE {}.applied (execution_id text, effect text NOT NULL, step text NOT NULL, "
        "account integer NOT NULL, amount bigint NOT NULL, pid integer NOT NULL, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp())").format(s))
    conn.execute(sql.SQL("INSERT INTO {}.accounts SELECT i, %s FROM generate_series(0, %s) AS i").format(s),
                 (balance, accounts - 1))


def add_to_citus_metadata(conn: psycopg.Connection[Any], schema: str) -> None:
    """On a Citus coordinator: put the application's tables into Citus's metadata, so that a transactional step
    commits their writes and its checkpoint (on a worker node) in two phases. A plain coordinator table would
    commit apart from the worker node's part: a node lost as it answers COMMIT leaves a checkpoint without its
    effect (docs/scale-out.md, "Transactional steps")."""
    for table in ("accounts", "applied"):
        conn.execute("SELECT citus_add_local_table_to_metadata(%s)", (f"{schema}.{table}",))


def expected_plain(n: int) -> int:
    return ((n + 1) * 2) + 3


def expected_plain_async(n: int) -> int:
    return ((n + 5) * 3) - 1


def expected_timed(n: int) -> int:
    return n * 3


def expected_debounced(n: int) -> int:
    return n * 7


def _first_attempt_here() -> bool:
    """True the first time this process runs the calling workflow's timed step (then it hangs)."""
    workflow_id = pgdurable.current_workflow_id()
    first = workflow_id not in _hung_once
    _hung_once.add(workflow_id)
    return first


def expected_transfer(transfer_id: str, source: int, target: int, amount: int) -> str:
    return f"{transfer_id}:{source}->{target}:{amount}"


def effect_id(receiver_id: str, seq: int) -> str:
    """The application-log id of the effect of message ``seq`` of a receiver."""
    return f"{receiver_id}#{seq}"


def child_ids(parent_id: str, children: int) -> tuple[list[str], str]:
    """The ids a parent gives its transfer children and its doomed child."""
    return [f"{parent_id}.c{j}" for j in range(children)], f"{parent_id}.d"


def _bank() -> sql.Identifier:
    name = os.environ.get("CHAOS_BANK_SCHEMA")
    if not name:
        raise RuntimeError("CHAOS_BANK_SCHEMA is not set: the transactional steps do not know where to write")
    return sql.Identifier(name)


_UPDATE = "UPDATE {bank}.accounts SET balance = balance + %s WHERE id = %s RETURNING balance"
_LOG = ("INSERT INTO {bank}.applied (execution_id, effect, step, account, amount, pid) "
        "VALUES (%s, %s, %s, %s, %s, %s)")


def _q(text: str) -> sql.Composed:
    return sql.SQL(text).format(bank=_bank())


def _trace(step: str) -> None:
    path = os.environ.get("CHAOS_TRACE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{pgdurable.current_workflow_id()} {step} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _apply(conn: psycopg.Connection[Any], transfer_id: str, step: str, account: int, delta: int) -> int:
    row = conn.execute(_q(_UPDATE), (delta, account)).fetchone()
    if row is None:
        raise LookupError(f"no account {account}")
    conn.execute(_q(_LOG), (pgdurable.current_workflow_id(), transfer_id, step, account, delta, os.getpid()))
    return int(row[0])


async def _aapply(conn: psycopg.AsyncConnection[Any], transfer_id: str, step: str, account: int, delta: int) -> int:
    cur = await conn.execute(_q(_UPDATE), (delta, account))
    row = await cur.fetchone()
    if row is None:
        raise LookupError(f"no account {account}")
    await conn.execute(_q(_LOG), (pgdurable.current_workflow_id(), transfer_id, step, account, delta, os.getpid()))
    return int(row[0])


def _move(conn: psycopg.Connection[Any], effect: str, step: str, source: int, target: int, amount: int) -> None:
    """Both halves of a transfer in one transaction, logged as one effect."""
    for account, delta in ((source, -amount), (target, amount)):
        if conn.execute(_q(_UPDATE), (delta, account)).fetchone() is None:
            raise LookupError(f"no account {account}")
    conn.execute(_q(_LOG), (pgdurable.current_workflow_id(), effect, step, source, amount, os.getpid()))


async def _amove(conn: psycopg.AsyncConnection[Any], effect: str, step: str, source: int, target: int,
                 amount: int) -> None:
    for account, delta in ((source, -amount), (target, amount)):
        cur = await conn.execute(_q(_UPDATE), (delta, account))
        if await cur.fetchone() is None:
            raise LookupError(f"no account {account}")
    await conn.execute(_q(_LOG), (pgdurable.current_workflow_id(), effect, step, source, amount, os.getpid()))


# A statement cancelled inside a transactional step (statement_timeout, pg_cancel_backend), the application's
# own or the engine's checkpoint, is a failure of that try, charged to the step's retry policy (only lost
# connections, serialization failures and deadlocks retry on a budget of their own). The default 3 tries,
# 0.5 then 1 s apart, are too few where statements time out under lock contention (the cancelq scenario saw
# 2 transfers of 300 fail so): like an application deployed with a statement_timeout, give them room.
TRANSACTION_ATTEMPTS, TRANSACTION_INTERVAL = 8, 0.05


def _transaction(app: pgdurable.App, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``app.transaction(name=...)`` with the workload's retry policy, typed."""
    decorator: Callable[[Callable[..., Any]], Callable[..., Any]] = app.transaction(
        name=name, max_attempts=TRANSACTION_ATTEMPTS, interval=TRANSACTION_INTERVAL)
    return decorator


def define(app: pgdurable.App) -> SimpleNamespace:
    """Register the workload's workflows and steps on ``app``."""

    # -- plain steps --------------------------------------------------------------------------------------

    @app.step(name="chaos.fetch")
    def fetch(n: int, pause: float) -> int:
        time.sleep(random.uniform(0, pause))
        _trace("chaos.fetch")
        return n + 1

    @app.step(name="chaos.compute")
    def compute(x: int, pause: float) -> int:
        time.sleep(random.uniform(0, pause))
        _trace("chaos.compute")
        return x * 2

    @app.step(name="chaos.store")
    def store(x: int, pause: float) -> int:
        time.sleep(random.uniform(0, pause))
        _trace("chaos.store")
        return x + 3

    @app.workflow(name="chaos.plain", max_recoveries=MAX_RECOVERIES)
    def plain(n: int, pause: float = 0.0) -> int:
        return store(compute(fetch(n, pause), pause), pause)

    @app.step(name="chaos.afetch")
    async def afetch(n: int, pause: float) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        _trace("chaos.afetch")
        return n + 5

    @app.step(name="chaos.acompute")
    async def acompute(x: int, pause: float) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        _trace("chaos.acompute")
        return x * 3

    @app.step(name="chaos.astore")
    async def astore(x: int, pause: float) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        _trace("chaos.astore")
        return x - 1

    @app.workflow(name="chaos.plain_async", max_recoveries=MAX_RECOVERIES)
    async def plain_async(n: int, pause: float = 0.0) -> int:
        return await astore(await acompute(await afetch(n, pause), pause), pause)

    # -- transfers: transactional steps, with random pauses inside their transactions -----------------------

    @app.step(name="chaos.check")
    def check(source: int, target: int, amount: int) -> bool:
        _trace("chaos.check")
        if source == target or amount <= 0:
            raise ValueError(f"bad transfer {source}->{target} of {amount}")
        return True

    @_transaction(app, "chaos.debit")
    def debit(conn: psycopg.Connection[Any], transfer_id: str, account: int, amount: int, pause: float) -> int:
        time.sleep(random.uniform(0, pause))
        balance = _apply(conn, transfer_id, "chaos.debit", account, -amount)
        time.sleep(random.uniform(0, pause))  # written, not yet committed
        return balance

    @_transaction(app, "chaos.credit")
    def credit(conn: psycopg.Connection[Any], transfer_id: str, account: int, amount: int, pause: float) -> int:
        time.sleep(random.uniform(0, pause))
        balance = _apply(conn, transfer_id, "chaos.credit", account, amount)
        time.sleep(random.uniform(0, pause))
        return balance

    @app.step(name="chaos.receipt")
    def receipt(transfer_id: str, source: int, target: int, amount: int) -> str:
        _trace("chaos.receipt")
        return expected_transfer(transfer_id, source, target, amount)

    @app.workflow(name="chaos.transfer", max_recoveries=MAX_RECOVERIES)
    def transfer(transfer_id: str, source: int, target: int, amount: int, pause: float = 0.0) -> str:
        check(source, target, amount)
        debit(transfer_id, source, amount, pause)
        credit(transfer_id, target, amount, pause)
        return str(receipt(transfer_id, source, target, amount))

    @_transaction(app, "chaos.adebit")
    async def adebit(conn: psycopg.AsyncConnection[Any], transfer_id: str, account: int, amount: int,
                     pause: float) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        balance = await _aapply(conn, transfer_id, "chaos.adebit", account, -amount)
        await asyncio.sleep(random.uniform(0, pause))
        return balance

    @_transaction(app, "chaos.acredit")
    async def acredit(conn: psycopg.AsyncConnection[Any], transfer_id: str, account: int, amount: int,
                      pause: float) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        balance = await _aapply(conn, transfer_id, "chaos.acredit", account, amount)
        await asyncio.sleep(random.uniform(0, pause))
        return balance

    @app.step(name="chaos.areceipt")
    async def areceipt(transfer_id: str, source: int, target: int, amount: int) -> str:
        _trace("chaos.areceipt")
        return expected_transfer(transfer_id, source, target, amount)

    @app.workflow(name="chaos.transfer_async", max_recoveries=MAX_RECOVERIES)
    async def transfer_async(transfer_id: str, source: int, target: int, amount: int, pause: float = 0.0) -> str:
        await adebit(transfer_id, source, amount, pause)
        await acredit(transfer_id, target, amount, pause)
        return str(await areceipt(transfer_id, source, target, amount))

    # -- a step that always fails -------------------------------------------------------------------------

    @app.step(name="chaos.prepare")
    def prepare(n: int, pause: float) -> int:
        time.sleep(random.uniform(0, pause))
        _trace("chaos.prepare")
        return n

    @app.step(name="chaos.explode", max_attempts=2, interval=0.05)
    def explode(n: int) -> int:
        _trace("chaos.explode")
        raise ChaosError(f"doomed {n}")

    @app.workflow(name="chaos.doomed", max_recoveries=MAX_RECOVERIES)
    def doomed(n: int, pause: float = 0.0) -> int:
        return int(explode(prepare(n, pause)))

    # -- durable sleeps between transactional effects ------------------------------------------------------

    @app.workflow(name="chaos.sleeper", max_recoveries=MAX_RECOVERIES)
    def sleeper(transfer_id: str, source: int, target: int, amount: int, nap: float, pause: float = 0.0) -> str:
        check(source, target, amount)
        debit(transfer_id, source, amount, pause)
        pgdurable.sleep(nap)
        credit(transfer_id, target, amount, pause)
        pgdurable.sleep(nap)
        return str(receipt(transfer_id, source, target, amount))

    @app.workflow(name="chaos.sleeper_async", max_recoveries=MAX_RECOVERIES)
    async def sleeper_async(transfer_id: str, source: int, target: int, amount: int, nap: float,
                            pause: float = 0.0) -> str:
        await adebit(transfer_id, source, amount, pause)
        await pgdurable.sleep_async(nap)
        await acredit(transfer_id, target, amount, pause)
        await pgdurable.sleep_async(nap)
        return str(await areceipt(transfer_id, source, target, amount))

    # -- messages: each received exactly once, in order, and applied once -----------------------------------

    @_transaction(app, "chaos.consume")
    def consume(conn: psycopg.Connection[Any], effect: str, source: int, target: int, amount: int,
                pause: float) -> None:
        time.sleep(random.uniform(0, pause))
        _move(conn, effect, "chaos.consume", source, target, amount)

    @app.workflow(name="chaos.receiver", max_recoveries=MAX_RECOVERIES)
    def receiver(receiver_id: str, count: int, source: int, target: int, pause: float = 0.0) -> list[int]:
        received: list[int] = []
        for _ in range(count):
            message = pgdurable.recv(TOPIC, timeout=RECV_TIMEOUT)
            if message is None:
                raise ChaosError(f"{receiver_id}: message #{len(received)} did not come within {RECV_TIMEOUT:g} s")
            consume(effect_id(receiver_id, message["seq"]), source, target, message["amount"], pause)
            received.append(message["seq"])
        return received

    @_transaction(app, "chaos.aconsume")
    async def aconsume(conn: psycopg.AsyncConnection[Any], effect: str, source: int, target: int, amount: int,
                       pause: float) -> None:
        await asyncio.sleep(random.uniform(0, pause))
        await _amove(conn, effect, "chaos.aconsume", source, target, amount)

    @app.workflow(name="chaos.receiver_async", max_recoveries=MAX_RECOVERIES)
    async def receiver_async(receiver_id: str, count: int, source: int, target: int,
                             pause: float = 0.0) -> list[int]:
        received: list[int] = []
        for _ in range(count):
            message = await pgdurable.recv_async(TOPIC, timeout=RECV_TIMEOUT)
            if message is None:
                raise ChaosError(f"{receiver_id}: message #{len(received)} did not come within {RECV_TIMEOUT:g} s")
            await aconsume(effect_id(receiver_id, message["seq"]), source, target, message["amount"], pause)
            received.append(message["seq"])
        return received

    # -- child workflows: fan out transfers and a doomed child, gather -------------------------------------

    @app.workflow(name="chaos.parent", max_recoveries=MAX_RECOVERIES)
    def parent(parent_id: str, children: list[list[int]], n: int, pause: float = 0.0) -> list[str]:
        ids, doomed_id = child_ids(parent_id, len(children))
        handles = [app.enqueue(transfer, workflow_id=child, transfer_id=child, source=source, target=target,
                               amount=amount, pause=pause)
                   for child, (source, target, amount) in zip(ids, children, strict=True)]
        hopeless = app.enqueue(doomed, workflow_id=doomed_id, n=n, pause=pause)
        receipts = [str(r) for r in pgdurable.gather(handles)]
        try:
            hopeless.result()
        except pgdurable.WorkflowFailed as exc:
            return [*receipts, exc.remote_message]
        raise ChaosError(f"{doomed_id} succeeded")

    @app.workflow(name="chaos.parent_async", max_recoveries=MAX_RECOVERIES)
    async def parent_async(parent_id: str, children: list[list[int]], n: int, pause: float = 0.0) -> list[str]:
        ids, doomed_id = child_ids(parent_id, len(children))
        handles = [await app.enqueue_async(transfer_async, workflow_id=child, transfer_id=child, source=source,
                                           target=target, amount=amount, pause=pause)
                   for child, (source, target, amount) in zip(ids, children, strict=True)]
        hopeless = await app.enqueue_async(doomed, workflow_id=doomed_id, n=n, pause=pause)
        receipts = [str(r) for r in await pgdurable.gather_async(handles)]
        try:
            await hopeless.result_async()
        except pgdurable.WorkflowFailed as exc:
            return [*receipts, exc.remote_message]
        raise ChaosError(f"{doomed_id} succeeded")

    # -- workflows that never finish: their deadline ends them ----------------------------------------------

    @app.step(name="chaos.tick")
    def tick(i: int) -> int:
        return i

    @app.workflow(name="chaos.forever", max_recoveries=MAX_RECOVERIES)
    def forever(n: int, nap: float) -> int:
        i = 0
        while True:
            i = tick(i) + 1
            pgdurable.sleep(nap)

    @app.step(name="chaos.atick")
    async def atick(i: int, pause: float) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        return i

    @app.workflow(name="chaos.forever_async", max_recoveries=MAX_RECOVERIES, timeout_seconds=FOREVER_TIMEOUT)
    async def forever_async(n: int, pause: float) -> int:
        i = 0
        while True:
            i = await atick(i, pause) + 1

    @app.workflow(name="chaos.forever_parent", max_recoveries=MAX_RECOVERIES)
    def forever_parent(parent_id: str, nap: float) -> int:
        child = app.enqueue(forever, workflow_id=f"{parent_id}.c", n=0, nap=nap)  # inherits our deadline
        return int(child.result())

    # -- steps that hang: the deadline must end their workflows, and the worker must keep serving -----------

    @app.step(name="chaos.block", max_attempts=1)
    def block(n: int) -> int:
        _trace("chaos.block")
        time.sleep(HANG_SECONDS)
        return n

    @app.workflow(name="chaos.hang", max_recoveries=MAX_RECOVERIES)
    def hang(n: int, pause: float = 0.0) -> int:
        return int(block(prepare(n, pause)))

    @app.step(name="chaos.ablock", max_attempts=1)
    async def ablock(n: int) -> int:
        _trace("chaos.ablock")
        try:
            await asyncio.Event().wait()  # nothing ever sets it
        except asyncio.CancelledError:
            _trace("chaos.ablock.cancelled")
            raise
        return n

    @app.workflow(name="chaos.hang_async", max_recoveries=MAX_RECOVERIES)
    async def hang_async(n: int, pause: float = 0.0) -> int:
        return int(await ablock(await afetch(n, pause)))

    # -- steps past their timeout: abandoned (sync) or cancelled (async), then retried ---------------------

    @app.step(name="chaos.timed", timeout=TIMED_STEP_TIMEOUT, max_attempts=5, interval=0)
    def timed_call(n: int) -> int:
        _trace("chaos.timed")
        if _first_attempt_here():
            time.sleep(TIMED_HANG_SECONDS)  # its thread is abandoned at the timeout; its result is ignored
        return expected_timed(n)

    @app.workflow(name="chaos.timed", max_recoveries=MAX_RECOVERIES)
    def timed(n: int, pause: float = 0.0) -> int:
        time.sleep(random.uniform(0, pause))
        return int(timed_call(n))

    @app.step(name="chaos.atimed", timeout=TIMED_STEP_TIMEOUT, max_attempts=5, interval=0)
    async def atimed_call(n: int) -> int:
        _trace("chaos.atimed")
        if _first_attempt_here():
            await asyncio.sleep(TIMED_HANG_SECONDS)  # cancelled at the timeout
        return expected_timed(n)

    @app.workflow(name="chaos.timed_async", max_recoveries=MAX_RECOVERIES)
    async def timed_async(n: int, pause: float = 0.0) -> int:
        await asyncio.sleep(random.uniform(0, pause))
        return int(await atimed_call(n))

    # -- debounced: a burst of enqueues with one key runs once, with the burst's last arguments -------------

    @app.step(name="chaos.settle")
    def settle(n: int) -> int:
        _trace("chaos.settle")
        return expected_debounced(n)

    @app.workflow(name="chaos.debounced", max_recoveries=MAX_RECOVERIES)
    def debounced(n: int, pause: float = 0.0) -> int:
        time.sleep(random.uniform(0, pause))
        return int(settle(n))

    return SimpleNamespace(timed=timed, timed_async=timed_async, debounced=debounced,
                           plain=plain, plain_async=plain_async, transfer=transfer, transfer_async=transfer_async,
                           doomed=doomed, sleeper=sleeper, sleeper_async=sleeper_async, receiver=receiver,
                           receiver_async=receiver_async, parent=parent, parent_async=parent_async,
                           forever=forever, forever_async=forever_async, forever_parent=forever_parent,
                           hang=hang, hang_async=hang_async)


app = pgdurable.App(
    lease_seconds=float(os.environ.get("CHAOS_LEASE", "2.0")),
    sweep_seconds=float(os.environ.get("CHAOS_SWEEP", "0.3")),
    poll_seconds=float(os.environ.get("CHAOS_POLL", "0.5")),
    shutdown_grace_seconds=1.0,
    # A stop that hangs logs every stack and exits with status 1 well before the harness's 20 s deadline, so its
    # report (whose notes quote the log) says what it waited on.
    shutdown_patience_seconds=12.0,
    unknown_workflow_grace_seconds=None,
    # The harness deploys a new application version whenever it has killed every worker at once
    # (PGDURABLE_APP_VERSION per generation): the new workers adopt the old version's executions this soon
    # after the last heartbeat of its workers.
    adopt_after_seconds=float(os.environ.get("CHAOS_ADOPT", "1.0")),
)
workflows = define(app)
