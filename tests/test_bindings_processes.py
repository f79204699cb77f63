"""Table-bound workflows with real worker processes SIGKILLed at random while bound executions run: every
matching row change still gives exactly one execution, which completes once, with its effect applied once."""

from __future__ import annotations

import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import bound
from tests.harness import WAIT, WorkerHarness, wait_for


@pytest.fixture
def harness(database_url: str, schema: str, spawn_worker: Callable[..., Any], tmp_path: Path,
            make_app: Callable[..., pgdurable.App]) -> Iterator[WorkerHarness]:
    shop = f"b_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as db:
        bound.create(db, shop)
        client = make_app(app_version="bound-test")
        fulfil = bound.define(client)
        client.migrate()
        db.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(schema), sql.Identifier(shop)))
        h = WorkerHarness(spawn_worker, "tests.apps.bound:app", tmp_path, db, client, SimpleNamespace(fulfil=fulfil))
        h.env = {"BOUND_SCHEMA": shop}  # type: ignore[attr-defined]
        h.shop = shop  # type: ignore[attr-defined]
        try:
            yield h
        finally:
            db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(shop)))


def test_sigkilled_workers_still_give_exactly_one_completed_execution_per_change(harness: WorkerHarness,
                                                                                  database_url: str) -> None:
    h, client = harness, harness.client
    env, shop = h.env, h.shop  # type: ignore[attr-defined]
    client.bind_table(f"{shop}.orders", h.wf.fulfil, on=["insert", "update"], when="NEW.status = 'paid'",
                      name="paid")
    slots = [h.start(("-c", "8"), env, wait=True) for _ in range(2)]
    rng = random.Random(11)
    orders, kills = 30, 0
    with psycopg.connect(database_url, autocommit=True) as writer:
        writer.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(shop)))
        for n in range(orders):
            # Half are paid on insert, half by a later update; unpaid changes enqueue nothing.
            writer.execute("INSERT INTO orders VALUES (%s, %s, %s)", (n, "paid" if n % 2 else "new", n * 10))
            if n % 2 == 0:
                writer.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (n,))
            if n % 5 == 4:  # kill a worker every few orders, while earlier ones run
                time.sleep(rng.uniform(0.1, 0.4))
                victim = rng.randrange(len(slots))
                slots[victim].send_signal(signal.SIGKILL)
                slots[victim].wait()
                kills += 1
                slots[victim] = h.start(("-c", "8"), env, wait=False)
        # A change that does not match enqueues nothing.
        writer.execute("UPDATE orders SET status = 'shipped' WHERE id = 0")

    def all_done() -> bool:
        return h.scalar("SELECT count(*) FROM workflow_executions WHERE status = 'succeeded'") == orders

    wait_for(all_done, WAIT * 2, f"{orders} bound executions to succeed")
    per_order = h.rows("SELECT (input ->> 'id')::int, count(*), min(status), max(status) "
                       "FROM workflow_executions GROUP BY 1 ORDER BY 1")
    assert per_order == [(n, 1, "succeeded", "succeeded") for n in range(orders)]
    assert h.rows("SELECT order_id, count(*) FROM effects GROUP BY order_id HAVING count(*) <> 1") == []
    assert h.scalar("SELECT count(DISTINCT order_id) FROM effects") == orders
    results = h.rows("SELECT (input ->> 'id')::int, output::text FROM workflow_executions ORDER BY 1")
    assert results == [(n, str(n * 10)) for n in range(orders)]
    recovered = h.scalar("SELECT count(*) FROM workflow_executions WHERE recoveries > 0")
    print(f"{kills} SIGKILLs; {recovered} bound executions recovered from a dead worker")
    assert kills >= 5
