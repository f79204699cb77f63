"""``pgdurable workflows ...``: list, show, fork, message, cancel and resume executions."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .. import display, store
from ._common import (
    AsJson,
    DatabaseUrl,
    Schema,
    command_group,
    console,
    dump,
    error_fields,
    fail,
    jsonable,
    open_app,
    payload,
    short,
    when,
)

workflows_cli = command_group("Inspect and steer workflow executions.")


def _execution_dict(execution: store.executions.Execution) -> dict[str, Any]:
    data = {name: jsonable(getattr(execution, name)) for name in store.executions.Execution.__slots__}
    for column in ("input", "output", "error"):
        data[column] = payload(data[column])
    return data


def _step_dict(step: store.checkpoints.Step) -> dict[str, Any]:
    data = {name: jsonable(getattr(step, name)) for name in store.checkpoints.Step.__slots__}
    data["output"], data["error"] = payload(step.output), payload(step.error)
    data["duration_ms"] = _millis(step.started_at, step.completed_at)
    return data


def _millis(start: datetime, end: datetime) -> float | None:
    if isinstance(start, display.ExtremeTime) or isinstance(end, display.ExtremeTime):
        return None
    return round((end - start).total_seconds() * 1000, 3)


@workflows_cli.command("list")
def list_workflows(
    status: Annotated[str | None, typer.Option(help="enqueued, running, succeeded, failed or cancelled")] = None,
    name: Annotated[str | None, typer.Option(help="Workflow name.")] = None,
    queue: Annotated[str | None, typer.Option(help="Queue name.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE: only executions with this tag (repeatable: "
                                                      "all of them).")] = None,
    database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False,
) -> None:
    """List executions, newest first.

    Example: pgdurable workflows list --status failed --queue orders --tag customer=42 --limit 20 --json
    """
    tags = _parse_tags(tag or [])
    with open_app(database_url, schema) as app:
        executions = app.list_workflows(status=status, name=name, queue=queue, tags=tags, limit=limit)
    if as_json:
        print(dump([_execution_dict(e) for e in executions]))
        return
    table = Table("id", "name", "queue", "status", "attempt", "created", "completed", "error")
    for e in executions:
        error = error_fields(e.error).get("message", "")
        table.add_row(Text(e.id), Text(e.name), e.queue, Text(e.status), str(e.attempt), when(e.created_at),
                      when(e.completed_at), Text(short(error)))
    console.print(table)


def _parse_tags(given: list[str]) -> dict[str, str] | None:
    tags: dict[str, str] = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--tag takes KEY=VALUE, not {item!r}", param_hint="--tag")
        tags[key] = value
    return tags or None


@workflows_cli.command("show")
def show_workflow(workflow_id: str, database_url: DatabaseUrl = None, schema: Schema = None,
                  as_json: AsJson = False) -> None:
    """Show one execution: its steps with timings, children, events and messages.

    Example: pgdurable workflows show order-42
    """
    with open_app(database_url, schema) as app:
        execution = app.get(workflow_id)
        steps = app.steps(workflow_id)
        children = app.children(workflow_id)
        events = app.db.run(store.messaging.list_events(workflow_id))
        messages = app.db.run(store.messaging.list_messages(workflow_id))
    if execution is None:
        console.print(f"[red]no execution with id {escape(workflow_id)}[/red]")
        raise typer.Exit(1)
    if as_json:
        print(dump({
            **_execution_dict(execution), "steps": [_step_dict(s) for s in steps],
            "children": [{"id": c[0], "name": c[1], "status": c[2]} for c in children],
            "events": [{"key": e.key, "step_id": e.step_id, "value": payload(e.value),
                        "created_at": jsonable(e.created_at)} for e in events],
            "messages": [{"topic": m.topic, "message": payload(m.message), "created_at": jsonable(m.created_at),
                          "consumed_at": jsonable(m.consumed_at)} for m in messages],
        }))
        return
    summary = Table.grid(padding=(0, 2))
    for label, value in [
        ("id", execution.id), ("workflow", execution.name), ("queue", execution.queue),
        ("status", execution.status + (f" ({execution.wait_reason})"
                                       if execution.wait_reason and execution.status == "waiting" else "")),
        *([("parked", execution.parked_reason)] if execution.wait_reason == "parked" and execution.parked_reason
          else []),
        ("attempt", str(execution.attempt)), ("version", execution.app_version or ""),
        ("parent", execution.parent_id or ""), ("forked from", execution.forked_from or ""),
        ("deadline", when(execution.deadline)),
        ("recoveries", f"{execution.recoveries} of {execution.max_recoveries}"),
        ("owner", execution.owner_id or ""), ("lease expires", when(execution.lease_expires)),
        ("created", when(execution.created_at)), ("started", when(execution.started_at)),
        ("completed", when(execution.completed_at)), ("input", short(payload(execution.input), 100)),
        ("output", short(payload(execution.output), 100) if execution.output else ""),
    ]:
        summary.add_row(f"[bold]{label}[/bold]", Text(value))  # data, not markup
    console.print(summary)
    error = error_fields(execution.error)
    if error:
        console.print(f"[red]error[/red] {escape(error['type'])}: {escape(error['message'])}", highlight=False)
        if error["traceback"]:
            console.print(error["traceback"], markup=False, highlight=False)
    table = Table("step", "name", "outcome", "attempts", "by attempt", "started", "ms")
    for s in steps:
        outcome = f"[red]{escape(short(error_fields(s.error)['message']))}[/red]" if s.error \
            else escape(short(payload(s.output)))
        duration = _millis(s.started_at, s.completed_at)
        table.add_row(str(s.step_id), Text(s.step_name), outcome, str(s.attempts), str(s.recorded_by_attempt),
                      when(s.started_at), "" if duration is None else f"{duration:.1f}")
    console.print(table)
    if children:
        kids = Table("child", "workflow", "status", title=f"{len(children)} child workflows")
        for c in children[:50]:
            kids.add_row(Text(c[0]), Text(c[1]), Text(c[2]))
        console.print(kids)
    for e in events:
        console.print(f"event [bold]{escape(e.key)}[/bold] (step {e.step_id}): {escape(short(payload(e.value)))}",
                      highlight=False)


@workflows_cli.command("fork")
def fork_workflow(workflow_id: str,
                  from_step: Annotated[int, typer.Option("--from-step", help="First step to run again.")],
                  new_id: Annotated[str | None, typer.Option("--new-id", help="Id of the new execution.")] = None,
                  database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Start a new execution of the same workflow and input that reuses the recorded steps before
    --from-step and runs again from there (after fixing a bug, say).

    Example: pgdurable workflows fork 6f1c... --from-step 3
    """
    from ..errors import WorkflowIdConflict, WorkflowNotFound

    with open_app(database_url, schema) as app:
        try:
            forked = app.fork(workflow_id, from_step, new_workflow_id=new_id)
        except (WorkflowNotFound, WorkflowIdConflict) as exc:
            console.print(f"[red]not forked: {escape(str(exc))}[/red]")
            raise typer.Exit(1) from None
        except ValueError as exc:  # a step past the recorded ones
            fail(f"not forked: {exc}")
    if as_json:
        print(json.dumps({"id": workflow_id, "forked": forked.workflow_id, "from_step": from_step}))
    else:
        console.print(f"{workflow_id}: forked from step {from_step} as {forked.workflow_id}")


@workflows_cli.command("send")
def send_message(workflow_id: str, message: Annotated[str, typer.Argument(help="The message, as JSON.")],
                 topic: Annotated[str | None, typer.Option(help="Topic (default: none).")] = None,
                 key: Annotated[str | None, typer.Option(help="Idempotency key.")] = None,
                 database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Send a message to a workflow (received with pgdurable.recv).

    Example: pgdurable workflows send order-42 '{"approved": true}' --topic approval
    """
    from ..errors import WorkflowNotFound

    try:
        value = json.loads(message)
    except json.JSONDecodeError as exc:
        console.print(f"[red]the message must be JSON: {exc}[/red]")
        raise typer.Exit(2) from None
    with open_app(database_url, schema) as app:
        try:
            stored = app.send(workflow_id, value, topic=topic, idempotency_key=key)
        except WorkflowNotFound:
            console.print(f"[red]no execution with id {workflow_id}[/red]")
            raise typer.Exit(1) from None
    if as_json:
        print(json.dumps({"id": workflow_id, "sent": stored}))
    else:
        console.print(f"{workflow_id}: " + ("sent" if stored else "already sent with this key"))


@workflows_cli.command("cancel")
def cancel_workflow(workflow_id: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Cancel an unfinished execution and its unfinished children (a running one stops at once).

    Example: pgdurable workflows cancel order-42
    """
    with open_app(database_url, schema) as app:
        done = app.cancel(workflow_id)
    _report(as_json, workflow_id, "cancelled", done, "is not enqueued or running")


@workflows_cli.command("resume")
def resume_workflow(workflow_id: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Re-enqueue a failed or cancelled execution; completed steps are kept, the failed step runs again.

    Example: pgdurable workflows resume order-42 --json
    """
    with open_app(database_url, schema) as app:
        done = app.resume(workflow_id)
    _report(as_json, workflow_id, "resumed", done, "is not failed or cancelled")


def _report(as_json: bool, workflow_id: str, verb: str, done: bool, why_not: str) -> None:
    if as_json:
        print(json.dumps({"id": workflow_id, verb: done}))
    elif done:
        console.print(f"{workflow_id}: {verb}")
    else:
        console.print(f"[yellow]{workflow_id}: not {verb}: no such execution, or it {why_not}[/yellow]")
    if not done:
        raise typer.Exit(1)
