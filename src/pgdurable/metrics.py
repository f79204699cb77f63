"""Prometheus metrics (``pip install 'pgdurable[metrics]'``): ``pgdurable worker ... --metrics-port 9100``,
or ``app.observe(PrometheusMetrics(app))`` and expose ``metrics.registry`` yourself.

Counters and histograms come from this process's workers; queue depth, oldest waiting age and executions
by status are read from the database when scraped (one small query), so any process can export them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import store
from .telemetry import Observer

if TYPE_CHECKING:
    from .app import App

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)


class PrometheusMetrics(Observer):
    def __init__(self, app: App, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.started = Counter("pgdurable_workflows_started", "Workflow attempts started by this process",
                               ["workflow"], registry=self.registry)
        self.finished = Counter("pgdurable_workflows_finished",
                                "Workflow attempts ended by this process, by outcome (succeeded, failed, "
                                "suspended, abandoned)", ["workflow", "outcome"], registry=self.registry)
        self.workflow_seconds = Histogram("pgdurable_workflow_attempt_seconds", "Duration of workflow attempts",
                                          ["workflow"], buckets=_DURATION_BUCKETS, registry=self.registry)
        self.step_seconds = Histogram("pgdurable_step_seconds", "Duration of steps that ran (not replayed)",
                                      ["step", "failed"], buckets=_DURATION_BUCKETS, registry=self.registry)
        self.claim_seconds = Histogram("pgdurable_claim_seconds", "Duration of claim statements", ["queue"],
                                       buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.claimed_total = Counter("pgdurable_claimed", "Executions claimed", ["queue"], registry=self.registry)
        self.lease_expiries = Counter("pgdurable_lease_expiries", "Expired leases swept, by result",
                                      ["result"], registry=self.registry)
        self.timeouts = Counter("pgdurable_deadlines_expired", "Executions failed by their deadline",
                                registry=self.registry)
        self.registry.register(_DatabaseCollector(app))

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose /metrics over HTTP from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)

    def claimed(self, queue: str, count: int, seconds: float) -> None:
        self.claim_seconds.labels(queue).observe(seconds)
        if count:
            self.claimed_total.labels(queue).inc(count)

    def workflow_started(self, execution_id: str, name: str, attempt: int, carrier: dict[str, str] | None) -> Any:
        self.started.labels(name).inc()
        return None

    def workflow_finished(self, token: Any, execution_id: str, name: str, outcome: str, seconds: float) -> None:
        self.finished.labels(name, outcome).inc()
        self.workflow_seconds.labels(name).observe(seconds)

    def step_finished(self, token: Any, name: str, step_id: int, started_at: datetime, ended_at: datetime,
                      failed: bool, attempts: int) -> None:
        self.step_seconds.labels(name, "true" if failed else "false").observe(
            max((ended_at - started_at).total_seconds(), 0.0))

    def swept(self, requeued: int, dead_lettered: int, timed_out: int) -> None:
        if requeued:
            self.lease_expiries.labels("requeued").inc(requeued)
        if dead_lettered:
            self.lease_expiries.labels("dead_lettered").inc(dead_lettered)
        if timed_out:
            self.timeouts.inc(timed_out)


class _DatabaseCollector(Collector):
    """Gauges read from the database at scrape time."""

    def __init__(self, app: App) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily("pgdurable_queue_depth", "Executions by queue and status (unfinished)",
                                  labels=["queue", "status"])
        age = GaugeMetricFamily("pgdurable_queue_oldest_enqueued_seconds",
                                "Age of the oldest enqueued execution per queue", labels=["queue"])
        for row in self.app.db.run(store.queues.queue_depths()):
            depth.add_metric([row.queue, row.status], row.count)
            if row.status == "enqueued" and row.oldest_seconds is not None:
                age.add_metric([row.queue], row.oldest_seconds)
        yield depth
        yield age
