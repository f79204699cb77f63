"""The one-execution enqueues (app.enqueue's ``enqueue`` named query, and enqueue_workflow's
insert_execution_v1, each a plain INSERT) write the row insert_executions_v2 writes for the same options: the
function stays the insert path of every other way of creating executions (bulk, children, schedules, table
bindings, debounced enqueues), and they must not drift."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from pgdurable import store
from pgdurable.store.calls import Call

_NOW = "2026-06-01 12:00:00+00"

_OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "delayed": {"delay": 30.5},
    "timeout": {"timeout": 12.5},
    "keys": {"dedup_key": "d", "concurrency_key": "c"},
    "tags": {"tags": '{"team": "billing"}'},
    "empty tags": {"tags": "{}"},
    "trace": {"trace": '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'},
    "json null trace and tags": {"trace": "null", "tags": "null"},
    "queue, priority, recoveries": {"queue": "billing.eu:1", "priority": -3, "max_recoveries": 0},
}


def _enqueue(id: str, **options: Any) -> Call[store.executions.Enqueued | None]:
    given: dict[str, Any] = {"name": "w", "queue": "q", "priority": 0, "input": '{"n": 1}', "max_recoveries": 5,
                             "delay": 0.0}
    return store.executions.enqueue(id=id, **{**given, **options})


def _through_the_function(call: Call[Any]) -> Call[Any]:
    """The same parameters through insert_executions_v2 (the debounced statement, with no debounce key)."""
    return Call("enqueue_debounced", call.params, call.read, row_factory=call.row_factory)


def _row(db: psycopg.Connection[Any], id: str) -> dict[str, Any]:
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM workflow_executions WHERE id = %s", (id,)).fetchone()
    assert row is not None
    return {k: v for k, v in row.items() if k not in ("id", "seq")}


@pytest.mark.parametrize("options", _OPTIONS.values(), ids=_OPTIONS.keys())
def test_the_plain_enqueue_writes_the_row_insert_executions_v2_writes(db: psycopg.Connection[Any],
                                                                       options: dict[str, Any]) -> None:
    db.execute("SELECT set_config('pgdurable.fake_now', %s, false)", (_NOW,))  # both read one clock
    plain = _enqueue("plain", **options)
    assert plain.name == "enqueue"
    function = _through_the_function(_enqueue("function", **options))
    if "dedup_key" in options:  # two unfinished executions cannot hold one key: take the key back in between
        assert store.run(db, plain) == store.executions.Enqueued("plain", "w", True)
        db.execute("UPDATE workflow_executions SET status = 'cancelled' WHERE id = 'plain'")
        written = _row(db, "plain")
        assert store.run(db, function) == store.executions.Enqueued("function", "w", True)
        db.execute("UPDATE workflow_executions SET status = 'cancelled' WHERE id = 'function'")
        assert _row(db, "function") == written
        return
    assert store.run(db, plain) == store.executions.Enqueued("plain", "w", True)
    assert store.run(db, function) == store.executions.Enqueued("function", "w", True)
    assert _row(db, "plain") == _row(db, "function")
    assert _row(db, "plain")["status"] == ("waiting" if "delay" in options else "enqueued")


def test_an_enqueue_that_finds_its_id_or_key_taken_creates_nothing(db: psycopg.Connection[Any]) -> None:
    assert store.run(db, _enqueue("a", dedup_key="k")) is not None
    assert store.run(db, _enqueue("a")) is None  # the id
    assert store.run(db, _enqueue("b", dedup_key="k")) is None  # the key, held by an unfinished execution
    assert store.run(db, store.executions.find_enqueued(id="b", queue="q", dedup_key="k")) == \
        store.executions.Enqueued("a", "w", False)
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (1,)


def test_a_row_the_table_refuses_is_refused_by_the_plain_enqueue_too(db: psycopg.Connection[Any]) -> None:
    """The statement writes through the table's rules, like the function (the options were checked in Python
    already; this is what SQL would do with a bad one)."""
    with pytest.raises(psycopg.errors.CheckViolation):
        store.run(db, _enqueue("x", queue="no spaces"))
    with pytest.raises(psycopg.errors.CheckViolation):
        store.run(db, _enqueue("y", timeout=float("nan")))


# enqueue_workflow's arguments, the same options as insert_executions_v2 reads them, and the status written.
_SQL_OPTIONS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "plain": ({}, {}, "enqueued"),
    "delayed": ({"delay": "30.5 seconds"}, {"delay_seconds": 30.5}, "waiting"),
    "start_at ahead": ({"start_at": "2026-06-01 13:00:00+00"}, {"start_at": "2026-06-01 13:00:00+00"}, "waiting"),
    "start_at past": ({"start_at": "2026-06-01 11:00:00+00"}, {"start_at": "2026-06-01 11:00:00+00"}, "enqueued"),
    "timeout": ({"timeout_seconds": 12.5}, {"timeout_seconds": 12.5}, "enqueued"),
    "keys": ({"dedup_key": "d", "concurrency_key": "c"}, {"dedup_key": "d", "concurrency_key": "c"}, "enqueued"),
    "tags": ({"tags": '{"team": "billing"}'}, {"tags": {"team": "billing"}}, "enqueued"),
    "empty tags": ({"tags": "{}"}, {"tags": {}}, "enqueued"),
    "queue, priority, recoveries": ({"queue": "billing.eu:1", "priority": -3, "max_recoveries": 0},
                                    {"queue": "billing.eu:1", "priority": -3, "max_recoveries": 0}, "enqueued"),
}


def _sql_enqueue(db: psycopg.Connection[Any], id: str, arguments: dict[str, Any]) -> Any:
    given = {"workflow_name": "w", "input": '{"n": 1}', "queue": "q", "workflow_id": id, **arguments}
    named = sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in given)
    return db.execute(sql.SQL("SELECT enqueue_workflow({})").format(named), given).fetchone()


def _v2_insert(db: psycopg.Connection[Any], id: str, spec: dict[str, Any]) -> Any:
    row = {"id": id, "name": "w", "input": {"n": 1}, "queue": "q", **spec}
    return db.execute("SELECT id FROM insert_executions_v2(jsonb_build_array(%s::jsonb))",
                      (json.dumps(row),)).fetchone()


@pytest.mark.parametrize("options", _SQL_OPTIONS.values(), ids=_SQL_OPTIONS.keys())
def test_enqueue_workflow_writes_the_row_insert_executions_v2_writes(
        db: psycopg.Connection[Any], options: tuple[dict[str, Any], dict[str, Any], str]) -> None:
    """The SQL API's one INSERT (insert_execution_v1) against the insert path every other creation takes."""
    arguments, spec, status = options
    db.execute("SELECT set_config('pgdurable.fake_now', %s, false)", (_NOW,))
    assert _sql_enqueue(db, "sql", arguments) == ("sql",)
    assert _row(db, "sql")["status"] == status
    if "dedup_key" in arguments:  # one unfinished execution per key: take it back in between
        db.execute("UPDATE workflow_executions SET status = 'cancelled' WHERE id = 'sql'")
    assert _v2_insert(db, "function", spec) == ("function",)
    if "dedup_key" in arguments:
        db.execute("UPDATE workflow_executions SET status = 'cancelled' WHERE id = 'function'")
    assert _row(db, "sql") == _row(db, "function")


def test_enqueue_workflow_finds_a_taken_id_or_key(db: psycopg.Connection[Any]) -> None:
    """Not created: the same id of the same workflow returns it; a key held by an unfinished execution of the
    queue returns that execution; an id of another workflow is refused."""
    assert _sql_enqueue(db, "a", {"dedup_key": "k"}) == ("a",)
    assert _sql_enqueue(db, "a", {}) == ("a",)
    assert _sql_enqueue(db, "b", {"dedup_key": "k"}) == ("a",)
    with pytest.raises(psycopg.errors.UniqueViolation, match="already belongs to workflow"):
        db.execute("SELECT enqueue_workflow('other', '{}', 'q', 'a')")
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (1,)
