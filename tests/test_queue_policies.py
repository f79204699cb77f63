"""Queue policies enforced in SQL across workers: global concurrency, per-worker concurrency, rate limits,
per-key concurrency (fairness between tenants), and deduplication keys."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.harness import WAIT, wait_for


def intervals(app: pgdurable.App, queue: str) -> list[tuple[datetime, datetime, str | None]]:
    """When each execution of the queue ran: from its claim to its completion. Only executions that ran in one
    attempt: one whose lease ran out on a machine too busy to heartbeat in time (its slot is free again once
    it is swept) keeps its first started_at, so its span would cover its later attempt's neighbours too."""
    with psycopg.connect(app.db.conninfo) as conn:
        rows = conn.execute(sql.SQL("SELECT started_at, completed_at, concurrency_key FROM {}.workflow_executions "
                                    "WHERE queue = %s AND attempt = 1 AND recoveries = 0").format(
                                        sql.Identifier(app.schema)), (queue,)).fetchall()
    return [(a, b, k) for a, b, k in rows]


def recovered(app: pgdurable.App, queue: str) -> int:
    with psycopg.connect(app.db.conninfo) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.workflow_executions WHERE queue = %s "
                                   "AND (attempt > 1 OR recoveries > 0)").format(sql.Identifier(app.schema)),
                           (queue,)).fetchone()
    return int(row[0]) if row else 0


def max_overlap(spans: list[tuple[datetime, datetime, str | None]]) -> int:
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans],
                    key=lambda e: (e[0], e[1]))  # an end at the same instant as a start comes first
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def define_sleepers(app: pgdurable.App, queue: str, seconds: float) -> Any:
    @app.step()
    def hold() -> None:
        time.sleep(seconds)

    @app.workflow(queue=queue)
    def job(i: int) -> int:
        hold()
        return i

    return job


def test_global_concurrency_limit_holds_across_workers(app: pgdurable.App,
                                                       start_worker: Callable[..., Any]) -> None:
    app.queue("limited", concurrency=3)
    job = define_sleepers(app, "limited", 0.15)
    for _ in range(3):
        start_worker(app, concurrency=8)  # 24 slots in all, 3 may run
    handles = [app.enqueue(job, i) for i in range(24)]
    assert [h.result(timeout=WAIT) for h in handles] == list(range(24))
    spans = intervals(app, "limited")
    assert max_overlap(spans) <= 3  # never more
    if not recovered(app, "limited"):
        assert max_overlap(spans) == 3  # and the limit is actually used


def test_per_worker_concurrency(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    app.queue("per-worker", worker_concurrency=2)
    job = define_sleepers(app, "per-worker", 0.1)
    start_worker(app, concurrency=16)
    handles = [app.enqueue(job, i) for i in range(10)]
    assert [h.result(timeout=WAIT) for h in handles] == list(range(10))
    assert max_overlap(intervals(app, "per-worker")) <= 2
    if not recovered(app, "per-worker"):
        assert max_overlap(intervals(app, "per-worker")) == 2


def test_rate_limit_is_a_sliding_window(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    app.queue("rated", rate_limit=4, rate_period=1.0)
    job = define_sleepers(app, "rated", 0.0)
    start_worker(app, concurrency=8)
    start_worker(app, concurrency=8)
    began = time.monotonic()
    handles = [app.enqueue(job, i) for i in range(12)]
    assert [h.result(timeout=WAIT) for h in handles] == list(range(12))
    assert time.monotonic() - began >= 2.0  # 12 starts at 4 per second: three windows
    starts = sorted(start for start, _, _ in intervals(app, "rated"))
    for i, start in enumerate(starts):
        in_window = [s for s in starts[i:] if s < start + timedelta(seconds=1.0)]
        assert len(in_window) <= 4


def test_key_concurrency_gives_each_tenant_one_slot(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    app.queue("tenants", key_concurrency=1)
    job = define_sleepers(app, "tenants", 0.1)
    start_worker(app, concurrency=8)
    start_worker(app, concurrency=8)
    # Tenant a floods the queue first; b and c still get their turn at once.
    handles = [app.enqueue(job, i, concurrency_key="a") for i in range(8)]
    handles += [app.enqueue(job, 100 + i, concurrency_key=k) for i in range(3) for k in ("b", "c")]
    for h in handles:
        h.result(timeout=WAIT)
    spans = intervals(app, "tenants")
    for key in ("a", "b", "c"):
        assert max_overlap([s for s in spans if s[2] == key]) == 1, f"tenant {key} ran two at once"
    if not recovered(app, "tenants"):
        assert max_overlap(spans) == 3  # the three tenants did run side by side
    first_b = min(start for start, _, k in spans if k == "b")
    last_a = max(start for start, _, k in spans if k == "a")
    assert first_b < last_a  # b did not wait behind all of a's backlog


def test_dedup_key_returns_the_existing_execution_or_refuses(app: pgdurable.App, database_url: str,
                                                            start_worker: Callable[..., Any]) -> None:
    @app.workflow(queue="dedup")
    def report(day: str) -> str:
        pgdurable.recv(timeout=30)
        return day

    first = app.enqueue(report, "mon", dedup_key="daily-report")
    again = app.enqueue(report, "tue", dedup_key="daily-report")
    assert again.workflow_id == first.workflow_id
    with pytest.raises(pgdurable.DuplicateWorkflow) as refused:
        app.enqueue(report, "wed", dedup_key="daily-report", on_duplicate="raise")
    assert refused.value.existing_id == first.workflow_id
    with psycopg.connect(database_url) as conn:
        via_sql = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('report', '{{\"day\": \"thu\"}}', 'dedup', "
                                       "dedup_key => 'daily-report')").format(sql.Identifier(app.schema))).fetchone()
    assert via_sql == (first.workflow_id,)
    start_worker(app)
    wait_for(lambda: (app.get(first.workflow_id) or first.get()).status == "waiting", WAIT, "it to wait")
    app.send(first.workflow_id, None)
    assert first.result(timeout=WAIT) == "mon"
    later = app.enqueue(report, "fri", dedup_key="daily-report")  # the key is free once it finished
    assert later.workflow_id != first.workflow_id


def test_a_queue_policy_can_change_and_be_removed(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    job = define_sleepers(app, "changing", 0.1)
    app.queue("changing", concurrency=1)
    app.apply_queue_policies()
    app.queue("changing", concurrency=2)  # workers store the latest declaration when they start
    start_worker(app, concurrency=8)
    handles = [app.enqueue(job, i) for i in range(8)]
    for h in handles:
        h.result(timeout=WAIT)
    assert max_overlap(intervals(app, "changing")) == 2
    with pytest.raises(ValueError):
        app.queue("bad", rate_limit=3)
    with pytest.raises(ValueError):
        app.queue("bad", concurrency=0)
