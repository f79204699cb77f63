"""The FastAPI integration, driven through the example orders API (examples/fastapi_orders) with the ASGI test
client against the real database: a POST retried with the same Idempotency-Key starts one workflow, a request
that fails rolls its enqueue back, progress streams as server-sent events, and a real worker process SIGKILLed
mid-workflow is finished by a second one with every effect applied once."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Annotated, Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("fastapi", reason="the fastapi extra is not installed (pip install -e '.[test]')")
from fastapi import Depends
from fastapi.testclient import TestClient
from sqlalchemy import text

from pgdurable.contrib.fastapi import Connection, Session, idempotency_key
from tests.harness import WAIT, wait_for

TARGET = "examples.fastapi_orders.workflows:app"
OrderId = Annotated[str, Depends(idempotency_key("orders"))]


class Orders:
    """The example imported on this test's schemas (its App reads PGDURABLE_* when the module is loaded)."""

    def __init__(self, workflows: ModuleType, api: ModuleType, database_url: str, schema: str,
                 orders_schema: str) -> None:
        self.workflows, self.api_module = workflows, api
        self.app = workflows.app
        self.database_url, self.schema, self.orders_schema = database_url, schema, orders_schema

    def rows(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            statement = sql.SQL(query).format(s=sql.Identifier(self.orders_schema), e=sql.Identifier(self.schema))
            return conn.execute(statement, params).fetchall()

    def effects(self, order_id: str) -> list[tuple[str, int]]:
        return [(effect, pid) for effect, pid in
                self.rows("SELECT effect, pid FROM {s}.effects WHERE order_id = %s ORDER BY effect", (order_id,))]

    def executions(self, order_id: str) -> list[tuple[Any, ...]]:
        return self.rows("SELECT status, attempt FROM {e}.workflow_executions WHERE id = %s", (order_id,))


@pytest.fixture
def orders(database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Orders]:
    orders_schema = f"orders_{uuid.uuid4().hex[:10]}"
    for name, value in (("PGDURABLE_DATABASE_URL", database_url), ("PGDURABLE_SCHEMA", schema),
                        ("ORDERS_SCHEMA", orders_schema), ("ORDERS_PACK_SECONDS", "0"),
                        ("ORDERS_IN_PROCESS_WORKER", "0")):
        monkeypatch.setenv(name, value)
    workflows = importlib.reload(importlib.import_module("examples.fastapi_orders.workflows"))
    api = importlib.reload(importlib.import_module("examples.fastapi_orders.api"))
    found = Orders(workflows, api, database_url, schema, orders_schema)
    yield found
    found.app.close()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(orders_schema)))


def sse_events(text: str) -> list[dict[str, str]]:
    events = []
    for chunk in text.rstrip("\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in chunk.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = fields.get(name, "") + value
        events.append(fields)
    return events


def test_a_retried_post_starts_one_workflow_and_a_killed_worker_is_finished_by_another(
        orders: Orders, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    api = orders.api_module.create_api(worker=False)
    with TestClient(api) as client:
        # The first worker packs slowly: it is killed while packing, after the reservation committed.
        first = spawn_worker(TARGET, env={"ORDERS_SCHEMA": orders.orders_schema, "ORDERS_PACK_SECONDS": "600"})
        key = uuid.uuid4().hex
        created = client.post("/orders", json={"item": "book", "quantity": 2}, headers={"Idempotency-Key": key})
        assert created.status_code == 201, created.text
        order_id = created.json()["id"]
        assert order_id == f"orders:{key}"
        # The client did not see the answer and retries: the same order, the same execution, nothing new.
        retried = client.post("/orders", json={"item": "book", "quantity": 2}, headers={"Idempotency-Key": key})
        assert retried.status_code == 200, retried.text
        assert retried.json() == {"id": order_id, "created": False}
        # Reusing the key for another order is refused.
        clash = client.post("/orders", json={"item": "pen", "quantity": 1}, headers={"Idempotency-Key": key})
        assert clash.status_code == 409
        assert orders.rows("SELECT count(*) FROM {s}.orders") == [(1,)]
        assert orders.rows("SELECT count(*) FROM {e}.workflow_executions") == [(1,)]

        wait_for(lambda: orders.effects(order_id) == [("reserved", first.pid)], WAIT, "the first worker to reserve")
        wait_for(lambda: orders.rows("SELECT count(*) FROM {e}.operation_outputs WHERE execution_id = %s",
                                     (order_id,)) >= [(2,)], WAIT, "the progress write after the reservation")
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = spawn_worker(TARGET, env={"ORDERS_SCHEMA": orders.orders_schema, "ORDERS_PACK_SECONDS": "0"})
        wait_for(lambda: orders.executions(order_id)[0][0] == "succeeded", WAIT, "the second worker to finish")

        assert orders.executions(order_id) == [("succeeded", 2)]
        assert orders.effects(order_id) == [("reserved", first.pid), ("shipped", second.pid)]  # each once
        print(f"crash and resume: {order_id} reserved by worker {first.pid} (then SIGKILLed while packing), "
              f"shipped by worker {second.pid} on attempt 2; effects {orders.effects(order_id)}")
        order = client.get(f"/orders/{order_id}").json()
        assert order["status"] == "shipped" and order["workflow"] == "succeeded"
        assert order["tracking"] == f"TRACK-parcel-{key}"

        stream = client.get(f"/orders/{order_id}/progress")
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = sse_events(stream.text)
        assert [(e.get("id"), json.loads(e["data"])) for e in events[:-1]] == [
            ("0", "reserved"), ("1", "packed"), ("2", {"shipped": order["tracking"]})]
        assert events[-1] == {"event": "end", "data": ""}
        resumed = sse_events(client.get(f"/orders/{order_id}/progress", headers={"Last-Event-ID": "1"}).text)
        assert [e.get("id") for e in resumed] == ["2", None]
        assert client.get("/orders/orders:nothing/progress").status_code == 404


def test_a_request_that_fails_after_enqueuing_leaves_nothing_and_its_retry_starts_the_workflow(
        orders: Orders) -> None:
    api = orders.api_module.create_api(worker=False)

    @api.post("/orders-then-fail")
    async def place_then_fail(conn: Connection, order_id: OrderId) -> None:
        await conn.execute(sql.SQL("INSERT INTO {}.orders (id, item, quantity) VALUES (%s, 'book', 1)").format(
            sql.Identifier(orders.orders_schema)), (order_id,))
        await orders.app.enqueue_async(orders.workflows.fulfil, order_id, workflow_id=order_id, conn=conn)
        raise RuntimeError("the request fails after its enqueue")

    with TestClient(api, raise_server_exceptions=False) as client:
        key = uuid.uuid4().hex
        assert client.post("/orders-then-fail", headers={"Idempotency-Key": key}).status_code == 500
        assert orders.rows("SELECT count(*) FROM {s}.orders") == [(0,)]
        assert orders.rows("SELECT count(*) FROM {e}.workflow_executions") == [(0,)]
        retried = client.post("/orders", json={"item": "book", "quantity": 1}, headers={"Idempotency-Key": key})
        assert retried.status_code == 201 and retried.json()["created"] is True
        assert orders.executions(f"orders:{key}") == [("enqueued", 0)]


@pytest.mark.parametrize(("headers", "detail"), [
    ({}, "needs an Idempotency-Key header"),
    ({"Idempotency-Key": ""}, "1 to 150 visible ASCII characters"),
    ({"Idempotency-Key": "x" * 151}, "1 to 150 visible ASCII characters"),
    ({"Idempotency-Key": "two words"}, "1 to 150 visible ASCII characters"),
])
def test_a_missing_or_malformed_key_is_a_400(orders: Orders, headers: dict[str, str], detail: str) -> None:
    with TestClient(orders.api_module.create_api(worker=False)) as client:
        answer = client.post("/orders", json={"item": "book", "quantity": 1}, headers=headers)
    assert answer.status_code == 400 and detail in answer.json()["detail"]
    assert orders.rows("SELECT count(*) FROM {s}.orders") == [(0,)]


def test_keys_are_namespaced_and_quotes_are_removed() -> None:
    dependency = idempotency_key("refunds")
    assert dependency('"abc-123"') == "refunds:abc-123"
    assert idempotency_key("orders")("abc-123") == "orders:abc-123"
    assert idempotency_key("orders", required=False)(None) is None
    with pytest.raises(ValueError, match="reserved"):
        idempotency_key("sched")


def test_the_lifespan_runs_a_worker_in_the_server_process(orders: Orders) -> None:
    with TestClient(orders.api_module.create_api(worker=True)) as client:
        key = uuid.uuid4().hex
        assert client.post("/orders", json={"item": "lamp", "quantity": 1},
                           headers={"Idempotency-Key": key}).status_code == 201
        events = sse_events(client.get(f"/orders/orders:{key}/progress").text)  # follows it live to the end
        assert [json.loads(e["data"]) for e in events[:-1]][:2] == ["reserved", "packed"]
        wait_for(lambda: client.get(f"/orders/orders:{key}").json()["workflow"] == "succeeded", WAIT,
                 "the in-process worker to finish the order")


def test_a_sqlalchemy_session_holds_the_requests_writes_and_its_enqueue(orders: Orders) -> None:
    api = orders.api_module.create_api(worker=False)

    @api.post("/orders-by-session", status_code=201)
    async def place_by_session(session: Session, order_id: OrderId, fail: bool = False) -> str:
        await session.execute(text(f'INSERT INTO "{orders.orders_schema}".orders (id, item, quantity) '
                                   "VALUES (:id, 'book', 1)"), {"id": order_id})
        await orders.app.enqueue_async(orders.workflows.fulfil, order_id, workflow_id=order_id, conn=session)
        if fail:
            raise RuntimeError("the request fails after its enqueue")
        return order_id

    with TestClient(api, raise_server_exceptions=False) as client:
        failed, placed = uuid.uuid4().hex, uuid.uuid4().hex
        assert client.post("/orders-by-session?fail=true", headers={"Idempotency-Key": failed}).status_code == 500
        assert client.post("/orders-by-session", headers={"Idempotency-Key": placed}).status_code == 201
    assert orders.rows("SELECT id FROM {s}.orders") == [(f"orders:{placed}",)]
    assert orders.executions(f"orders:{placed}") == [("enqueued", 0)]
    assert orders.executions(f"orders:{failed}") == []
