"""A bank for tests that run real worker processes whose transactional steps write an application schema.

Served by ``python -m pgdurable worker tests.apps.bank:app`` (the ``spawn_worker`` fixture sets
PGDURABLE_DATABASE_URL and PGDURABLE_SCHEMA). The rest comes from the environment:

  BANK_SCHEMA   the application schema (made by ``create``) that the steps write; required by the steps
  BANK_LEASE    lease_seconds (default 2.0), which is also the steps' idle_in_transaction_session_timeout
  BANK_SWEEP    sweep_seconds (default 0.3)
  BANK_POLL     poll_seconds (default 0.3)
  BANK_TRACE    file that every run of a step body appends one line to, after its writes:
                ``<transfer_id> <kind> <pid> <time>`` (one O_APPEND write, so lines never interleave)

The schema holds ``accounts (id, balance)`` and ``applied``, one row per effect a step applied
(transfer_id, kind, ...). ``applied`` has no unique constraint on purpose: an effect applied twice shows up
as two rows.

``define(app)`` registers the same workflows on any App, so a test can enqueue with the real definitions.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import sql

import pgdurable


def create(conn: psycopg.Connection[Any], schema: str, accounts: int, balance: int) -> None:
    """Create the bank's schema with ``accounts`` accounts (ids 0..accounts-1) holding ``balance`` each."""
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    conn.execute(sql.SQL("CREATE TABLE {}.accounts (id integer PRIMARY KEY, balance bigint NOT NULL)").format(s))
    conn.execute(sql.SQL(
        "CREATE TABLE {}.applied (transfer_id text NOT NULL, kind text NOT NULL, account integer NOT NULL, "
        "amount bigint NOT NULL, pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ).format(s))
    conn.execute(sql.SQL("INSERT INTO {}.accounts SELECT i, %s FROM generate_series(0, %s) AS i").format(s),
                 (balance, accounts - 1))


def _schema() -> sql.Identifier:
    name = os.environ.get("BANK_SCHEMA")
    if not name:
        raise RuntimeError("BANK_SCHEMA is not set: the bank's steps do not know which schema to write")
    return sql.Identifier(name)


def _q(text: str) -> sql.Composed:
    return sql.SQL(text).format(bank=_schema())


def _trace(transfer_id: str, kind: str) -> None:
    path = os.environ.get("BANK_TRACE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{transfer_id} {kind} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def _apply(conn: psycopg.Connection[Any], transfer_id: str, kind: str, account: int, delta: int) -> int:
    """Change one balance and log the effect; returns the new balance (as seen in this transaction)."""
    row = conn.execute(_q("UPDATE {bank}.accounts SET balance = balance + %s WHERE id = %s RETURNING balance"),
                       (delta, account)).fetchone()
    if row is None:
        raise LookupError(f"no account {account}")
    conn.execute(_q("INSERT INTO {bank}.applied (transfer_id, kind, account, amount, pid) "
                    "VALUES (%s, %s, %s, %s, %s)"), (transfer_id, kind, account, delta, os.getpid()))
    _trace(transfer_id, kind)
    return int(row[0])


def define(app: pgdurable.App) -> SimpleNamespace:
    """Register the bank's workflows and steps on ``app``."""

    # -- transfers: two transactional steps, with random pauses inside their transactions -------------------

    @app.transaction(name="bank.debit")
    def debit(conn: psycopg.Connection[Any], transfer_id: str, account: int, amount: int,
              max_pause: float) -> int:
        time.sleep(random.uniform(0, max_pause))
        balance = _apply(conn, transfer_id, "debit", account, -amount)
        time.sleep(random.uniform(0, max_pause))  # written, not yet committed
        return balance

    @app.transaction(name="bank.credit")
    def credit(conn: psycopg.Connection[Any], transfer_id: str, account: int, amount: int,
               max_pause: float) -> int:
        time.sleep(random.uniform(0, max_pause))
        balance = _apply(conn, transfer_id, "credit", account, amount)
        time.sleep(random.uniform(0, max_pause))
        return balance

    # Many recoveries are expected while workers are being killed; dead-lettering is not under test here.
    @app.workflow(name="bank.transfer", max_recoveries=1000)
    def transfer(transfer_id: str, source: int, target: int, amount: int, max_pause: float = 0.0) -> dict[str, Any]:
        return {"debited": debit(transfer_id, source, amount, max_pause),
                "credited": credit(transfer_id, target, amount, max_pause), "pid": os.getpid()}

    # -- a step that fails after its writes, before commit, the first time (decided by a marker file) ------

    @app.transaction(name="bank.deposit_failing_once", interval=0.1)
    def deposit_failing_once(conn: psycopg.Connection[Any], transfer_id: str, account: int, amount: int,
                             marker: str) -> int:
        balance = _apply(conn, transfer_id, "deposit", account, amount)
        if not Path(marker).exists():
            Path(marker).write_text(f"{os.getpid()} {balance}\n")
            raise ConnectionError("lost the connection after the writes, before commit")
        return balance

    @app.workflow(name="bank.flaky_deposit")
    def flaky_deposit(transfer_id: str, account: int, amount: int, marker: str) -> int:
        return int(deposit_failing_once(transfer_id, account, amount, marker))

    # -- a step that pauses after its writes, the first time (decided by a marker file) --------------------

    @app.transaction(name="bank.deposit_pausing_once")
    def deposit_pausing_once(conn: psycopg.Connection[Any], transfer_id: str, account: int, amount: int,
                             marker: str, pause: float) -> dict[str, Any]:
        balance = _apply(conn, transfer_id, "deposit", account, amount)
        written = time.time()
        if not Path(marker).exists():
            Path(marker).write_text(f"{os.getpid()}\n")  # the test SIGSTOPs this process while it pauses
            until = time.monotonic() + pause
            while time.monotonic() < until:
                # Busy, not idle: unpaused, the transaction never idles long enough for the server to end it.
                conn.execute("SELECT 1")
                time.sleep(0.05)
        return {"pid": os.getpid(), "written_at": written, "balance": balance}

    @app.workflow(name="bank.slow_deposit")
    def slow_deposit(transfer_id: str, account: int, amount: int, marker: str, pause: float) -> dict[str, Any]:
        result: dict[str, Any] = deposit_pausing_once(transfer_id, account, amount, marker, pause)
        return result

    return SimpleNamespace(debit=debit, credit=credit, transfer=transfer, flaky_deposit=flaky_deposit,
                           slow_deposit=slow_deposit)


app = pgdurable.App(
    lease_seconds=float(os.environ.get("BANK_LEASE", "2.0")),
    sweep_seconds=float(os.environ.get("BANK_SWEEP", "0.3")),
    poll_seconds=float(os.environ.get("BANK_POLL", "0.3")),
    shutdown_grace_seconds=1.0,
    unknown_workflow_grace_seconds=None,
)
workflows = define(app)
