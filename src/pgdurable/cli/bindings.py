"""``pgdurable bindings ...``: list, restore and remove table bindings (tables whose row changes enqueue a workflow).
Bindings are created in code (``app.bind_table``) or in SQL (``bind_table``), where the workflow is known."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich.table import Table

from ._common import AsJson, DatabaseUrl, Schema, command_group, console, dump, open_app

bindings_cli = command_group("Table bindings: a trigger on a table enqueues a workflow for each matching row change.")


@bindings_cli.command("list")
def list_bindings(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """List table bindings: the table, the workflow, which changes fire it, and whether its trigger is there."""
    with open_app(database_url, schema) as app:
        found = app.bindings()
    if as_json:
        print(dump([dataclasses.asdict(b) for b in found]))
        return
    table = Table("name", "table", "workflow", "on", "when", "columns", "queue", "state")
    for b in found:
        state = "active" if b.installed_on else "[red]trigger missing (table dropped?)[/red]"
        columns = "all" if b.columns is None else ", ".join(b.columns) or "-"
        if b.pass_old:
            columns += " + old"
        table.add_row(b.name, b.installed_on or b.relation, b.workflow_name, ", ".join(b.operations),
                      b.when_condition or "", columns, b.queue, state)
    console.print(table)


@bindings_cli.command("restore")
def restore_bindings(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Re-create the triggers of bindings whose table exists but whose trigger is gone (a table dropped and
    created again), from their records."""
    with open_app(database_url, schema) as app:
        restored = app.restore_bindings()
    if as_json:
        print(json.dumps({"restored": restored}))
    elif restored:
        console.print(f"restored: {', '.join(restored)}")
    else:
        console.print("nothing to restore")


@bindings_cli.command("remove")
def remove_binding(name: Annotated[str, typer.Argument(help="The binding's name (see `pgdurable bindings list`).")],
                   database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Remove a binding: drop its trigger and its record (executions it already enqueued are left alone)."""
    with open_app(database_url, schema) as app:
        done = app.unbind_table(name)
    if as_json:
        print(json.dumps({"name": name, "removed": done}))
    elif done:
        console.print(f"binding {name}: removed")
    else:
        console.print(f"[yellow]no binding named {name}[/yellow]")
    if not done:
        raise typer.Exit(1)
