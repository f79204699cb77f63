"""Real worker processes SIGKILLed in the middle of a debounced execution and of a stream: the debounced
execution resumes (no second one), and a resumed stream writer duplicates no value."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import prims
from tests.harness import WAIT, WorkerHarness, wait_for


@pytest.fixture
def harness(database_url: str, schema: str, spawn_worker: Callable[..., Any], tmp_path: Path,
            make_app: Callable[..., pgdurable.App]) -> Iterator[WorkerHarness]:
    effects_schema = f"p_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as db:
        prims.create(db, effects_schema)
        client = make_app(app_version="prims-test")
        wf = SimpleNamespace(**dict(zip(("debounced", "streamer"), prims.define(client), strict=True)))
        client.migrate()
        db.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(schema),
                                                              sql.Identifier(effects_schema)))
        h = WorkerHarness(spawn_worker, "tests.apps.prims:app", tmp_path, db, client, wf)
        h.env = {"PRIMS_SCHEMA": effects_schema}  # type: ignore[attr-defined]
        try:
            yield h
        finally:
            db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(effects_schema)))


def test_a_worker_killed_during_a_debounced_execution_does_not_make_a_second_one(harness: WorkerHarness) -> None:
    h, wf, client = harness, harness.wf, harness.client
    env = h.env  # type: ignore[attr-defined]
    first = h.start(("-c", "4"), env, wait=True)
    handles = [client.enqueue(wf.debounced, n, debounce_key="acct-1", debounce_seconds=2) for n in range(20)]
    workflow_id = handles[0].workflow_id
    assert {x.workflow_id for x in handles} == {workflow_id}
    wait_for(lambda: h.scalar("SELECT count(*) FROM effects WHERE label = 'start-19'"), WAIT,
             "the debounced execution to start, with the last arguments")
    first.send_signal(signal.SIGKILL)
    first.wait()
    h.start(("-c", "4"), env, wait=True)
    assert client.handle(workflow_id).result(timeout=WAIT) == 19
    assert h.scalar("SELECT count(*) FROM workflow_executions") == 1
    row = h.execution(workflow_id)
    assert row["attempt"] == 2 and row["recoveries"] == 1
    assert sorted(h.rows("SELECT label, count(*) FROM effects GROUP BY label")) == [("end-19", 1), ("start-19", 1)]


def test_a_worker_killed_mid_stream_resumes_without_duplicating_values(harness: WorkerHarness) -> None:
    h, wf, client = harness, harness.wf, harness.client
    env = h.env  # type: ignore[attr-defined]
    first = h.start(("-c", "4"), env, wait=True)
    count = 40
    handle = client.enqueue(wf.streamer, count, workflow_id="stream-1")
    got: list[Any] = []
    done = threading.Event()

    def read() -> None:
        got.extend(client.read_stream("stream-1", "out"))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    wait_for(lambda: len(got) >= 10, WAIT, "the reader to see the first values")
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = len(got)
    h.start(("-c", "4"), env, wait=True)
    assert handle.result(timeout=WAIT) == count
    assert done.wait(WAIT), "the reader did not end at the close"
    assert got == list(range(count)), f"killed after {killed_at} values"
    assert h.scalar("SELECT count(*) FROM workflow_streams WHERE execution_id = 'stream-1'") == count + 1
    assert h.execution("stream-1")["recoveries"] == 1
