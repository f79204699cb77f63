"""Ask the support agent to refund an order, act as the human who approves the refund, print the answer."""

from __future__ import annotations

import sys

import psycopg

from .support import REFUNDS_TABLE, app, durable


def main(order_id: int, approve: bool) -> None:
    with psycopg.connect(app.db.conninfo) as conn:
        conn.execute(REFUNDS_TABLE)
    workflow_id = f"refund-{order_id}"
    handle = app.enqueue(durable.workflow, f"Order {order_id} arrived broken, please refund it",
                         workflow_id=workflow_id)
    pending = app.get_event(workflow_id, "approval", timeout=60)  # None: answered already
    if pending is not None:
        print(f"waiting for approval: {pending['tool_name']} {pending['args']}")
        app.send(workflow_id, {"approved": approve, "reason": "refunds are paused"}, topic="approval")
    print(handle.result(timeout=60))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7, approve="--deny" not in sys.argv)
