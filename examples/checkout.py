"""A small checkout workflow. Run a worker and enqueue an order (docs/concepts.md shows this file):

    pgdurable worker examples.checkout:app &
    python -m examples.checkout 42
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from decimal import Decimal

import pgdurable

app = pgdurable.App()


@dataclass
class Receipt:
    order_id: int
    charged: Decimal
    tracking: str


class CardDeclined(Exception):
    pass


_attempted: set[int] = set()


@app.step(max_attempts=5, interval=0.2, backoff=2.0, no_retry=(CardDeclined,))
def charge(order_id: int, amount: Decimal) -> str:
    if amount <= 0:
        raise CardDeclined(f"nothing to charge for order {order_id}")  # not retried: in no_retry
    if order_id not in _attempted:  # a flaky payment gateway: the first try times out, the retry succeeds
        _attempted.add(order_id)
        raise ConnectionError("gateway timeout")
    return f"payment-{order_id}"


@app.step()
def ship(order_id: int) -> str:
    return f"TRACK-{order_id:06d}"


@app.workflow(queue="orders")
def checkout(order_id: int, amount: Decimal) -> Receipt:
    charge(order_id, amount)
    return Receipt(order_id, amount, ship(order_id))


if __name__ == "__main__":
    order = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    handle = app.enqueue(checkout, order, Decimal("19.99"), workflow_id=f"order-{order}")
    print(handle.result(timeout=60))
