"""Every read path answers for any row the database holds: `pgdurable status` (and --json), `workflows
list/show` (and --json), and every dashboard page. The hostile rows are written with plain SQL as the schema
owner (old rows, hand edits): infinite and out-of-range times, non-finite timeouts, JSON nested thousands of
levels deep in every payload, and errors that are not objects."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.dashboard import create_app, views
from pgdurable.monitoring import parse_time

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

DEEP = "[" * 3000 + "]" * 3000
DEEP_OBJECT = '{"a":' * 3000 + "1" + "}" * 3000
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|RecursionError|DataError|OverflowError")

# id -> columns (SQL expressions) of a hostile execution
HOSTILE: dict[str, dict[str, str]] = {
    "avail-inf": {"available_at": "'infinity'"},
    "avail-neginf": {"available_at": "'-infinity'"},
    "avail-20000": {"available_at": "'20000-01-01 00:00:00+00'"},
    "avail-bc": {"available_at": "'0044-03-15 00:00:00+00 BC'"},
    "created-inf": {"created_at": "'infinity'", "updated_at": "'infinity'"},
    "created-neginf": {"created_at": "'-infinity'"},
    "created-20000": {"created_at": "'20000-06-01 12:00:00+00'"},
    "deadline-inf": {"deadline": "'infinity'", "timeout_seconds": "'Infinity'"},
    "deadline-neginf": {"deadline": "'-infinity'", "timeout_seconds": "'NaN'"},
    "timeout-huge": {"timeout_seconds": "1e300"},
    "waiting-neginf": {"status": "'waiting'", "wait_reason": "'sleep'", "available_at": "'-infinity'",
                       "started_at": "'-infinity'"},
    "running-inf": {"status": "'running'", "owner_id": "'w-ghost'", "lease_expires": "'-infinity'",
                    "started_at": "'infinity'"},
    "done-inf": {"status": "'succeeded'", "started_at": "'-infinity'", "completed_at": "'infinity'",
                 "output": f"'{DEEP}'"},
    "done-20000": {"status": "'failed'", "started_at": "now()", "completed_at": "'20000-01-01'",
                   "error": f"'{DEEP}'"},
    "deep-input": {"input": f"'{DEEP}'", "status": "'failed'", "completed_at": "now()",
                   "error": "'[1, 2, 3]'"},
    "deep-object": {"input": f"'{DEEP_OBJECT}'", "output": f"'{DEEP_OBJECT}'", "status": "'succeeded'",
                    "completed_at": "now()", "trace_context": f"'{DEEP}'"},
    "error-shapes": {"status": "'failed'", "completed_at": "now()",
                     "error": "'{\"type\": [1], \"message\": {\"deep\": " + DEEP + "}, \"traceback\": 7}'"},
    "error-string": {"status": "'failed'", "completed_at": "now()", "error": "'\"just a string\"'"},
}
STEPS: list[dict[str, str]] = [
    {"execution_id": "'deep-input'", "step_id": "1", "output": f"'{DEEP}'"},
    {"execution_id": "'deep-input'", "step_id": "2", "error": f"'{DEEP}'"},
    {"execution_id": "'deep-input'", "step_id": "3", "output": "'1'", "started_at": "'-infinity'",
     "completed_at": "'infinity'"},
    {"execution_id": "'deep-input'", "step_id": "4", "error": "'\"a string error\"'",
     "started_at": "'20000-01-01'", "completed_at": "'20000-01-02'"},
    {"execution_id": "'done-inf'", "step_id": "1", "output": f"'{DEEP_OBJECT}'"},
]


def insert(conn: psycopg.Connection[Any], table: str, columns: dict[str, str]) -> None:
    """INSERT one row given as SQL expressions, as the schema owner. CHECK constraints and validation triggers
    added later to refuse such rows are dropped in this test's own schema first (old rows predate them)."""
    names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    values = sql.SQL(", ").join(sql.SQL(v) for v in columns.values())  # type: ignore[arg-type]
    statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(sql.Identifier(table), names, values)
    try:
        with conn.transaction():
            conn.execute(statement)
    except (psycopg.errors.IntegrityError, psycopg.errors.DataException, psycopg.errors.RaiseException):
        _drop_validation(conn, table)
        conn.execute(statement)


def _drop_validation(conn: psycopg.Connection[Any], table: str) -> None:
    for (name,) in conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'", (table,)).fetchall():
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(sql.Identifier(table), sql.Identifier(name)))
    conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(sql.Identifier(table)))


@pytest.fixture
def hostile(db: psycopg.Connection[Any]) -> list[str]:
    for workflow_id, columns in HOSTILE.items():
        insert(db, "workflow_executions", {"id": f"'{workflow_id}'", "name": "'hostile'", **columns})
    for step in STEPS:
        insert(db, "operation_outputs", {"step_name": "'s'", "attempts": "1", "recorded_by_attempt": "0",
                                         "started_at": "now()", **step})
    insert(db, "workflow_events", {"execution_id": "'deep-input'", "key": "'k'", "step_id": "5",
                                   "value": f"'{DEEP}'", "created_at": "'infinity'"})
    insert(db, "workflow_events", {"execution_id": "'deep-input'", "key": "'k'", "step_id": "6",
                                   "value": f"'{DEEP_OBJECT}'"})
    insert(db, "workflow_messages", {"destination_id": "'deep-input'", "message": f"'{DEEP}'",
                                     "created_at": "'-infinity'", "consumed_at": "'20000-01-01'"})
    insert(db, "workers", {"id": "'w-ghost'", "hostname": "'h'", "pid": "1", "queues": "'{default}'",
                           "workflows": "'{hostile}'", "concurrency": "1", "started_at": "'-infinity'",
                           "heartbeat_at": "'infinity'"})
    insert(db, "workers", {"id": "'w-old'", "hostname": "'h'", "pid": "2", "queues": "'{default}'",
                           "workflows": "'{hostile}'", "concurrency": "1", "started_at": "'-infinity'",
                           "heartbeat_at": "'20000-01-01'"})
    insert(db, "schedules", {"name": "'sched-inf'", "workflow_name": "'hostile'", "cron": "'* * * * *'",
                             "next_fire_at": "'infinity'", "last_fired_at": "'-infinity'"})
    insert(db, "schedules", {"name": "'sched-20000'", "workflow_name": "'hostile'", "cron": "'* * * * *'",
                             "next_fire_at": "'20000-01-01'", "last_fired_at": "'0044-03-15 BC'"})
    return list(HOSTILE)


def _cli(database_url: str, schema: str, *args: str) -> Any:
    return CliRunner().invoke(cli, [*args, "--database-url", database_url, "--schema", schema])


def _clean(result: Any, *codes: int) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (codes or (0,)), result.output[-3000:]
    assert not TRACEBACK.search(result.output), result.output[-3000:]
    return str(result.output)


def test_status_answers_for_hostile_rows(hostile: list[str], database_url: str, schema: str) -> None:
    _clean(_cli(database_url, schema, "status"), 0, 1)
    report = json.loads(_clean(_cli(database_url, schema, "status", "--json"), 0, 1))
    assert report["queues"] and report["schema"] == schema
    for args in (["workers"], ["schedules", "list"], ["queues", "list"]):  # the other read commands too
        _clean(_cli(database_url, schema, *args))
        json.loads(_clean(_cli(database_url, schema, *args, "--json")))


def test_workflows_list_and_show_answer_for_hostile_rows(hostile: list[str], database_url: str,
                                                         schema: str) -> None:
    _clean(_cli(database_url, schema, "workflows", "list", "--limit", "100"))
    listed = json.loads(_clean(_cli(database_url, schema, "workflows", "list", "--limit", "100", "--json")))
    assert {e["id"] for e in listed} >= set(hostile)
    for workflow_id in hostile:
        shown = _clean(_cli(database_url, schema, "workflows", "show", workflow_id))
        assert workflow_id in shown
        data = json.loads(_clean(_cli(database_url, schema, "workflows", "show", workflow_id, "--json")))
        assert data["id"] == workflow_id
    deep = json.loads(_clean(_cli(database_url, schema, "workflows", "show", "deep-input", "--json")))
    assert "nested" in json.dumps(deep["input"])  # the unreadable value says why, instead of crashing
    timeouts = json.loads(_clean(_cli(database_url, schema, "workflows", "show", "deadline-neginf", "--json")))
    assert timeouts["timeout_seconds"] == "NaN" and timeouts["deadline"] == "-infinity"


def test_every_dashboard_page_answers_for_hostile_rows(hostile: list[str], app: pgdurable.App) -> None:
    c = TestClient(create_app(app), follow_redirects=False, raise_server_exceptions=False)
    pages = ["/", "/?fragment=1", "/workflows", "/workflows?fragment=1", "/workflows?limit=200",
             "/workflows?status=failed", "/workflows?within=24h", "/schedules", "/schedules?fragment=1",
             "/metrics", "/healthz"]
    pages += [f"/workflow?id={w}" for w in hostile] + [f"/workflow?id={w}&fragment=1" for w in hostile]
    pages += [f"/workflow/payload?id=deep-input&column={c}" for c in ("input", "output", "error")]
    for page in pages:
        response = c.get(page)
        assert response.status_code in (200, 404), (page, response.status_code, response.text[-2000:])
        assert not TRACEBACK.search(response.text), page
    detail = c.get("/workflow?id=deep-input").text
    assert "nested too deeply" in detail


def test_paging_visits_every_hostile_row_once(hostile: list[str], app: pgdurable.App) -> None:
    c = TestClient(create_app(app), follow_redirects=False)
    seen: list[str] = []
    page = c.get("/workflows?limit=3").text
    for _ in range(30):
        seen += [m for m in re.findall(r'href="/workflow\?id=([^"&]+)"', page) if m in HOSTILE]
        older = re.search(r'<a class="button" href="([^"]+)" rel="next">', page)
        if not older:
            break
        page = c.get(older.group(1).replace("&amp;", "&")).text
    assert sorted(seen) == sorted(hostile)


def test_time_and_json_helpers_never_raise() -> None:
    for text in ("infinity", "-infinity", "20000-01-01T00:00:00+00:00", "0044-03-15T00:00:00+00:00 BC",
                 "2026-01-01T00:00:00+00:00", "garbage"):
        parse_time(text)
    assert views.duration(float("nan")) == "" and views.duration(float("inf")) == "∞"
    assert views.duration(1e300) and views.duration(-1e300) is not None
    assert "nested too deeply" in str(views.json_html(DEEP))
    assert views.json_html(json.dumps(list(range(3)))) is not None


def test_loaders_keep_postgresql_text_of_extreme_times_in_text_and_binary(database_url: str) -> None:
    from pgdurable.display import ExtremeTime, register_loaders

    query = ("SELECT 'infinity'::timestamptz, '-infinity'::timestamptz, '20000-01-01 12:34:56+00'::timestamptz, "
             "'0044-03-15 00:00:00+00 BC'::timestamptz, '2026-01-01 00:00:00+00'::timestamptz")
    with psycopg.connect(database_url) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        register_loaders(conn.adapters)
        for binary in (False, True):
            row = conn.cursor(binary=binary).execute(query).fetchone()
            assert row is not None
            assert [str(v) for v in row[:4]] == ["infinity", "-infinity", "20000-01-01 12:34:56+00",
                                                 "0044-03-15 00:00:00+00 BC"]
            assert all(isinstance(v, ExtremeTime) for v in row[:4]) and not isinstance(row[4], ExtremeTime)
            assert row[0] > row[4] > row[1] and row[2] > row[4] > row[3]
            # PostgreSQL reads each back as the same time
            same = conn.execute("SELECT %s::timestamptz = %s::timestamptz", (row[2].source, "20000-01-01 12:34:56+00"))
            assert same.fetchone() == (True,)
