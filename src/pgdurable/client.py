"""Handles on executions, and waiting for results woken by NOTIFY rather than a polling interval."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from . import store
from .completions import Carried, Listen, Nap, wait_async, wait_sync
from .context import current
from .dberrors import transient
from .effects import Pause
from .errors import ResultTimeout, WorkflowNotFound, outcome_error
from .primitives import gather, gather_async

if TYPE_CHECKING:
    from .runtime import Runtime

# An execution's (status, output, error), or None when there is no such execution.
Status = tuple[Any, ...] | None
log = logging.getLogger("pgdurable")
R = TypeVar("R")

# Waiters re-check the row this often even without a notification: a safety net, not the latency.
_RECHECK_SECONDS = 5.0
# A waiter whose status check lost its connection retries after this long, doubling up to a second.
_RETRY_FIRST_SECONDS = 0.05


class WorkflowHandle(Generic[R]):
    """A reference to one execution: its id, status and (eventually) result."""

    def __init__(self, runtime: Runtime, workflow_id: str, return_hint: Any = Any) -> None:
        self.runtime = runtime
        self.workflow_id = workflow_id
        self._return_hint = return_hint

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.workflow_id}>"

    # -- sync ---------------------------------------------------------------------------------------------

    def status(self) -> str:
        return self.get().status

    def get(self) -> store.executions.Execution:
        execution = self.runtime.db.run(store.executions.get_execution(self.workflow_id))
        if execution is None:
            raise WorkflowNotFound(self.workflow_id)
        return execution

    def result(self, timeout: float | None = None) -> R:
        """Wait for the workflow to finish; return its result or raise ``WorkflowFailed``.

        Inside a workflow the wait is durable: the waiting workflow gives up its worker slot, is woken when
        the awaited one (typically its child) finishes, and the outcome is recorded as a step.
        """
        if current() is not None:
            value: R = gather([self], timeout)[0]
            return value
        return self._decode(wait_sync(self.runtime.db, self.runtime.completions, self._finished(timeout)))

    def cancel(self) -> bool:
        return self.runtime.db.run(store.executions.cancel(self.workflow_id))

    # -- async --------------------------------------------------------------------------------------------

    async def status_async(self) -> str:
        return (await self.get_async()).status

    async def get_async(self) -> store.executions.Execution:
        execution = await self.runtime.db.arun(store.executions.get_execution(self.workflow_id))
        if execution is None:
            raise WorkflowNotFound(self.workflow_id)
        return execution

    async def result_async(self, timeout: float | None = None) -> R:
        if current() is not None:
            value: R = (await gather_async([self], timeout))[0]
            return value
        return self._decode(await wait_async(self.runtime.db, self.runtime.completions, self._finished(timeout)))

    async def cancel_async(self) -> bool:
        return await self.runtime.db.arun(store.executions.cancel(self.workflow_id))

    # -- shared -------------------------------------------------------------------------------------------

    def _finished(self, timeout: float | None) -> Generator[Any, Any, tuple[Any, ...]]:
        """The wait for the outcome, written once for both drivers. Listening already: subscribe, then one
        look, which registers an unfinished execution as awaited (only then does its completion notify).
        Not yet: look first, and only if it is unfinished listen and look again, registering (a completion
        between the two looks is seen by the second). Then sleep until notified or the re-check interval,
        and look, until the deadline; a notification that carried the outcome of a run that ended after the
        registering look spares the look."""
        deadline = None if timeout is None else time.monotonic() + timeout
        subscribed = yield Listen(self.workflow_id, if_listening=True)
        look = store.executions.await_status if subscribed else store.executions.get_status
        outcome = yield from self._status(deadline, look)
        if not subscribed and not self._is_final(outcome):
            yield Listen(self.workflow_id)
            outcome = yield from self._status(deadline, store.executions.await_status)
        # The snapshot of the look that registered the wait: only an outcome committed after it is this wait's.
        seen = outcome[3] if outcome is not None and len(outcome) > 3 else None
        while not self._is_final(outcome):
            if deadline is not None and deadline - time.monotonic() <= 0:
                raise ResultTimeout((yield from self._timeout_message(timeout)))
            carried: Carried | None = yield Nap(self._wait_time(deadline))
            if carried is not None and carried.sent_after(seen):
                outcome = carried.outcome
            else:
                outcome = yield from self._status(deadline, store.executions.get_status)
        assert outcome is not None
        return outcome[:3]

    def _timeout_message(self, timeout: float | None) -> Generator[Any, Any, str]:
        """Why the wait timed out, saying so when no live worker could have run it (a queue nobody serves)."""
        message = f"workflow {self.workflow_id} did not finish within {timeout:g} s"
        try:
            found: store.executions.Unserved | None = yield store.executions.unserved(self.workflow_id)
        except psycopg.Error:
            found = None
        if found is None or found.status != "enqueued" or (found.served and found.known):
            return f"{message}; it keeps running"
        if not found.served:
            return (f"{message}: it is enqueued, and no live worker serves queue {found.queue!r} (a worker serves "
                    "the queues given with --queue, else every queue its app declares); it runs when one does")
        return (f"{message}: it is enqueued, and no live worker on queue {found.queue!r} knows workflow "
                f"{found.name!r}; it runs when one does")

    def _status(self, deadline: float | None, look: Callable[[str], store.Call[Status]] = store.executions.get_status,
                ) -> Generator[Any, Any, Status]:
        """The execution's status row. A lost connection (a server restart, a terminated backend, on Citus a
        worker node down) is not the workflow's outcome: the pool replaces the connection, and the wait goes on
        until the deadline."""
        delay = _RETRY_FIRST_SECONDS
        while True:
            try:
                row: Status = yield look(self.workflow_id)
                return row
            except psycopg.Error as exc:
                if not transient(exc) or (deadline is not None and time.monotonic() + delay > deadline):
                    raise
                log.info("waiting for %s: status check failed (%s); retrying", self.workflow_id, exc)
                yield Pause(delay)
                delay = min(delay * 2, 1.0)

    def _is_final(self, outcome: tuple[Any, ...] | None) -> bool:
        if outcome is None:
            raise WorkflowNotFound(self.workflow_id)
        return outcome[0] in store.executions.TERMINAL

    def _wait_time(self, deadline: float | None) -> float:
        if deadline is None:
            return _RECHECK_SECONDS
        return max(0.0, min(deadline - time.monotonic(), _RECHECK_SECONDS))

    def _decode(self, outcome: tuple[Any, ...] | None) -> R:
        assert outcome is not None
        status, output, error = outcome
        if status == "succeeded":
            value: R = self.runtime.serializer.loads(output or "null", self._return_hint)
            return value
        info = json.loads(error) if error else None
        raise outcome_error(self.workflow_id, status, info)
