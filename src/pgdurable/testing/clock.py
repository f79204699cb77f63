"""The time-skipping clock of a test schema.

Durable time (``clock_now()`` in SQL: timers, delayed starts, deadlines, cron ticks, retention, recorded
times) runs ``test_clock.ahead`` ahead of the database's ``now()`` on a schema where ``enable`` was called.
``Skipper`` moves it: whenever nothing can happen before the schema's next timer (no execution runs, none is
due), it jumps the clock to that timer, so a three-day sleep ends as soon as the workers get to it.
Liveness time (leases, heartbeats) is never moved: a jump cannot expire a live lease.

Every move holds off the writers of executions for its few milliseconds (``test_clock_lock``), so that a
transaction timed by the old clock cannot commit after the jump.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

import psycopg

from .. import store
from ..db import configure

log = logging.getLogger("pgdurable.testing")

# How long a move waits for writers of executions to finish; past it the move is tried again later.
_LOCK_TIMEOUT_MS = 200


def _call(name: str, **params: Any) -> store.Call[Any]:
    return store.Call(name, params, lambda rows: rows[0] if rows else None)


def enable(conn: psycopg.Connection[Any]) -> None:
    """Put the schema on ``conn``'s search_path on the test clock (the schema's owner only)."""
    store.run(conn, _call("test_clock_enable"))


def now(conn: psycopg.Connection[Any]) -> datetime:
    """Durable time on the schema of ``conn``."""
    return store.run(conn, store.Call("database_now", {}, lambda rows: rows[0][0]))  # type: ignore[no-any-return]


def advance(conn: psycopg.Connection[Any], seconds: float) -> datetime:
    """Move durable time forward by ``seconds`` and wake what became due; returns the new time. ``conn`` is
    an autocommit connection on the schema."""
    with conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{_LOCK_TIMEOUT_MS * 10}ms",))
        store.run(conn, _call("test_clock_lock"))
        moved: datetime = store.run(conn, _call("test_clock_advance", seconds=seconds))[0]
        store.run(conn, _call("test_clock_moved"))
    _wake(conn)
    return moved


def skip_if_idle(conn: psycopg.Connection[Any]) -> datetime | None:
    """If nothing can happen before the schema's next timer, move durable time to it and wake what became
    due; returns the new time, or None when the clock stayed."""
    target, _ = store.run(conn, _call("test_clock_idle_until"))
    if target is None:
        return None
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{_LOCK_TIMEOUT_MS}ms",))
            store.run(conn, _call("test_clock_lock"))
            # Looked at again under the lock: what was idle a moment ago may not be any more.
            target, _ = store.run(conn, _call("test_clock_idle_until"))
            if target is None:
                return None
            moved: datetime = store.run(conn, _call("test_clock_move_to", at=target))[0]
            store.run(conn, _call("test_clock_moved"))
    except psycopg.errors.LockNotAvailable:
        return None  # writers are busy: something is happening, and the next look decides
    _wake(conn)
    return moved


def _wake(conn: psycopg.Connection[Any]) -> None:
    """Do at once what the workers' timer and the leader's deadline check would do at their next look."""
    store.run(conn, store.claims.wake_due())
    store.run(conn, store.claims.expire_deadlines())


class Skipper:
    """A thread that skips the clock of one schema whenever it is idle (see ``skip_if_idle``)."""

    def __init__(self, conninfo: str, schema: str, interval: float = 0.02) -> None:
        self.conninfo = conninfo
        self.schema = schema
        self.interval = interval
        self.skips = 0  # how many times the clock jumped
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"pgdurable-skipper:{schema}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _main(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(self.interval):
            if self.paused.is_set():
                continue
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.conninfo, autocommit=True)
                    configure(conn, self.schema)
                if skip_if_idle(conn) is not None:
                    self.skips += 1
            except Exception as exc:  # a test's worker being stopped, a dropped connection: look again
                log.debug("time skipping on %s: %s", self.schema, exc)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
