"""Table-bound workflows against a real PostgreSQL: which changes enqueue, exactly once per change, inside the
writing transaction; the writing role needs no rights on the engine; listing, removal, the CLI, refusals."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from tests.harness import WAIT


@pytest.fixture
def shop(database_url: str, app: pgdurable.App) -> Iterator[str]:
    """An application schema with an orders table (primary key id) and a keyless table; yields its name."""
    app.migrate()
    name = f"shop_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE TABLE {}.orders (id integer PRIMARY KEY, status text NOT NULL, "
                             "amount numeric NOT NULL, placed_at timestamptz NOT NULL DEFAULT now(), "
                             "note text)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE TABLE {}.events (payload text)").format(sql.Identifier(name)))
        try:
            yield name
        finally:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def writer(database_url: str, shop: str) -> Iterator[psycopg.Connection[Any]]:
    """The application's own connection (autocommit; no pgdurable schema on its search_path)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(shop)))
        yield conn


def _bound(db: psycopg.Connection[Any], binding: str) -> list[tuple[str, dict[str, Any]]]:
    """(id, input) of the executions a binding created, in creation order."""
    rows = db.execute("SELECT id, input FROM workflow_executions WHERE id LIKE %s ORDER BY seq",
                      (f"bind:{binding}:%",)).fetchall()
    return [(i, value if isinstance(value, dict) else json.loads(value)) for i, value in rows]


def test_matching_inserts_updates_and_deletes_each_enqueue_one_execution(
        app: pgdurable.App, db: psycopg.Connection[Any], shop: str, writer: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def on_order(id: int, status: str) -> None: ...

    # A WHEN clause may not read NEW in a delete trigger, nor OLD in an insert trigger: two bindings.
    app.bind_table(f"{shop}.orders", on_order, on=("insert", "update"), name="orders",
                   when="NEW.status = 'paid'")
    app.bind_table(f"{shop}.orders", on_order, on="delete", name="orders-gone", when="OLD.status <> 'void'")
    writer.execute("INSERT INTO orders (id, status, amount) VALUES (1, 'new', 10), (2, 'paid', 20)")
    writer.execute("UPDATE orders SET status = 'paid' WHERE id = 1")       # matches
    writer.execute("UPDATE orders SET note = 'x' WHERE id = 2")            # matches (still paid)
    writer.execute("INSERT INTO orders (id, status, amount) VALUES (3, 'void', 1)")
    writer.execute("DELETE FROM orders WHERE id = 3")                      # OLD is void: no
    writer.execute("DELETE FROM orders WHERE id = 1")                      # matches
    got = _bound(db, "orders") + _bound(db, "orders-gone")
    assert [(i.split(":")[1], i.split(":")[2], i.split(":")[3], args) for i, args in got] == [
        ("orders", "[2]", "i", {"id": 2, "status": "paid"}),
        ("orders", "[1]", "u", {"id": 1, "status": "paid"}),
        ("orders", "[2]", "u", {"id": 2, "status": "paid"}),
        ("orders-gone", "[1]", "d", {"id": 1, "status": "paid"}),
    ]
    assert {e.name for e in app.list_workflows()} == {"on_order"}


def test_a_rolled_back_transaction_or_savepoint_enqueues_nothing(
        app: pgdurable.App, db: psycopg.Connection[Any], shop: str, writer: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def on_order(id: int) -> None: ...

    app.bind_table(f"{shop}.orders", on_order, name="orders")

    class Abort(Exception):
        pass

    with pytest.raises(Abort), writer.transaction():
        writer.execute("INSERT INTO orders (id, status, amount) VALUES (1, 'new', 10)")
        raise Abort
    with writer.transaction():
        writer.execute("INSERT INTO orders (id, status, amount) VALUES (2, 'new', 10)")
        with pytest.raises(Abort), writer.transaction():  # a savepoint
            writer.execute("INSERT INTO orders (id, status, amount) VALUES (3, 'new', 10)")
            raise Abort
    assert [args for _, args in _bound(db, "orders")] == [{"id": 2}]


def test_one_execution_per_change_even_when_the_trigger_fires_again_for_it(
        app: pgdurable.App, db: psycopg.Connection[Any], shop: str, writer: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def on_paid(id: int, amount: Decimal, old: dict[str, Any] | None) -> None: ...

    app.bind_table(f"{shop}.orders", on_paid, on="update", when="NEW.status = 'paid'", name="paid")
    writer.execute("INSERT INTO orders (id, status, amount) VALUES (1, 'new', 10)")
    with writer.transaction():
        writer.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
        # The same change fires the trigger again (same row, operation and transaction): still one
        # execution, carrying the row's latest version and the row as it was before the transaction.
        writer.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
        writer.execute("UPDATE orders SET amount = 12.5 WHERE id = 1")
    got = _bound(db, "paid")
    assert len(got) == 1
    assert got[0][1]["amount"] == 12.5 and got[0][1]["id"] == 1
    assert got[0][1]["old"]["status"] == "new" and got[0][1]["old"]["amount"] == 10
    # A later transaction's change of the same row is a new change.
    writer.execute("UPDATE orders SET amount = 13 WHERE id = 1")
    assert len(_bound(db, "paid")) == 2
    # Replaying the trigger by hand with an identical change id inserts nothing new.
    first_id = _bound(db, "paid")[0][0]
    created = db.execute("SELECT count(*) FROM insert_executions_v1(jsonb_build_array(jsonb_build_object("
                         "'id', %s::text, 'name', 'on_paid')))", (first_id,)).fetchone()
    assert created == (0,) and len(_bound(db, "paid")) == 2


def test_the_workflow_runs_with_the_row_decoded_by_its_annotations(
        app: pgdurable.App, db: psycopg.Connection[Any], shop: str, writer: psycopg.Connection[Any],
        start_worker: Callable[..., Any]) -> None:
    seen: list[tuple[Any, ...]] = []

    @app.workflow()
    def fulfil(id: int, amount: Decimal, placed_at: datetime, note: str | None = None) -> str:
        seen.append((id, amount, placed_at, note))
        return f"fulfilled {id}"

    app.bind_table(f"{shop}.orders", fulfil, on=["insert", "update"], when="NEW.status = 'paid'")
    assert [b.name for b in app.bindings()] == ["orders:fulfil"]
    start_worker(app)
    writer.execute("INSERT INTO orders (id, status, amount, placed_at) VALUES (7, 'paid', 12.25, "
                   "'2026-01-02 03:04:05+00')")
    (execution_id, _), = _bound(db, "orders:fulfil")
    assert app.handle(execution_id).result(timeout=WAIT) == "fulfilled 7"
    assert seen[0][:2] == (7, Decimal("12.25")) and seen[0][2].year == 2026 and seen[0][3] is None


def test_a_commit_wakes_the_workers(app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, shop: str,
                                    writer: psycopg.Connection[Any]) -> None:
    @app.workflow(queue="orders-q")
    def on_order(id: int) -> None: ...

    app.bind_table(f"{shop}.orders", on_order)
    db.execute("INSERT INTO worker_doorbells (queue, worker_id) VALUES ('orders-q', 'sleeper')")  # a worker sleeps
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"{app.schema}_work")))
        with writer.transaction():
            writer.execute("INSERT INTO orders (id, status, amount) VALUES (1, 'new', 10)")
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # not before the commit
        got = [n.payload for n in listener.notifies(timeout=WAIT, stop_after=1)]
    assert got == ["orders-q"]


def test_an_application_role_with_no_engine_grants_writes_a_bound_table(
        app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, shop: str) -> None:
    @app.workflow()
    def on_order(id: int) -> None: ...

    app.bind_table(f"{shop}.orders", on_order, name="orders")
    role = f"shopapp_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        db.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(shop), sql.Identifier(role)))
        db.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON {}.orders TO {}").format(sql.Identifier(shop),
                                                                                  sql.Identifier(role)))
        with psycopg.connect(make_conninfo(database_url, user=role), autocommit=True) as conn:
            conn.execute(sql.SQL("INSERT INTO {}.orders (id, status, amount) VALUES (1, 'new', 1)").format(
                sql.Identifier(shop)))
            # No rights on the engine: it can neither read its tables nor attach the trigger function itself.
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SELECT count(*) FROM {}.workflow_executions").format(
                    sql.Identifier(app.schema)))
            conn.execute(sql.SQL("CREATE TEMP TABLE mine (id int PRIMARY KEY)"))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("CREATE TRIGGER t AFTER INSERT ON mine FOR EACH ROW EXECUTE FUNCTION "
                                     "{}.table_binding_fire('{{}}')").format(sql.Identifier(app.schema)))
        assert [args for _, args in _bound(db, "orders")] == [{"id": 1}]
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_sql_api_binds_lists_and_unbinds(app: pgdurable.App, db: psycopg.Connection[Any], shop: str,
                                             writer: psycopg.Connection[Any]) -> None:
    bound = db.execute("SELECT bind_table(%s::regclass, 'audit', operations => '{update}', "
                       "columns => '{id,status}', pass_old => true, queue => 'audits', priority => 3)",
                       (f"{shop}.orders",)).fetchone()
    assert bound == ("orders:audit",)
    listed = db.execute("SELECT name, workflow_name, operations, key_columns, installed_on "
                        "FROM list_table_bindings()").fetchall()
    assert listed == [("orders:audit", "audit", ["update"], ["id"], f"{shop}.orders")]
    writer.execute("INSERT INTO orders (id, status, amount) VALUES (1, 'new', 10)")
    writer.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
    row = db.execute("SELECT name, queue, priority, input FROM workflow_executions").fetchone()
    assert row is not None and row[:3] == ("audit", "audits", 3)
    assert row[3]["status"] == "paid" and row[3]["old"]["status"] == "new" and set(row[3]) == {"id", "status", "old"}
    assert db.execute("SELECT unbind_table('orders:audit')").fetchone() == (True,)
    assert db.execute("SELECT unbind_table('orders:audit')").fetchone() == (False,)
    writer.execute("UPDATE orders SET status = 'new' WHERE id = 1")
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (1,)


def test_removal_stops_enqueues_and_rebinding_replaces(app: pgdurable.App, db: psycopg.Connection[Any], shop: str,
                                                      writer: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def on_order(id: int) -> None: ...

    first = app.bind_table(f"{shop}.orders", on_order, name="orders")
    again = app.bind_table(f"{shop}.orders", on_order, name="orders", on="update")  # replaces: one trigger
    assert (first.operations, again.operations) == (["insert"], ["update"])
    assert db.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
                      (f"{shop}.orders",)).fetchone() == (1,)
    writer.execute("INSERT INTO orders (id, status, amount) VALUES (1, 'new', 10)")
    writer.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
    assert len(_bound(db, "orders")) == 1
    assert app.unbind_table("orders") is True
    assert app.unbind_table("orders") is False
    assert app.bindings() == []
    writer.execute("UPDATE orders SET status = 'new' WHERE id = 1")
    writer.execute("INSERT INTO orders (id, status, amount) VALUES (2, 'new', 10)")
    assert len(_bound(db, "orders")) == 1


def test_a_dropped_table_leaves_a_binding_listed_as_missing_until_restored(
        app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, schema: str, shop: str) -> None:
    create = sql.SQL("CREATE TABLE {}.tmp (id int PRIMARY KEY, v text)").format(sql.Identifier(shop))
    db.execute(create)
    app.bind_table(f"{shop}.tmp", "anything", name="tmp", on=["insert", "update"], when="NEW.v = 'go'")
    db.execute(sql.SQL("DROP TABLE {}.tmp").format(sql.Identifier(shop)))
    (binding,) = app.bindings()
    assert (binding.name, binding.relation, binding.installed_on) == ("tmp", f"{shop}.tmp", None)
    assert app.restore_bindings() == []  # the table is not there: nothing to restore
    db.execute(create)
    restored = CliRunner().invoke(cli, ["bindings", "restore", "--json", "--database-url", database_url,
                                        "--schema", schema])
    assert restored.exit_code == 0, restored.output
    assert json.loads(restored.output) == {"restored": ["tmp"]}
    assert app.restore_bindings() == []  # installed again: nothing left to restore
    (binding,) = app.bindings()
    assert (binding.installed_on, binding.when_condition, binding.operations) == (
        f"{shop}.tmp", "NEW.v = 'go'", ["insert", "update"])
    db.execute(sql.SQL("INSERT INTO {}.tmp VALUES (1, 'go'), (2, 'no')").format(sql.Identifier(shop)))
    assert [args for _, args in _bound(db, "tmp")] == [{"id": 1, "v": "go"}]
    assert app.unbind_table("tmp") is True and app.bindings() == []


def test_the_cli_lists_and_removes_bindings(app: pgdurable.App, database_url: str, schema: str, shop: str) -> None:
    app.bind_table(f"{shop}.orders", "fulfil", on=["insert", "update"], when="NEW.status = 'paid'", name="paid")
    options = ["--database-url", database_url, "--schema", schema]
    listed = CliRunner().invoke(cli, ["bindings", "list", "--json", *options])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.output)
    assert (row["name"], row["workflow_name"], row["operations"], row["installed_on"]) == (
        "paid", "fulfil", ["insert", "update"], f"{shop}.orders")
    table = CliRunner().invoke(cli, ["bindings", "list", *options])
    assert table.exit_code == 0 and "paid" in table.output and "fulfil" in table.output
    removed = CliRunner().invoke(cli, ["bindings", "remove", "paid", *options])
    assert removed.exit_code == 0 and "removed" in removed.output
    again = CliRunner().invoke(cli, ["bindings", "remove", "paid", *options])
    assert again.exit_code == 1 and "no binding named paid" in again.output


@pytest.mark.parametrize(("table", "options", "message"), [
    ("events", {}, "has no primary key"),
    ("orders", {"on": "truncate"}, "one or more of insert, update, delete"),
    ("orders", {"when": "NEW.status = 'paid'; DROP TABLE orders"}, 'without ";"'),
    ("orders", {"when": "NEW.nope = 1"}, "nope"),
    ("orders", {"when": "NEW.amount"}, "boolean"),
    ("orders", {"on": "insert", "when": "OLD.status = 'x'"}, "OLD"),
    ("orders", {"when": "true) EXECUTE FUNCTION now() --"}, "syntax error"),
    ("orders", {"name": "no spaces"}, "binding name"),
    ("orders", {"queue": "bad queue"}, "queue"),
    ("missing", {}, "does not exist"),
    ("ENGINE.workflow_executions", {}, "pgdurable's own tables"),
])
def test_bad_bindings_are_refused_clearly_and_change_nothing(app: pgdurable.App, db: psycopg.Connection[Any],
                                                             shop: str, table: str, options: dict[str, Any],
                                                             message: str) -> None:
    target = table.replace("ENGINE", app.schema) if table.startswith("ENGINE.") else f"{shop}.{table}"
    with pytest.raises(ValueError, match=message):
        app.bind_table(target, "anything", **options)
    assert app.bindings() == []
    assert db.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgdurable:%'").fetchone() == (0,)


def test_a_signature_no_row_can_fill_is_refused_at_bind_time(app: pgdurable.App, shop: str) -> None:
    @app.workflow()
    def ship(id: int, address: str) -> None: ...

    with pytest.raises(TypeError, match=r"requires \['address'\]"):
        app.bind_table(f"{shop}.orders", ship)
    assert app.bindings() == []


def test_a_binding_name_cannot_move_to_another_table(app: pgdurable.App, db: psycopg.Connection[Any],
                                                     shop: str) -> None:
    db.execute(sql.SQL("CREATE TABLE {}.other (id int PRIMARY KEY)").format(sql.Identifier(shop)))
    app.bind_table(f"{shop}.orders", "anything", name="n")
    with pytest.raises(ValueError, match="already binds table"):
        app.bind_table(f"{shop}.other", "anything", name="n")
    assert [b.installed_on for b in app.bindings()] == [f"{shop}.orders"]


def test_long_keys_give_ids_within_the_limit(app: pgdurable.App, db: psycopg.Connection[Any], shop: str,
                                              writer: psycopg.Connection[Any]) -> None:
    db.execute(sql.SQL("CREATE TABLE {}.docs (path text PRIMARY KEY, body text)").format(sql.Identifier(shop)))
    app.bind_table(f"{shop}.docs", "index_doc", name="docs")
    writer.execute("INSERT INTO docs VALUES (%s, 'a'), (%s, 'b')", ("x" * 500, "x" * 499 + "y"))
    ids = [i for i, _ in _bound(db, "docs")]
    assert len(ids) == 2 and len(set(ids)) == 2 and all(len(i) <= 200 and ":md5=" in i for i in ids)
