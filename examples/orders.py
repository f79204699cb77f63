"""Order checkout with co-location: the order and its fulfilment workflow are created in one transaction,
and stock and payment are written by transactional steps, exactly once.

    pgdurable worker examples.orders:app &
    python -m examples.orders            # creates the shop tables, places an order, waits for fulfilment

The same enqueue from psql (inside any transaction):

    SELECT pgdurable.enqueue_workflow('fulfil_order', '{"order_id": 7}');
"""

from __future__ import annotations

from typing import Any

import psycopg

import pgdurable

app = pgdurable.App()

SHOP_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.stock (sku text PRIMARY KEY, available int NOT NULL CHECK (available >= 0));
CREATE TABLE IF NOT EXISTS shop.orders (id int PRIMARY KEY, sku text NOT NULL, status text NOT NULL);
CREATE TABLE IF NOT EXISTS shop.payments (order_id int PRIMARY KEY, cents int NOT NULL);
INSERT INTO shop.stock VALUES ('book', 100) ON CONFLICT DO NOTHING;
"""


@app.transaction()
def reserve_stock(conn: psycopg.Connection[Any], order_id: int) -> str:
    row = conn.execute("SELECT sku FROM shop.orders WHERE id = %s", (order_id,)).fetchone()
    assert row is not None, f"order {order_id} does not exist"
    conn.execute("UPDATE shop.stock SET available = available - 1 WHERE sku = %s", (row[0],))
    conn.execute("UPDATE shop.orders SET status = 'reserved' WHERE id = %s", (order_id,))
    return str(row[0])


@app.transaction()
def record_payment(conn: psycopg.Connection[Any], order_id: int, cents: int) -> None:
    conn.execute("INSERT INTO shop.payments VALUES (%s, %s)", (order_id, cents))
    conn.execute("UPDATE shop.orders SET status = 'paid' WHERE id = %s", (order_id,))


@app.workflow()
def fulfil_order(order_id: int) -> str:
    sku = reserve_stock(order_id)
    record_payment(order_id, 1999)
    return f"order {order_id}: {sku} reserved and paid"


def place_order(order_id: int) -> pgdurable.WorkflowHandle[str]:
    """Insert the order and enqueue its fulfilment in ONE transaction: both exist, or neither does."""
    with psycopg.connect(app.db.conninfo) as conn:
        conn.execute(SHOP_SCHEMA)
        conn.execute("INSERT INTO shop.orders VALUES (%s, 'book', 'new') ON CONFLICT DO NOTHING", (order_id,))
        handle = app.enqueue(fulfil_order, order_id, workflow_id=f"order-{order_id}", conn=conn)
    return handle  # the `with` block committed


if __name__ == "__main__":
    print(place_order(7).result(timeout=60))
