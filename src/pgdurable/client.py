"""Handles on executions, and waiting for results woken by NOTIFY rather than a polling interval."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from . import channels, store
from .context import current
from .errors import ResultTimeout, WorkflowCancelled, WorkflowFailed, WorkflowNotFound, WorkflowTimeout

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("pgdurable")
R = TypeVar("R")

# Waiters re-check the row this often even without a notification: a safety net, not the latency.
_RECHECK_SECONDS = 5.0
# A waiter whose status check lost its connection retries after this long, doubling up to a second.
_RETRY_FIRST_SECONDS = 0.05


class CompletionListener:
    """One LISTEN connection per App, in a daemon thread, that wakes whoever waits on an execution: for its
    completion (key: its id) or for an event it publishes (key: ``event_key(id)``)."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._stopped = threading.Event()

    def subscribe(self, execution_id: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever the execution may have finished. Returns the unsubscribe function."""
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
            callback()

    def _loop(self) -> None:
        schema = self._app.db.schema
        done = channels.channel(schema, "done")
        while not self._stopped.is_set():
            try:
                with self._app.db.connect() as conn:
                    conn.execute(channels.listen(schema, "done", "event"))
                    self._listening.set()
                    self._wake_all()  # anything may have finished while we were not listening
                    while not self._stopped.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            key = notice.payload if notice.channel == done else event_key(notice.payload)
                            with self._lock:
                                callbacks = list(self._waiters.get(key, ()))
                            for callback in callbacks:
                                callback()
            except Exception as exc:  # connection lost: waiters fall back to re-checking; reconnect
                if self._stopped.is_set():
                    return
                log.warning("result listener lost its connection (%s); reconnecting", exc)
                self._listening.set()
                time.sleep(1.0)

    def stop(self) -> None:
        self._stopped.set()


def event_key(execution_id: str) -> str:
    return f"event:{execution_id}"


class WorkflowHandle(Generic[R]):
    """A reference to one execution: its id, status and (eventually) result."""

    def __init__(self, app: App, workflow_id: str, return_hint: Any = Any) -> None:
        self.app = app
        self.workflow_id = workflow_id
        self._return_hint = return_hint

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.workflow_id}>"

    # -- sync ---------------------------------------------------------------------------------------------

    def status(self) -> str:
        return self.get().status

    def get(self) -> store.Execution:
        execution = self.app.db.run(store.get_execution(self.workflow_id))
        if execution is None:
            raise WorkflowNotFound(self.workflow_id)
        return execution

    def result(self, timeout: float | None = None) -> R:
        """Wait for the workflow to finish; return its result or raise ``WorkflowFailed``.

        Inside a workflow the wait is durable: the waiting workflow gives up its worker slot, is woken when
        the awaited one (typically its child) finishes, and the outcome is recorded as a step.
        """
        if current() is not None:
            from .waits import gather

            value: R = gather([self], timeout)[0]
            return value
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = self._status(deadline)
        if self._is_final(outcome):  # already finished: no need to listen
            return self._decode(outcome)
        finished = threading.Event()
        # Subscribe, then look again: a completion between the two checks is seen by one of them.
        unsubscribe = self.app.completions.subscribe(self.workflow_id, finished.set)
        try:
            while True:
                outcome = self._status(deadline)
                if self._is_final(outcome):
                    return self._decode(outcome)
                finished.wait(self._wait_time(deadline))
                finished.clear()
        finally:
            unsubscribe()

    def _status(self, deadline: float | None) -> tuple[Any, ...] | None:
        """The execution's status row. A lost connection (a server restart, a terminated backend) is not the
        workflow's outcome: the pool replaces the connection, and the wait goes on until the deadline."""
        delay = _RETRY_FIRST_SECONDS
        while True:
            try:
                return self.app.db.run(store.get_status(self.workflow_id))
            except psycopg.OperationalError as exc:
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                log.info("waiting for %s: status check failed (%s); retrying", self.workflow_id, exc)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def cancel(self) -> bool:
        return self.app.cancel(self.workflow_id)

    # -- async --------------------------------------------------------------------------------------------

    async def status_async(self) -> str:
        return (await self.get_async()).status

    async def get_async(self) -> store.Execution:
        execution = await self.app.db.arun(store.get_execution(self.workflow_id))
        if execution is None:
            raise WorkflowNotFound(self.workflow_id)
        return execution

    async def result_async(self, timeout: float | None = None) -> R:
        if current() is not None:
            from .waits import gather_async

            value: R = (await gather_async([self], timeout))[0]
            return value
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = await self._status_async(deadline)
        if self._is_final(outcome):
            return self._decode(outcome)
        loop = asyncio.get_running_loop()
        finished = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(finished.set)

        unsubscribe = await asyncio.to_thread(self.app.completions.subscribe, self.workflow_id, wake)
        try:
            while True:
                outcome = await self._status_async(deadline)
                if self._is_final(outcome):
                    return self._decode(outcome)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), self._wait_time(deadline))
                finished.clear()
        finally:
            unsubscribe()

    async def _status_async(self, deadline: float | None) -> tuple[Any, ...] | None:
        delay = _RETRY_FIRST_SECONDS
        while True:
            try:
                return await self.app.db.arun(store.get_status(self.workflow_id))
            except psycopg.OperationalError as exc:
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                log.info("waiting for %s: status check failed (%s); retrying", self.workflow_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def cancel_async(self) -> bool:
        return await self.app.cancel_async(self.workflow_id)

    # -- shared -------------------------------------------------------------------------------------------

    def _is_final(self, outcome: tuple[Any, ...] | None) -> bool:
        if outcome is None:
            raise WorkflowNotFound(self.workflow_id)
        return outcome[0] in store.TERMINAL

    def _wait_time(self, deadline: float | None) -> float:
        if deadline is None:
            return _RECHECK_SECONDS
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ResultTimeout(f"workflow {self.workflow_id} did not finish in time; it keeps running")
        return min(remaining, _RECHECK_SECONDS)

    def _decode(self, outcome: tuple[Any, ...] | None) -> R:
        assert outcome is not None
        status, output, error = outcome
        if status == "succeeded":
            value: R = self.app.serializer.loads(output or "null", self._return_hint)
            return value
        info = json.loads(error) if error else None
        raise failure(self.workflow_id, status, info)


def failure(workflow_id: str, status: str, info: dict[str, Any] | None) -> WorkflowFailed:
    """The exception a waiter gets for an execution that ended ``status`` with error ``info``."""
    if status == "cancelled":
        return WorkflowCancelled(workflow_id, status, info)
    if info and info.get("type") == "pgdurable.WorkflowTimeout":
        return WorkflowTimeout(workflow_id, status, info)
    return WorkflowFailed(workflow_id, status, info)
