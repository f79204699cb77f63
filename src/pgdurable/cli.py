"""The ``pgdurable`` command line: run workers, migrate, inspect and steer executions, and the demo."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
from datetime import datetime
from typing import Annotated, Any, cast

import psycopg
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from . import display, store
from .app import App
from .errors import ConfigurationError
from .redaction import describe, redact
from .schedules import CatchUp, Schedule


class _Commands(TyperGroup):
    """Every command: a configuration error (a malformed database URL...) or a database that cannot be reached
    is a message and exit code 2, never a traceback; no message quotes the database password."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            _fail(redact(str(exc)))
        except psycopg.OperationalError as exc:
            _fail(f"the database cannot be reached: {describe(exc)}")


def _fail(message: str) -> None:
    Console(stderr=True).print(f"pgdurable: {message}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


# Tracebacks never show local variables: they would show the database URL with its password.
_NO_LOCALS: dict[str, Any] = {"pretty_exceptions_show_locals": False}
cli = typer.Typer(cls=_Commands, **_NO_LOCALS,
                  help="Durable Python workflows with PostgreSQL as the only orchestrator.\n\n"
                       "Exit codes: 0 done; 1 not done (no such execution, nothing to change, or something "
                       "needs attention); 2 bad input or the database cannot be used. Commands that read or "
                       "change state take --json for scripts.",
                  no_args_is_help=True, add_completion=False)
workflows_cli = typer.Typer(**_NO_LOCALS, help="Inspect and steer workflow executions.", no_args_is_help=True)
cli.add_typer(workflows_cli, name="workflows")
queues_cli = typer.Typer(**_NO_LOCALS, help="Queue policies: concurrency, rate and per-key limits.",
                         no_args_is_help=True)
cli.add_typer(queues_cli, name="queues")
schedules_cli = typer.Typer(**_NO_LOCALS,
                            help="Cron schedules: a workflow enqueued at every tick of a cron expression.",
                            no_args_is_help=True)
cli.add_typer(schedules_cli, name="schedules")
console = Console()

DatabaseUrl = Annotated[str | None, typer.Option(
    "--database-url", envvar="PGDURABLE_DATABASE_URL",
    help="PostgreSQL URL (else DATABASE_URL, else the embedded server).")]
Schema = Annotated[str | None, typer.Option("--schema", envvar="PGDURABLE_SCHEMA",
                                            help="Schema holding pgdurable's tables.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _app(database_url: str | None, schema: str | None) -> App:
    return App(database_url, schema=schema)


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _load_app(target: str) -> App:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter("expected MODULE:APP, for example myproject.workflows:app")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{target} is not a pgdurable.App (found {type(app).__name__})")
    return app


def _jsonable(value: Any) -> Any:
    return display.plain(value)


def _payload(text: str | None) -> Any:
    """Stored JSON decoded, or a note saying why it cannot be shown (nested too deeply): never a crash."""
    return display.json_or_note(text) if text else None


def _execution_dict(execution: store.Execution) -> dict[str, Any]:
    data = {name: _jsonable(getattr(execution, name)) for name in store.Execution.__slots__}
    for column in ("input", "output", "error"):
        data[column] = _payload(data[column])
    return data


def _step_dict(step: store.Step) -> dict[str, Any]:
    data = {name: _jsonable(getattr(step, name)) for name in store.Step.__slots__}
    data["output"], data["error"] = _payload(step.output), _payload(step.error)
    data["duration_ms"] = _millis(step.started_at, step.completed_at)
    return data


def _millis(start: datetime, end: datetime) -> float | None:
    if isinstance(start, display.ExtremeTime) or isinstance(end, display.ExtremeTime):
        return None
    return round((end - start).total_seconds() * 1000, 3)


def _dump(value: Any) -> str:
    """JSON for scripts: strict (no NaN), whatever the rows hold."""
    return json.dumps(display.plain(value), indent=2, allow_nan=False)


def _short(value: Any, width: int = 40) -> str:
    text = value if isinstance(value, str) else display.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _when(value: datetime | None) -> str:
    return display.format_time(value, None)


def _error(text: str | None) -> dict[str, Any]:
    return display.error_fields(text) or {}


@cli.command()
def worker(
    target: Annotated[str, typer.Argument(help="The App to serve, as MODULE:ATTRIBUTE.")],
    queue: Annotated[list[str] | None, typer.Option("--queue", "-q", help="Queue to serve (repeatable).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Executions run at once.")] = 16,
    wait_for_db: Annotated[float, typer.Option(
        "--wait-for-db", help="Seconds to keep retrying while the database does not answer at start.")] = 300.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Serve Prometheus metrics on this port (needs pgdurable[metrics]).")] = None,
    metrics_host: Annotated[str, typer.Option("--metrics-host", help="Address for --metrics-port.")] = "127.0.0.1",
) -> None:
    """Run a worker: claim executions, run them, heartbeat, sweep. SIGTERM/SIGINT stops it gracefully.

    Example: pgdurable worker shop:app --queue orders --concurrency 32 --metrics-port 9100
    """
    _setup_logging(verbose)
    app = _load_app(target)
    import asyncio

    if metrics_port is not None:
        try:
            from .metrics import PrometheusMetrics
        except ImportError:
            console.print("[red]--metrics-port needs the metrics extra: pip install 'pgdurable[metrics]'[/red]")
            raise typer.Exit(2) from None
        app.observe(PrometheusMetrics(app)).serve(metrics_port, metrics_host)  # type: ignore[attr-defined]

    from .errors import ConfigurationError
    from .startup import wait_for_database

    try:
        wait_for_database(app.db, wait_for_db)
    except ConfigurationError as exc:
        console.print(f"pgdurable worker: {redact(str(exc))}", style="red", markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(2) from None

    runner = app.worker(queues=queue or None, concurrency=concurrency)
    asyncio.run(runner.run(handle_signals=True))
    if runner.busy_threads:
        # Released sync workflows may still sit in a step; their work is back on the queue, so leave now.
        logging.getLogger("pgdurable.worker").info("exiting with %d released workflow thread(s) still busy",
                                                   runner.busy_threads)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@cli.command()
def migrate(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Create or upgrade pgdurable's schema (also done automatically on first use).

    Example: PGDURABLE_DATABASE_URL=postgresql://app@db/shop pgdurable migrate --json
    """
    app = App(database_url, schema=schema, auto_migrate=False)
    try:
        applied = app.migrate()
    except ConfigurationError as exc:
        console.print(redact(str(exc)), style="red", markup=False)
        raise typer.Exit(2) from None
    except psycopg.OperationalError as exc:
        console.print(f"the database cannot be reached: {describe(exc)}", style="red", markup=False)
        raise typer.Exit(2) from None
    finally:
        app.close()
    if as_json:
        print(json.dumps({"schema": app.schema, "applied": applied}))
    else:
        console.print(f"schema {app.schema}: " + (f"applied {applied}" if applied else "already up to date"))


@workflows_cli.command("list")
def list_workflows(
    status: Annotated[str | None, typer.Option(help="enqueued, running, succeeded, failed or cancelled")] = None,
    name: Annotated[str | None, typer.Option(help="Workflow name.")] = None,
    queue: Annotated[str | None, typer.Option(help="Queue name.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False,
) -> None:
    """List executions, newest first.

    Example: pgdurable workflows list --status failed --queue orders --limit 20 --json
    """
    with _app(database_url, schema) as app:
        executions = app.list_workflows(status=status, name=name, queue=queue, limit=limit)
    if as_json:
        print(_dump([_execution_dict(e) for e in executions]))
        return
    table = Table("id", "name", "queue", "status", "attempt", "created", "completed", "error")
    for e in executions:
        error = _error(e.error).get("message", "")
        table.add_row(Text(e.id), Text(e.name), e.queue, Text(e.status), str(e.attempt), _when(e.created_at),
                      _when(e.completed_at), Text(_short(error)))
    console.print(table)


@workflows_cli.command("show")
def show_workflow(workflow_id: str, database_url: DatabaseUrl = None, schema: Schema = None,
                  as_json: AsJson = False) -> None:
    """Show one execution: its steps with timings, children, events and messages.

    Example: pgdurable workflows show order-42
    """
    with _app(database_url, schema) as app:
        execution = app.get(workflow_id)
        steps = app.steps(workflow_id)
        children = app.children(workflow_id)
        events = app.db.run(store.list_events(workflow_id))
        messages = app.db.run(store.list_messages(workflow_id))
    if execution is None:
        console.print(f"[red]no execution with id {escape(workflow_id)}[/red]")
        raise typer.Exit(1)
    if as_json:
        print(_dump({
            **_execution_dict(execution), "steps": [_step_dict(s) for s in steps],
            "children": [{"id": c[0], "name": c[1], "status": c[2]} for c in children],
            "events": [{"key": e.key, "step_id": e.step_id, "value": _payload(e.value),
                        "created_at": _jsonable(e.created_at)} for e in events],
            "messages": [{"topic": m.topic, "message": _payload(m.message), "created_at": _jsonable(m.created_at),
                          "consumed_at": _jsonable(m.consumed_at)} for m in messages],
        }))
        return
    summary = Table.grid(padding=(0, 2))
    for label, value in [
        ("id", execution.id), ("workflow", execution.name), ("queue", execution.queue),
        ("status", execution.status + (f" ({execution.wait_reason})" if execution.wait_reason else "")),
        ("attempt", str(execution.attempt)), ("version", execution.app_version or ""),
        ("parent", execution.parent_id or ""), ("forked from", execution.forked_from or ""),
        ("deadline", _when(execution.deadline)),
        ("recoveries", f"{execution.recoveries} of {execution.max_recoveries}"),
        ("owner", execution.owner_id or ""), ("lease expires", _when(execution.lease_expires)),
        ("created", _when(execution.created_at)), ("started", _when(execution.started_at)),
        ("completed", _when(execution.completed_at)), ("input", _short(_payload(execution.input), 100)),
        ("output", _short(_payload(execution.output), 100) if execution.output else ""),
    ]:
        summary.add_row(f"[bold]{label}[/bold]", Text(value))  # data, not markup
    console.print(summary)
    error = _error(execution.error)
    if error:
        console.print(f"[red]error[/red] {escape(error['type'])}: {escape(error['message'])}", highlight=False)
        if error["traceback"]:
            console.print(error["traceback"], markup=False, highlight=False)
    table = Table("step", "name", "outcome", "attempts", "by attempt", "started", "ms")
    for s in steps:
        outcome = f"[red]{escape(_short(_error(s.error)['message']))}[/red]" if s.error \
            else escape(_short(_payload(s.output)))
        duration = _millis(s.started_at, s.completed_at)
        table.add_row(str(s.step_id), Text(s.step_name), outcome, str(s.attempts), str(s.recorded_by_attempt),
                      _when(s.started_at), "" if duration is None else f"{duration:.1f}")
    console.print(table)
    if children:
        kids = Table("child", "workflow", "status", title=f"{len(children)} child workflows")
        for c in children[:50]:
            kids.add_row(Text(c[0]), Text(c[1]), Text(c[2]))
        console.print(kids)
    for e in events:
        console.print(f"event [bold]{escape(e.key)}[/bold] (step {e.step_id}): {escape(_short(_payload(e.value)))}",
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
    from .errors import WorkflowIdConflict, WorkflowNotFound

    with _app(database_url, schema) as app:
        try:
            forked = app.fork(workflow_id, from_step, new_workflow_id=new_id)
        except (WorkflowNotFound, WorkflowIdConflict) as exc:
            console.print(f"[red]not forked: {exc}[/red]")
            raise typer.Exit(1) from None
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
    from .errors import WorkflowNotFound

    try:
        value = json.loads(message)
    except json.JSONDecodeError as exc:
        console.print(f"[red]the message must be JSON: {exc}[/red]")
        raise typer.Exit(2) from None
    with _app(database_url, schema) as app:
        try:
            stored = app.send(workflow_id, value, topic=topic, idempotency_key=key)
        except WorkflowNotFound:
            console.print(f"[red]no execution with id {workflow_id}[/red]")
            raise typer.Exit(1) from None
    if as_json:
        print(json.dumps({"id": workflow_id, "sent": stored}))
    else:
        console.print(f"{workflow_id}: " + ("sent" if stored else "already sent with this key"))


@queues_cli.command("list")
def list_queues(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Queues that have a policy (limits), as set by `app.queue(...)` or `pgdurable queues set`.

    Example: pgdurable queues list --json
    """
    with _app(database_url, schema) as app:
        policies = app.db.run(store.queue_policies(None))
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
    with _app(database_url, schema) as app:
        try:
            policy = app.queue(name, concurrency=concurrency, worker_concurrency=worker_concurrency,
                               rate_limit=rate_limit, rate_period=rate_period, key_concurrency=key_concurrency)
        except ValueError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        app.db.run(store.set_queue_policy(policy))
    stored = policy.claims_in_sql or policy.worker_concurrency is not None
    if as_json:
        print(json.dumps({"queue": name, "policy": dataclasses.asdict(policy) if stored else None}))
    else:
        console.print(f"queue {name}: " + ("policy stored" if stored else "policy removed"))


@workflows_cli.command("cancel")
def cancel_workflow(workflow_id: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Cancel an unfinished execution and its unfinished children (a running one stops at once).

    Example: pgdurable workflows cancel order-42
    """
    with _app(database_url, schema) as app:
        done = app.cancel(workflow_id)
    _report(as_json, workflow_id, "cancelled", done, "is not enqueued or running")


@workflows_cli.command("resume")
def resume_workflow(workflow_id: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Re-enqueue a failed or cancelled execution; completed steps are kept, the failed step runs again.

    Example: pgdurable workflows resume order-42 --json
    """
    with _app(database_url, schema) as app:
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


@cli.command()
def workers(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Live workers (with their application version), and enqueued executions no live worker can run.

    Example: pgdurable workers --json
    """
    with _app(database_url, schema) as app:
        rows = app.db.run(store.list_workers())
        stuck = app.db.run(store.list_unrunnable(100))
    if as_json:
        keys = ("id", "hostname", "pid", "queues", "workflows", "concurrency", "started_at", "heartbeat_at",
                "alive", "app_version")
        print(json.dumps({"workers": [{k: _jsonable(v) for k, v in zip(keys, row, strict=True)} for row in rows],
                          "unrunnable": [{"id": r[0], "name": r[1], "queue": r[2], "reason": r[4]}
                                         for r in stuck]}, indent=2))
        return
    table = Table("worker", "queues", "workflows", "concurrency", "version", "heartbeat", "alive")
    for row in rows:
        table.add_row(row[0], ",".join(row[3]), str(len(row[4])), str(row[5]), row[9] or "", _when(row[7]),
                      "yes" if row[8] else "[red]no[/red]")
    console.print(table)
    if stuck:
        unrunnable = Table("id", "name", "queue", "reason", title="No live worker can run these")
        for r in stuck:
            unrunnable.add_row(r[0], r[1], r[2], r[4])
        console.print(unrunnable)


def _schedule_dict(schedule: Schedule) -> dict[str, Any]:
    return {name: _jsonable(getattr(schedule, name)) for name in Schedule.__slots__}


@schedules_cli.command("list")
def list_schedules(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """List schedules: their timetable, next and last tick, and whether they are paused (and why)."""
    with _app(database_url, schema) as app:
        found = app.list_schedules()
    if as_json:
        print(json.dumps([_schedule_dict(s) for s in found], indent=2))
        return
    table = Table("name", "workflow", "cron", "timezone", "queue", "catch up", "next tick", "last tick", "state")
    for s in found:
        state = "active" if not s.paused else f"[red]paused: {s.last_error}[/red]" if s.last_error else "paused"
        table.add_row(s.name, s.workflow_name, s.cron, s.timezone, s.queue, s.catch_up,
                      _when(s.next_fire_at) if not s.paused else "", _when(s.last_fired_at), state)
    console.print(table)


@schedules_cli.command("create")
def create_schedule(
    name: Annotated[str, typer.Argument(help="The schedule's name (letters, digits, _ . : -).")],
    workflow: Annotated[str, typer.Argument(help="The workflow's name, as its workers register it.")],
    cron: Annotated[str, typer.Argument(
        help="5 fields (minute hour day month weekday), 6 with seconds first, or @hourly, @daily...")],
    timezone: Annotated[str, typer.Option("--timezone", "--tz", help="IANA time zone of the cron's times.")] = "UTC",
    queue: Annotated[str | None, typer.Option(help="Queue (default: 'default').")] = None,
    priority: Annotated[int | None, typer.Option(help="Priority of the executions (lower runs first).")] = None,
    args: Annotated[str | None, typer.Option("--args", help='Keyword arguments as a JSON object: \'{"n": 1}\'.')]
    = None,
    catch_up: Annotated[str, typer.Option(
        "--catch-up", help="After downtime: 'skip' (fire only ticks late by < 60 s) or 'all'.")] = "skip",
    pass_scheduled_at: Annotated[bool, typer.Option(
        "--pass-scheduled-at", help="Pass each tick's time as the argument scheduled_at.")] = False,
    database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False,
) -> None:
    """Create a schedule, or redefine the one with this name (its next tick stays unless the cron changed)."""
    arguments: Any = None
    if args is not None:
        try:
            arguments = json.loads(args)
        except json.JSONDecodeError as exc:
            console.print(f"[red]--args is not valid JSON: {exc}[/red]")
            raise typer.Exit(2) from None
        if not isinstance(arguments, dict):
            console.print("[red]--args must be a JSON object of keyword arguments, like '{\"n\": 1}'[/red]")
            raise typer.Exit(2)
    with _app(database_url, schema) as app:
        try:
            created = app.schedule(name, workflow, cron, timezone=timezone, queue=queue, priority=priority,
                                   args=arguments, catch_up=cast("CatchUp", catch_up),
                                   pass_scheduled_at=pass_scheduled_at)
        except (ValueError, TypeError) as exc:
            console.print(str(exc), markup=False, style="red")
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(_schedule_dict(created), indent=2))
    else:
        paused = " [yellow](paused)[/yellow]" if created.paused else ""
        console.print(f"schedule {created.name}: {created.workflow_name} at {created.cron!r} ({created.timezone}), "
                      f"next tick {_when(created.next_fire_at)}{paused}")


def _schedule_command(verb: str, name: str, as_json: bool, done: bool) -> None:
    if as_json:
        print(json.dumps({"name": name, verb: done}))
    elif done:
        console.print(f"schedule {name}: {verb}")
    else:
        console.print(f"[yellow]no schedule named {name}[/yellow]")
    if not done:
        raise typer.Exit(1)


@schedules_cli.command("delete")
def delete_schedule(name: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Delete a schedule (executions it already enqueued are left alone)."""
    with _app(database_url, schema) as app:
        done = app.unschedule(name)
    _schedule_command("deleted", name, as_json, done)


@schedules_cli.command("pause")
def pause_schedule(name: str, database_url: DatabaseUrl = None, schema: Schema = None,
                   as_json: AsJson = False) -> None:
    """Stop firing a schedule until it is resumed."""
    with _app(database_url, schema) as app:
        done = app.pause_schedule(name)
    _schedule_command("paused", name, as_json, done)


@schedules_cli.command("resume")
def resume_schedule(name: str, database_url: DatabaseUrl = None, schema: Schema = None,
                    as_json: AsJson = False) -> None:
    """Fire a paused schedule again from its next tick (the ticks missed while paused do not fire)."""
    with _app(database_url, schema) as app:
        try:
            done = app.resume_schedule(name)
        except ValueError as exc:
            console.print(str(exc), markup=False, style="red")
            raise typer.Exit(2) from None
    _schedule_command("resumed", name, as_json, done)


@cli.command()
def demo(
    database_url: DatabaseUrl = None,
    workflows: Annotated[int, typer.Option(help="How many workflows to run.")] = 3,
) -> None:
    """Watch workflows survive a SIGKILLed worker: they finish from their checkpoints on another one."""
    from .demo import run_demo

    raise typer.Exit(run_demo(database_url, workflows, console))


# -- operations: status, cleanup, dashboard ------------------------------------------------------------------

# Epilogs: typer rewraps each paragraph, so a paragraph is one line (blank lines separate them); they are rich
# markup, so a literal [ is written \[.
_STATUS_EPILOG = (
    "Examples:\n\n  pgdurable status\n\n  pgdurable status --json | jq .queues\n\n"
    "Exit codes: 0 healthy; 1 something needs attention (enqueued work no live worker can run, expired leases "
    "nobody sweeps, waiting work past its wake-up time, a schema to migrate, vacuum falling behind); 2 the "
    "database cannot be reached.")
_CLEANUP_EPILOG = (
    "Examples:\n\n  pgdurable cleanup --older-than 30d\n\n"
    "  pgdurable cleanup --older-than 7d --status failed,cancelled --dry-run\n\n"
    "  pgdurable cleanup --older-than 12h --batch-size 500 --json\n\n"
    "Exit codes: 0 done (or nothing to delete); 2 bad arguments or the database cannot be reached.")
_DASHBOARD_EPILOG = (
    "Examples:\n\n  pgdurable dashboard\n\n  pgdurable dashboard --read-only\n\n"
    "  pgdurable dashboard --host 0.0.0.0 --port 9000 --token \"$DASHBOARD_TOKEN\"\n\n"
    "  pgdurable dashboard --host 0.0.0.0 --read-only --allowed-host dash.internal\n\n"
    "Security: it listens on loopback unless --host says otherwise. Actions (cancel, resume, fork) need a token: "
    "with neither --token nor --read-only a random one is made and printed as a login link. Any other address "
    "needs --token, or --read-only with --allowed-host (the Host names it answers to; others are refused). "
    "A login is a server-side session that logout ends; repeated wrong tokens are backed off (429).\n\n"
    "Exit code 2: bad options, or the dashboard extra is not installed (pip install 'pgdurable\\[dashboard]').")


@cli.command(epilog=_STATUS_EPILOG)
def status(database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False) -> None:
    """Queues (ready, waiting, running), live workers, stuck work and database health, with an exit code."""
    from . import status as health

    app = App(database_url, schema=schema, auto_migrate=False)
    try:
        report = health.collect(app.db.conninfo, app.schema)
    except (ConfigurationError, psycopg.OperationalError) as exc:
        # A malformed URL or a database that does not answer; never with the URL's password.
        reason = redact(str(exc)) if isinstance(exc, ConfigurationError) else describe(exc)
        if as_json:
            print(json.dumps({"healthy": False, "exit_code": health.UNREACHABLE, "error": reason}))
        else:
            console.print(f"[red]database unreachable:[/red] {escape(reason)}")
        raise typer.Exit(health.UNREACHABLE) from None
    finally:
        app.close()
    if as_json:
        print(_dump(report.to_json()))
    else:
        health.render(report, console)
    raise typer.Exit(report.exit_code)


@cli.command(epilog=_CLEANUP_EPILOG)
def cleanup(
    older_than: Annotated[str, typer.Option(
        "--older-than", help="Delete executions created and finished longer ago than this: 30d, 12h, 90m, 2w.")],
    status: Annotated[str, typer.Option(
        "--status", help="Comma-separated finished statuses to delete.")] = "succeeded,failed,cancelled",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Executions deleted per transaction.")] = 1000,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count what would be deleted.")] = False,
    database_url: DatabaseUrl = None, schema: Schema = None, as_json: AsJson = False,
) -> None:
    """Delete finished executions with their steps, messages and events, in batches that never block workers."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import retention

    try:
        age = retention.parse_duration(older_than)
        statuses = retention.check_statuses(s.strip() for s in status.split(",") if s.strip())
    except ValueError as exc:
        console.print(f"[red]pgdurable cleanup: {escape(str(exc))}[/red]")
        raise typer.Exit(2) from None
    progress = Progress(TextColumn("deleting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), disable=as_json or dry_run)
    task = progress.add_task("cleanup", total=None)
    app = App(database_url, schema=schema, auto_migrate=False)
    try:
        with app, progress:
            result = retention.cleanup(
                app.db, age, statuses, batch_size=batch_size, dry_run=dry_run,
                on_start=lambda total: progress.update(task, total=total),
                on_batch=lambda batch: progress.advance(task, batch.executions))
    except psycopg.errors.UndefinedTable:
        console.print(f"[red]pgdurable cleanup: pgdurable is not installed in schema {escape(app.schema)}[/red]")
        raise typer.Exit(2) from None
    except psycopg.OperationalError as exc:
        console.print(f"[red]pgdurable cleanup: database unreachable: {escape(describe(exc))}[/red]")
        raise typer.Exit(2) from None
    if as_json:
        key = "would_delete" if dry_run else "deleted"
        print(json.dumps({key: result.executions, "steps_deleted": result.steps,
                          "messages_deleted": result.messages, "events_deleted": result.events,
                          "dry_run": dry_run, "older_than_seconds": age.total_seconds(), "statuses": statuses}))
    elif dry_run:
        console.print(f"would delete {result.executions:,} executions ({', '.join(statuses)}) "
                      f"older than {older_than}")
    else:
        extra = f" ({result.messages:,} messages, {result.events:,} events)" if result.messages or result.events else ""
        console.print(f"deleted {result.executions:,} executions and {result.steps:,} step outputs{extra}")


@cli.command(epilog=_DASHBOARD_EPILOG)
def dashboard(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    token: Annotated[str | None, typer.Option(
        envvar="PGDURABLE_DASHBOARD_TOKEN", help="Secret needed to open the dashboard and to act.")] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="No actions: view only.")] = False,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="A Host name browsers use to reach it (repeatable); other Host headers are "
                               "refused (DNS rebinding).")] = None,
    database_url: DatabaseUrl = None, schema: Schema = None,
) -> None:
    """Serve the web dashboard: overview, workflows, steps timeline, cancel/resume/fork."""
    from .dashboard.serve import DashboardOptionsError, serve

    _setup_logging()
    try:
        serve(App(database_url, schema=schema, auto_migrate=False), host=host, port=port, token=token,
              read_only=read_only, console=console, allowed_hosts=allowed_host or ())
    except DashboardOptionsError as exc:
        console.print(f"[red]pgdurable dashboard: {escape(str(exc))}[/red]")
        raise typer.Exit(2) from None


def main() -> None:
    cli()
