"""``pgdurable status``: one look at queues, workers, stuck work and the database, with an exit code that
scripts and health checks can rely on: 0 healthy, 1 something needs attention, 2 database unreachable."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import display, monitoring, store
from .db import configure
from .migrations import applied_version, latest_version

HEALTHY, ATTENTION, UNREACHABLE = 0, 1, 2
# A table whose dead tuples exceed this share of its live ones (and this many rows) is vacuumed too rarely.
_DEAD_RATIO, _DEAD_MIN = 0.5, 10_000


@dataclass
class Report:
    schema: str
    schema_version: int
    latest_version: int
    server: monitoring.ServerInfo | None = None
    queues: list[monitoring.QueueStats] = field(default_factory=list)
    workers: list[monitoring.WorkerInfo] = field(default_factory=list)
    unrunnable_count: int = 0
    unrunnable: list[monitoring.Unrunnable] = field(default_factory=list)
    tables: list[monitoring.TableStats] = field(default_factory=list)
    attention: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return ATTENTION if self.attention else HEALTHY

    def to_json(self) -> dict[str, Any]:
        data = _plain(asdict(self))
        data["healthy"] = not self.attention
        data["exit_code"] = self.exit_code
        return data  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    return display.plain(value)


def collect(conninfo: str, schema: str, *, connect_timeout: int = 5) -> Report:
    """Read everything in one read-only transaction. Raises ``psycopg.OperationalError`` if the database
    cannot be reached."""
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=connect_timeout) as conn:
        configure(conn, schema)
        report = Report(schema, applied_version(conn, schema), latest_version())
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            conn.execute("SET LOCAL statement_timeout = '30s'")
            report.server = store.run(conn, monitoring.server())
            report.tables = store.run(conn, monitoring.tables(schema))
            if report.schema_version > 0:
                report.queues = store.run(conn, monitoring.queues())
                report.workers = store.run(conn, monitoring.workers())
                report.unrunnable_count = store.run(conn, monitoring.unrunnable_count())
                report.unrunnable = store.run(conn, monitoring.unrunnable(20))
    report.attention = attention(report)
    return report


def attention(report: Report) -> list[str]:
    """What an operator should look at, one sentence each; empty when all is well."""
    found: list[str] = []
    if report.schema_version == 0:
        return [f"pgdurable is not installed in schema {report.schema!r}: run `pgdurable migrate`"]
    if report.schema_version < report.latest_version:
        found.append(f"schema {report.schema!r} is at version {report.schema_version}, this pgdurable has "
                     f"{report.latest_version}: run `pgdurable migrate`")
    elif report.schema_version > report.latest_version:
        found.append(f"schema {report.schema!r} is at version {report.schema_version}, newer than this "
                     f"pgdurable ({report.latest_version}): upgrade pgdurable here")
    if report.unrunnable_count:
        found.append(f"{report.unrunnable_count} enqueued execution(s) that no live worker can run")
    for q in report.queues:
        if q.stale:
            found.append(f"queue {q.queue}: {q.stale} running execution(s) with leases expired over a minute "
                         "ago (is any worker sweeping?)")
        if q.overdue:
            found.append(f"queue {q.queue}: {q.overdue} waiting execution(s) due over a minute ago "
                         "(is any worker running? its timer wakes them)")
    for t in report.tables:
        if t.dead_tuples > _DEAD_MIN and t.dead_tuples > _DEAD_RATIO * max(t.live_tuples, 1):
            found.append(f"table {t.name}: {t.dead_tuples:,} dead tuples for {t.live_tuples:,} live "
                         "(vacuum is falling behind)")
    return found


def _age(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return ""
    if math.isinf(seconds):
        return "∞" if seconds > 0 else "-∞"
    if seconds < 0:
        return "-" + _age(-seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def render(report: Report, console: Console) -> None:
    server = report.server
    head = f"schema [bold]{report.schema}[/bold] version {report.schema_version}/{report.latest_version}"
    if server is not None:
        head += f" · PostgreSQL {server.version} · database {_size(server.database_bytes)}"
    console.print(head, highlight=False)
    if report.queues:
        queues = Table("queue", "ready", "waiting", "running", "oldest ready", "workers", title="Queues")
        for q in report.queues:
            ready = str(q.ready) + (f" (+{q.delayed} later)" if q.delayed else "")
            # by wait_reason: delay, sleep, recv (a message), children
            waiting = str(q.waiting)
            if q.waiting_for:
                waiting += " (" + ", ".join(f"{n} {kind}" for kind, n in q.waiting_for.items()) + ")"
            queues.add_row(Text(q.queue), ready, waiting, str(q.running), _age(q.oldest_ready_seconds),
                           str(q.live_workers))
        console.print(queues)
    live = [w for w in report.workers if w.alive]
    if report.workers:
        workers = Table("worker", "queues", "concurrency", "heartbeat", "alive", title=f"Workers ({len(live)} live)")
        now = server.now if server is not None else None
        for w in report.workers:
            beat = _age((now - w.heartbeat_at).total_seconds()) + " ago" if now is not None else ""
            if isinstance(w.heartbeat_at, display.ExtremeTime):
                beat = w.heartbeat_at.source
            workers.add_row(Text(w.id), Text(",".join(w.queues)), str(w.concurrency), beat,
                            "yes" if w.alive else "[red]no[/red]")
        console.print(workers)
    elif report.schema_version:
        console.print("no workers registered")
    if report.unrunnable:
        stuck = Table("id", "name", "queue", "reason",
                      title=f"No live worker can run these ({report.unrunnable_count})")
        for u in report.unrunnable:
            stuck.add_row(Text(u.id), Text(u.name), Text(u.queue), Text(u.reason))
        console.print(stuck)
    if report.tables:
        tables = Table("table", "total size", "live rows", "dead rows", "last autovacuum", title="Tables")
        for t in report.tables:
            vacuumed = t.last_autovacuum or t.last_vacuum
            tables.add_row(t.name, _size(t.total_bytes), f"{t.live_tuples:,}", f"{t.dead_tuples:,}",
                           display.format_time(vacuumed, vacuumed.tzinfo, "%Y-%m-%d %H:%M") if vacuumed else "never")
        console.print(tables)
    if report.attention:
        console.print("[yellow bold]needs attention[/yellow bold]")
        for line in report.attention:
            console.print(f"  [yellow]•[/yellow] {escape(line)}", highlight=False)
    else:
        console.print("[green]healthy[/green]")
