"""OpenTelemetry tracing (``pip install 'pgdurable[tracing]'``): a span per workflow attempt with a child
span per step, in the trace of the code that enqueued the workflow.

``app.observe(Tracing())`` uses the global tracer provider, which your application configures with the
OpenTelemetry SDK and exporter of its choice. When an execution is enqueued inside a span, the span's
context (W3C ``traceparent``) is stored with it (``workflow_executions.trace_context``); the worker that runs
it starts the workflow's span as a child of that context, so one trace shows the request and the workflow
it started, across processes. Children of a workflow join the parent workflow's trace.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .telemetry import Observer


class Tracing(Observer):
    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("pgdurable", tracer_provider=tracer_provider)

    def trace_carrier(self, parent: Any = None) -> dict[str, str] | None:
        carrier: dict[str, str] = {}
        ctx = trace.set_span_in_context(parent) if isinstance(parent, Span) else context.get_current()
        propagate.inject(carrier, context=ctx)
        return carrier or None

    def workflow_started(self, execution_id: str, name: str, attempt: int, carrier: dict[str, str] | None) -> Any:
        parent = propagate.extract(carrier) if carrier else None
        return self.tracer.start_span(
            f"workflow {name}", context=parent, kind=SpanKind.CONSUMER,
            attributes={"pgdurable.workflow.id": execution_id, "pgdurable.workflow.name": name,
                        "pgdurable.workflow.attempt": attempt})

    def workflow_finished(self, token: Any, execution_id: str, name: str, outcome: str, seconds: float) -> None:
        if not isinstance(token, Span):
            return
        token.set_attribute("pgdurable.workflow.outcome", outcome)
        if outcome == "failed":
            token.set_status(Status(StatusCode.ERROR))
        token.end()

    def step_finished(self, token: Any, name: str, step_id: int, started_at: datetime, ended_at: datetime,
                      failed: bool, attempts: int) -> None:
        if not isinstance(token, Span):
            return
        span = self.tracer.start_span(
            f"step {name}", context=trace.set_span_in_context(token), start_time=_ns(started_at),
            attributes={"pgdurable.step.id": step_id, "pgdurable.step.name": name,
                        "pgdurable.step.attempts": attempts})
        if failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=_ns(ended_at))


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)
