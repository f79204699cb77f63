"""Hooks for metrics and tracing: the engine tells observers what happened, observers export it.

An observer implements any of the methods of ``Observer`` (each a no-op by default). The engine calls them
on the worker's event loop or a workflow thread, right after the fact, so they must be quick and must not
raise (a failing observer is logged and ignored). ``pgdurable.metrics.PrometheusMetrics`` and
``pgdurable.tracing.Tracing`` are the two that ship with pgdurable; register one with ``app.observe(...)``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

log = logging.getLogger("pgdurable.telemetry")


class Observer:
    def claimed(self, queue: str, count: int, seconds: float) -> None:
        """A claim statement on ``queue`` took ``count`` executions in ``seconds``."""

    def workflow_started(self, execution_id: str, name: str, attempt: int, carrier: dict[str, str] | None) -> Any:
        """An attempt of an execution starts on this worker; the return value is handed back below.
        ``carrier`` is the trace context stored when the execution was enqueued (if any)."""
        return None

    def workflow_finished(self, token: Any, execution_id: str, name: str, outcome: str, seconds: float) -> None:
        """The attempt ended: outcome is succeeded, failed, suspended (it waits now) or abandoned (its lease
        was lost, or it was cancelled or timed out)."""

    def step_finished(self, token: Any, name: str, step_id: int, started_at: datetime, ended_at: datetime,
                      failed: bool, attempts: int) -> None:
        """A step ran (it was not replayed) and its outcome was recorded."""

    def swept(self, requeued: int, dead_lettered: int, timed_out: int) -> None:
        """A sweep found expired leases (re-enqueued or dead-lettered) and passed deadlines."""

    def trace_carrier(self, parent: Any = None) -> dict[str, str] | None:
        """The trace context to store with an execution being enqueued now (``parent``: the token of the
        workflow attempt that enqueues it, for a child), or None."""
        return None


class Observers(Observer):
    """Every registered observer, called in turn; one that raises is logged, not propagated."""

    def __init__(self) -> None:
        self.observers: list[Observer] = []

    def __bool__(self) -> bool:
        return bool(self.observers)

    def add(self, observer: Observer) -> None:
        self.observers.append(observer)

    def _each(self, method: str, *args: Any) -> list[Any]:
        results = []
        for observer in self.observers:
            try:
                results.append(getattr(observer, method)(*args))
            except Exception:
                log.exception("observer %r failed in %s", observer, method)
                results.append(None)
        return results

    def claimed(self, queue: str, count: int, seconds: float) -> None:
        self._each("claimed", queue, count, seconds)

    def workflow_started(self, execution_id: str, name: str, attempt: int, carrier: dict[str, str] | None) -> Any:
        return self._each("workflow_started", execution_id, name, attempt, carrier)

    def workflow_finished(self, token: Any, execution_id: str, name: str, outcome: str, seconds: float) -> None:
        for observer, own in zip(self.observers, token or [None] * len(self.observers), strict=False):
            try:
                observer.workflow_finished(own, execution_id, name, outcome, seconds)
            except Exception:
                log.exception("observer %r failed in workflow_finished", observer)

    def step_finished(self, token: Any, name: str, step_id: int, started_at: datetime, ended_at: datetime,
                      failed: bool, attempts: int) -> None:
        for observer, own in zip(self.observers, token or [None] * len(self.observers), strict=False):
            try:
                observer.step_finished(own, name, step_id, started_at, ended_at, failed, attempts)
            except Exception:
                log.exception("observer %r failed in step_finished", observer)

    def swept(self, requeued: int, dead_lettered: int, timed_out: int) -> None:
        self._each("swept", requeued, dead_lettered, timed_out)

    def trace_carrier(self, parent: Any = None) -> dict[str, str] | None:
        for observer, own in zip(self.observers, parent or [None] * len(self.observers), strict=False):
            try:
                carrier = observer.trace_carrier(own)
            except Exception:
                log.exception("observer %r failed in trace_carrier", observer)
                continue
            if carrier:
                return carrier
        return None
