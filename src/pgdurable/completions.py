"""Waking those who wait outside workflows (for a result, for an event): one LISTEN connection per
application, so that a wait ends on NOTIFY rather than a poll; and the two drivers of such waits (and of
reads, which hand values out as they wait)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from . import channels, forks
from .db import Database
from .effects import Pause
from .waiting import wait_event

log = logging.getLogger("pgdurable")
T = TypeVar("T")


# An execution's (status, output, error) as its row holds them (output and error: jsonb's text).
Outcome = tuple[str, str | None, str | None]


@dataclass(frozen=True, slots=True)
class Carried:
    """The outcome a "_result" notification carried, and the id of the transaction that committed it."""
    outcome: Outcome
    xid: int

    def sent_after(self, snapshot: str | None) -> bool:
        """Whether that transaction committed after the look that took ``snapshot`` (a pg_snapshot's text,
        "xmin:xmax:xip,..."): it is not visible in it. One visible there finished an earlier run of the
        execution (before a resume), whose notification reached the listener late."""
        if snapshot is None:
            return False
        xmin, xmax, running = snapshot.split(":")
        if self.xid < int(xmin):
            return False
        return self.xid >= int(xmax) or str(self.xid) in running.split(",")


# Called when an execution may have finished, with the outcome when the notification carried it.
Wake = Callable[[Carried | None], None]


def parse_result(payload: str) -> tuple[str, Carried | None]:
    """The execution id and carried outcome of a "_result" notification: a JSON array [id, status, the
    sending transaction's id], a newline, then the output of a success or the error of a failure as stored
    (nothing for NULL); or [id] alone when the outcome did not fit in a payload (see
    notify_execution_change in sql/schema.sql)."""
    header, _, body = payload.partition("\n")
    fields = json.loads(header)
    if len(fields) < 3:
        return fields[0], None
    execution_id, status, xid = fields[0], fields[1], int(fields[2])
    stored = body or None
    outcome: Outcome = (status, stored, None) if status == "succeeded" else (status, None, stored)
    return execution_id, Carried(outcome, xid)


class CompletionListener:
    """One LISTEN connection per application, in a daemon thread, that wakes whoever waits on an execution: for its
    completion (key: its id; the wake is handed the outcome when the notification carries it) or for an event
    it publishes (key: ``event_key(id)``)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._start_afresh()
        forks.forget_in_forked_child(self)

    def _start_afresh(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Wake]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._stopped = threading.Event()

    def _forget_inherited(self) -> list[Any]:
        """In a forked child: the parent's listening thread did not come along (forks.py)."""
        dropped: list[Any] = [self._thread]
        if self._stopped.is_set():  # stays stopped, as in the parent; only its lock may have been held
            self._lock = threading.Lock()
        else:
            self._start_afresh()
        return dropped

    def subscribe(self, execution_id: str, wake: Wake) -> Callable[[], None]:
        """Call ``wake`` whenever the execution may have finished (or, for an event key, published). Returns the
        unsubscribe function."""
        self._ensure_running()
        with self._lock:
            self._waiters.setdefault(execution_id, set()).add(wake)

        def unsubscribe() -> None:
            with self._lock:
                waiters = self._waiters.get(execution_id)
                if waiters is not None:
                    waiters.discard(wake)
                    if not waiters:
                        del self._waiters[execution_id]
        return unsubscribe

    @property
    def listening(self) -> bool:
        """Whether the LISTEN connection is up (an earlier wait started it)."""
        return self._listening.is_set() and not self._stopped.is_set()

    def _ensure_running(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="pgdurable-results", daemon=True)
                self._thread.start()
        # Listening before the caller's first status check means no completion can slip between them.
        self._listening.wait(timeout=10)

    def _wake_all(self) -> None:
        with self._lock:
            callbacks = [cb for waiters in self._waiters.values() for cb in waiters]
        for callback in callbacks:
            callback(None)

    def _loop(self) -> None:
        schema = self._db.schema
        done, result = channels.channel(schema, "done"), channels.channel(schema, "result")
        while not self._stopped.is_set():
            try:
                with self._db.connect() as conn:
                    conn.execute(channels.listen(schema, "done", "result", "event"))
                    self._listening.set()
                    self._wake_all()  # anything may have finished while we were not listening
                    while not self._stopped.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self._wake(*_addressed(notice.channel, notice.payload, done, result))
            except Exception as exc:  # connection lost: waiters fall back to re-checking; reconnect
                if self._stopped.is_set():
                    return
                log.warning("result listener lost its connection (%s); reconnecting", exc)
                self._listening.set()
                time.sleep(1.0)

    def _wake(self, key: str, outcome: Carried | None) -> None:
        with self._lock:
            callbacks = list(self._waiters.get(key, ()))
        for callback in callbacks:
            callback(outcome)

    def stop(self) -> None:
        self._stopped.set()


def _addressed(channel: str, payload: str, done: str, result: str) -> tuple[str, Carried | None]:
    """Whom a notification wakes (a waiter's key) and the outcome it carries."""
    if channel == result:
        try:
            return parse_result(payload)
        except (ValueError, IndexError, TypeError):  # not one the trigger sends: wakes nobody (waits re-check)
            log.warning("ignored a malformed result notification: %.80r", payload)
            return "", None
    return (payload, None) if channel == done else (event_key(payload), None)


def event_key(execution_id: str) -> str:
    return f"event:{execution_id}"


# ---- waiting outside workflows: one plan, two drivers ---------------------------------------------------------
# A wait for something another process finishes (a result, an event) is written once as a plan that yields
# store.Calls (read the database), Listen (subscribe to its notifications), Nap (sleep until notified or
# the time is up; the plan is sent the outcome a notification carried, else None) and Pause (back off after
# a lost connection); wait_sync and wait_async run it. A reader of what another process writes as it goes
# (a stream) is such a plan too, that also yields Emit (values for its reader): read_sync and read_async run
# it, handing those values out; the waits are reads that emit nothing.

@dataclass(frozen=True, slots=True)
class Listen:
    """Subscribe to the notifications of ``key``; the plan is sent whether it subscribed. With
    ``if_listening``, only if the application's listener already listens (subscribing then costs nothing;
    otherwise a wait that may end at its first look need not start the listener)."""
    key: str
    if_listening: bool = False


@dataclass(frozen=True, slots=True)
class Nap:
    seconds: float


@dataclass(frozen=True, slots=True)
class Emit:
    values: list[Any]


def wait_sync(db: Database, listener: CompletionListener, plan: Generator[Any, Any, T]) -> T:
    outcome: list[T] = []
    for _ in read_sync(db, listener, _kept(plan, outcome)):
        pass
    return outcome[0]


async def wait_async(db: Database, listener: CompletionListener, plan: Generator[Any, Any, T]) -> T:
    outcome: list[T] = []
    async for _ in read_async(db, listener, _kept(plan, outcome)):
        pass
    return outcome[0]


def _kept(plan: Generator[Any, Any, T], outcome: list[T]) -> Generator[Any, Any, None]:
    outcome.append((yield from plan))


def read_sync(db: Database, listener: CompletionListener, plan: Generator[Any, Any, Any]) -> Iterator[Any]:
    woken = threading.Event()
    carried: list[Carried] = []  # what notifications carried since the last nap

    def wake(outcome: Carried | None) -> None:
        if outcome is not None:
            carried.append(outcome)
        woken.set()

    unsubscribes: list[Callable[[], None]] = []
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = plan.throw(error) if error is not None else plan.send(result)
            except StopIteration:
                return
            result, error = None, None
            if isinstance(effect, Emit):
                yield from effect.values
            elif isinstance(effect, Listen):
                if not effect.if_listening or listener.listening:
                    unsubscribes.append(listener.subscribe(effect.key, wake))
                    result = True
                else:
                    result = False
            elif isinstance(effect, Nap):
                woken.wait(effect.seconds)
                woken.clear()
                result = _latest(carried)
            elif isinstance(effect, Pause):
                time.sleep(effect.seconds)
            else:
                try:
                    result = db.run(effect)
                except Exception as exc:
                    error = exc
    finally:
        _unsubscribe(unsubscribes)


async def read_async(db: Database, listener: CompletionListener,
                     plan: Generator[Any, Any, Any]) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    carried: list[Carried] = []  # what notifications carried since the last nap
    unsubscribes: list[Callable[[], None]] = []
    result: Any = None
    error: BaseException | None = None

    def woke(outcome: Carried | None) -> None:
        if outcome is not None:
            carried.append(outcome)
        woken.set()

    def wake(outcome: Carried | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(woke, outcome)

    try:
        while True:
            try:
                effect = plan.throw(error) if error is not None else plan.send(result)
            except StopIteration:
                return
            result, error = None, None
            if isinstance(effect, Emit):
                for value in effect.values:
                    yield value
            elif isinstance(effect, Listen):
                if listener.listening:  # subscribing does not block
                    unsubscribes.append(listener.subscribe(effect.key, wake))
                    result = True
                elif not effect.if_listening:  # the first subscription waits for the listener to connect
                    unsubscribes.append(await asyncio.to_thread(listener.subscribe, effect.key, wake))
                    result = True
                else:
                    result = False
            elif isinstance(effect, Nap):
                await wait_event(woken, effect.seconds)
                woken.clear()
                result = _latest(carried)
            elif isinstance(effect, Pause):
                await asyncio.sleep(effect.seconds)
            else:
                try:
                    result = await db.arun(effect)
                except Exception as exc:
                    error = exc
    finally:
        _unsubscribe(unsubscribes)


def _latest(carried: list[Carried]) -> Carried | None:
    """The outcome the last notification carried, if any; the list is emptied. (A plan waits for one
    execution's completion; the latest is its last run's.)"""
    outcome = carried[-1] if carried else None
    carried.clear()
    return outcome


def _unsubscribe(unsubscribes: list[Callable[[], None]]) -> None:
    for unsubscribe in unsubscribes:
        unsubscribe()
