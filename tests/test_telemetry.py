"""Metrics (Prometheus) and tracing (OpenTelemetry): what a worker reports while it runs real workflows."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pgdurable
from pgdurable.metrics import PrometheusMetrics
from pgdurable.tracing import Tracing
from tests.harness import WAIT, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_metrics_count_workflows_steps_claims_and_queue_depth(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    metrics = PrometheusMetrics(app)
    app.observe(metrics)

    @app.step()
    def ok(x: int) -> int:
        return x

    @app.step(max_attempts=1)
    def broken() -> None:
        raise RuntimeError("no")

    @app.workflow()
    def good(x: int) -> int:
        return ok(x) + ok(x)

    @app.workflow()
    def bad() -> None:
        broken()

    @app.workflow(queue="parked")
    def parked() -> None:
        return None

    start_worker(app, queues=["default"])
    for i in range(3):
        assert app.enqueue(good, i).result(timeout=WAIT) == 2 * i
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(bad).result(timeout=WAIT)
    app.enqueue(parked)  # nobody serves "parked": it shows in the queue depth
    value = metrics.registry.get_sample_value
    # The worker counts an attempt just after its result is committed (which is what woke result()).
    wait_for(lambda: value("pgdurable_workflows_finished_total", {"workflow": "bad", "outcome": "failed"}), WAIT,
             "the last attempt to be counted")
    assert value("pgdurable_workflows_started_total", {"workflow": "good"}) == 3
    assert value("pgdurable_workflows_finished_total", {"workflow": "good", "outcome": "succeeded"}) == 3
    assert value("pgdurable_workflows_finished_total", {"workflow": "bad", "outcome": "failed"}) == 1
    assert value("pgdurable_step_seconds_count", {"step": "ok", "failed": "false"}) == 6
    assert value("pgdurable_step_seconds_count", {"step": "broken", "failed": "true"}) == 1
    assert value("pgdurable_claimed_total", {"queue": "default"}) == 4
    assert value("pgdurable_queue_depth", {"queue": "parked", "status": "enqueued"}) == 1
    assert value("pgdurable_queue_oldest_enqueued_seconds", {"queue": "parked"}) >= 0

    port = free_port()
    metrics.serve(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT).read().decode()
    assert 'pgdurable_workflows_started_total{workflow="good"} 3.0' in body
    assert "pgdurable_claim_seconds_bucket" in body


def test_a_trace_spans_the_request_the_workflow_its_steps_and_its_children(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.observe(Tracing(provider))

    @app.step()
    def work(x: int) -> int:
        return x + 1

    @app.workflow()
    def child(x: int) -> int:
        pgdurable.sleep(0.3)  # so that its parent surely waits for it (and suspends)
        return work(x)

    @app.workflow()
    def parent(x: int) -> int:
        first = work(x)
        return int(app.enqueue(child, first).result())

    start_worker(app)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("http request") as request:
        handle = app.enqueue(parent, 1)
    assert handle.result(timeout=WAIT) == 3
    # The attempt's span ends just after its result is committed (which is what woke result()).
    wait_for(lambda: len([s for s in exporter.get_finished_spans() if s.name == "workflow parent"]) == 2, WAIT,
             "the parent's last span to end")
    spans = exporter.get_finished_spans()
    trace_ids = {s.context.trace_id for s in spans}
    assert trace_ids == {request.get_span_context().trace_id}  # one trace, across the worker and the child
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    parent_attempts = by_name["workflow parent"]
    assert len(parent_attempts) == 2  # it suspended while its child ran, then resumed
    assert {a.attributes["pgdurable.workflow.outcome"] for a in parent_attempts} == {"suspended", "succeeded"}
    assert all(a.parent.span_id == request.get_span_context().span_id for a in parent_attempts)
    child_attempts = by_name["workflow child"]
    assert {a.attributes["pgdurable.workflow.outcome"] for a in child_attempts} == {"suspended", "succeeded"}
    assert all(c.parent.span_id in {a.context.span_id for a in parent_attempts} for c in child_attempts)
    step_parents = {s.parent.span_id for s in by_name["step work"]}
    assert step_parents <= {a.context.span_id for a in [*parent_attempts, *child_attempts]}
    assert len(by_name["step work"]) == 2
