"""``pgdurable workers``: live workers, and executions no live worker will run (unrunnable or parked)."""

from __future__ import annotations

import json

from rich.table import Table

from .. import store
from ._common import AsJson, DatabaseUrl, Schema, console, jsonable, open_app, when


def workers(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Live workers (with their application version), and executions no live worker will run: enqueued ones
    nobody serves, and parked ones (their history does not replay on the code that claimed them).

    Example: pgdurable workers --json
    """
    with open_app(database_url, schema) as app:
        rows = app.db.run(store.workers.list_workers())
        stuck = app.db.run(store.workers.list_unrunnable(100))
    if as_json:
        keys = ("id", "hostname", "pid", "queues", "workflows", "concurrency", "started_at", "heartbeat_at",
                "alive", "app_version")
        print(json.dumps({"workers": [{k: jsonable(v) for k, v in zip(keys, row, strict=True)} for row in rows],
                          "unrunnable": [{"id": r[0], "name": r[1], "queue": r[2], "reason": r[4]}
                                         for r in stuck]}, indent=2))
        return
    table = Table("worker", "queues", "workflows", "concurrency", "version", "heartbeat", "alive")
    for row in rows:
        table.add_row(row[0], ",".join(row[3]), str(len(row[4])), str(row[5]), row[9] or "", when(row[7]),
                      "yes" if row[8] else "[red]no[/red]")
    console.print(table)
    if stuck:
        unrunnable = Table("id", "name", "queue", "reason", title="No live worker can run these")
        for r in stuck:
            unrunnable.add_row(r[0], r[1], r[2], r[4])
        console.print(unrunnable)
