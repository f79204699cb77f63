"""The orders example's tables and workflow. An order is reserved, packed and shipped; reserving and shipping
are transactional steps, so their writes commit with their checkpoints (exactly once, whatever crashes), and
every effect is logged in ``effects`` so that can be checked. A worker serves it:
``pgdurable worker examples.fastapi_orders.workflows:app``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from psycopg import sql

import pgdurable

# A short lease: an order a crashed worker was running resumes on another within seconds.
app = pgdurable.App(lease_seconds=5.0, sweep_seconds=1.0)


def schema() -> str:
    """The schema of the example's own tables (read at each use, so tests can give each run its own)."""
    return os.environ.get("ORDERS_SCHEMA", "orders")


def q(text: str) -> sql.Composed:
    return sql.SQL(text).format(s=sql.Identifier(schema()))


TABLES = (
    "CREATE SCHEMA IF NOT EXISTS {s}",
    "CREATE TABLE IF NOT EXISTS {s}.orders (id text PRIMARY KEY, item text NOT NULL, quantity int NOT NULL, "
    "status text NOT NULL DEFAULT 'placed', tracking text)",
    "CREATE TABLE IF NOT EXISTS {s}.effects (order_id text NOT NULL, effect text NOT NULL, pid int NOT NULL)",
)


async def create_tables(conn: psycopg.AsyncConnection[Any]) -> None:
    for statement in TABLES:
        await conn.execute(q(statement))


@app.transaction()
def reserve(conn: psycopg.Connection[Any], order_id: str) -> None:
    conn.execute(q("UPDATE {s}.orders SET status = 'reserved' WHERE id = %s"), (order_id,))
    conn.execute(q("INSERT INTO {s}.effects VALUES (%s, 'reserved', %s)"), (order_id, os.getpid()))


@app.step()
def pack(order_id: str) -> str:
    time.sleep(float(os.environ.get("ORDERS_PACK_SECONDS", "1")))  # the warehouse takes its time
    return f"parcel-{order_id.rsplit(':', 1)[-1]}"


@app.transaction()
def ship(conn: psycopg.Connection[Any], order_id: str, parcel: str) -> str:
    tracking = f"TRACK-{parcel}"
    conn.execute(q("UPDATE {s}.orders SET status = 'shipped', tracking = %s WHERE id = %s"), (tracking, order_id))
    conn.execute(q("INSERT INTO {s}.effects VALUES (%s, 'shipped', %s)"), (order_id, os.getpid()))
    return tracking


@app.workflow(queue="orders")
def fulfil(order_id: str) -> str:
    reserve(order_id)
    pgdurable.write_stream("progress", "reserved")
    parcel = pack(order_id)
    pgdurable.write_stream("progress", "packed")
    tracking = ship(order_id, parcel)
    pgdurable.write_stream("progress", {"shipped": tracking})
    pgdurable.close_stream("progress")  # readers (the SSE endpoint) end now
    return tracking
