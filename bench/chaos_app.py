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


class ChaosError(Exception):
    """What the always-failing step raises."""


def create(conn: psycopg.Connection[Any], schema: str, accounts: int, balance: int) -> None:
    """The application schema: ``accounts`` accounts (ids 0..accounts-1) holding ``balance`` each, and the log
    of applied effects (deliberately without a unique constraint)."""
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    conn.execute(sql.SQL("CREATE TABLE {}.accounts (id integer PRIMARY KEY, balance bigint NOT NULL)").format(s))
    conn.execute(sql.SQL(
        "CREATE TABLE {}.applied (execution_id text, transfer_id text NOT NULL, step text NOT NULL, "
        "account integer NOT NULL, amount bigint NOT NULL, pid integer NOT NULL, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp())").format(s))
    conn.execute(sql.SQL("INSERT INTO {}.accounts SELECT i, %s FROM generate_series(0, %s) AS i").format(s),
                 (balance, accounts - 1))


def expected_plain(n: int) -> int:
    return ((n + 1) * 2) + 3


def expected_plain_async(n: int) -> int:
    return ((n + 5) * 3) - 1


def expected_transfer(transfer_id: str, source: int, target: int, amount: int) -> str:
    return f"{transfer_id}:{source}->{target}:{amount}"


def _bank() -> sql.Identifier:
    name = os.environ.get("CHAOS_BANK_SCHEMA")
    if not name:
        raise RuntimeError("CHAOS_BANK_SCHEMA is not set: the transactional steps do not know where to write")
    return sql.Identifier(name)


_UPDATE = "UPDATE {bank}.accounts SET balance = balance + %s WHERE id = %s RETURNING balance"
_LOG = ("INSERT INTO {bank}.applied (execution_id, transfer_id, step, account, amount, pid) "
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


def _transaction(app: pgdurable.App, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``app.transaction(name=...)``, typed."""
    decorator: Callable[[Callable[..., Any]], Callable[..., Any]] = app.transaction(name=name)
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

    return SimpleNamespace(plain=plain, plain_async=plain_async, transfer=transfer, transfer_async=transfer_async,
                           doomed=doomed)


app = pgdurable.App(
    lease_seconds=float(os.environ.get("CHAOS_LEASE", "2.0")),
    sweep_seconds=float(os.environ.get("CHAOS_SWEEP", "0.3")),
    poll_seconds=float(os.environ.get("CHAOS_POLL", "0.5")),
    shutdown_grace_seconds=1.0,
    unknown_workflow_grace_seconds=None,
)
workflows = define(app)
