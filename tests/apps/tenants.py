"""An app that declares its queues the ways a newcomer does: limits on a queue (``app.queue``) and a workflow
on a queue of its own (``@app.workflow(queue=...)``). A worker started without --queue serves all of them,
and ``default``. Database and schema come from PGDURABLE_DATABASE_URL and PGDURABLE_SCHEMA."""

from __future__ import annotations

import pgdurable

app = pgdurable.App(lease_seconds=2.0, poll_seconds=0.5, sweep_seconds=0.3, shutdown_grace_seconds=1.0)
app.queue("tenants", concurrency=2)


@app.workflow()
def greet(name: str) -> str:
    return f"hello {name}"


@app.workflow(queue="reports")
def report(n: int) -> int:
    return n * 2
