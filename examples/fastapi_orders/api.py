"""The orders API. ``POST /orders`` (with an ``Idempotency-Key`` header) writes the order and enqueues its
fulfilment in one transaction; a retry with the same key finds both instead of making a second.
``GET /orders/{id}`` reads it, ``GET /orders/{id}/progress`` streams its progress as server-sent events."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from pgdurable.contrib.fastapi import Connection, event_stream, idempotency_key, lifespan

from .workflows import app, create_tables, fulfil, q


class NewOrder(BaseModel):
    item: str = Field(min_length=1, max_length=100)
    quantity: int = Field(ge=1, le=1000)


OrderId = Annotated[str, Depends(idempotency_key("orders"))]


def create_api(*, worker: bool) -> FastAPI:
    """The API; with ``worker``, a pgdurable worker runs in the server's process (one command to try it)."""
    durable = lifespan(app, worker=worker)

    @contextlib.asynccontextmanager
    async def startup(api: FastAPI) -> AsyncIterator[None]:
        async with durable(api):
            pool = await app.db.app_async_pool()
            async with pool.connection() as conn:
                await create_tables(conn)
            yield

    api = FastAPI(title="orders", lifespan=startup)

    @api.post("/orders", status_code=201)
    async def place_order(order: NewOrder, order_id: OrderId, conn: Connection, response: Response) -> dict[str, Any]:
        inserted = await (await conn.execute(
            q("INSERT INTO {s}.orders (id, item, quantity) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING "
              "RETURNING id"), (order_id, order.item, order.quantity))).fetchone()
        if inserted is None:  # a retry: the first request with this key committed the order
            first = await (await conn.execute(q("SELECT item, quantity FROM {s}.orders WHERE id = %s"),
                                              (order_id,))).fetchone()
            if first != (order.item, order.quantity):
                raise HTTPException(409, "this Idempotency-Key was used for a different order")
            response.status_code = 200
        # In the request's transaction: with the same id, a retry gets the first request's execution.
        await app.enqueue_async(fulfil, order_id, workflow_id=order_id, conn=conn)
        return {"id": order_id, "created": inserted is not None}

    @api.get("/orders/{order_id}")
    async def get_order(order_id: str, conn: Connection) -> dict[str, Any]:
        row = await (await conn.execute(q("SELECT item, quantity, status, tracking FROM {s}.orders WHERE id = %s"),
                                        (order_id,))).fetchone()
        if row is None:
            raise HTTPException(404, f"no order {order_id!r}")
        execution = await app.get_async(order_id)
        return {"id": order_id, "item": row[0], "quantity": row[1], "status": row[2], "tracking": row[3],
                "workflow": execution.status if execution else None}

    @api.get("/orders/{order_id}/progress")
    async def progress(order_id: str, request: Request) -> StreamingResponse:
        return await event_stream(app, order_id, "progress", request)

    return api


api = create_api(worker=os.environ.get("ORDERS_IN_PROCESS_WORKER", "1") == "1")
