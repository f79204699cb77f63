"""``pgdurable queues ...``: queue policies (concurrency, rate and per-key limits)."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich.table import Table

from .. import store
from ._common import AsJson, DatabaseUrl, Schema, command_group, console, open_app

queues_cli = command_group("Queue policies: concurrency, rate and per-key limits.")


@queues_cli.command("list")
def list_queues(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Queues that have a policy (limits), as set by `app.queue(...)` or `pgdurable queues set`.

    Example: pgdurable queues list --json
    """
    with open_app(database_url, schema) as app:
        policies = app.db.run(store.queues.queue_policies(None))
    if as_json:
        print(json.dumps([dataclasses.asdict(p) for p in policies.values()], indent=2))
        return
    table = Table("queue", "concurrency", "per worker", "rate", "per key")
    for p in policies.values():
        rate = f"{p.rate_limit} / {p.rate_period_seconds:g}s" if p.rate_limit else ""
        table.add_row(p.name, str(p.concurrency or ""), str(p.worker_concurrency or ""), rate,
                      str(p.key_concurrency or ""))
    console.print(table)


@queues_cli.command("set")
def set_queue(name: str,
              concurrency: Annotated[int | None, typer.Option(help="Running at once, all workers.")] = None,
              worker_concurrency: Annotated[int | None, typer.Option(help="Running at once per worker.")] = None,
              rate_limit: Annotated[int | None, typer.Option(help="Starts per --rate-period.")] = None,
              rate_period: Annotated[float | None, typer.Option(help="Seconds.")] = None,
              key_concurrency: Annotated[int | None, typer.Option(help="Running at once per key.")] = None,
              database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Set a queue's limits (no limits given: remove its policy). Workers pick it up within a sweep.

    Example: pgdurable queues set emails --concurrency 10 --rate-limit 100 --rate-period 60
    """
    with open_app(database_url, schema) as app:
        try:
            policy = app.queue(name, concurrency=concurrency, worker_concurrency=worker_concurrency,
                               rate_limit=rate_limit, rate_period=rate_period, key_concurrency=key_concurrency)
        except ValueError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        app.db.run(store.queues.set_queue_policy(policy))
    stored = policy.claims_in_sql or policy.worker_concurrency is not None
    if as_json:
        print(json.dumps({"queue": name, "policy": dataclasses.asdict(policy) if stored else None}))
    else:
        console.print(f"queue {name}: " + ("policy stored" if stored else "policy removed"))
