"""Co-location: transactional steps, enqueue inside the caller's transaction, the SQL API and its roles."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import pgdurable
from tests.harness import WAIT


@pytest.fixture
def bank(database_url: str) -> Iterator[str]:
    """An application schema of the same database, with accounts and a log of applied transfers."""
    name = f"bank_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE TABLE {}.accounts (id text PRIMARY KEY, balance bigint NOT NULL)").format(
            sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE TABLE {}.applied (transfer text, amount bigint)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("INSERT INTO {}.accounts VALUES ('alice', 1000), ('bob', 1000)").format(
            sql.Identifier(name)))
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def q(schema: str, text: str) -> sql.Composed:
    return sql.SQL(text).format(s=sql.Identifier(schema))


def balances(database_url: str, bank: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        return dict(conn.execute(q(bank, "SELECT id, balance FROM {s}.accounts")).fetchall())


def applied(database_url: str, bank: str) -> Counter[str]:
    with psycopg.connect(database_url) as conn:
        return Counter(row[0] for row in conn.execute(q(bank, "SELECT transfer FROM {s}.applied")).fetchall())


def register_transfer(app: pgdurable.App, bank: str, fail_once: set[str] | None = None) -> Any:
    @app.transaction()
    def move(conn: psycopg.Connection[Any], transfer: str, source: str, target: str, amount: int) -> int:
        conn.execute(q(bank, "UPDATE {s}.accounts SET balance = balance - %s WHERE id = %s"), (amount, source))
        conn.execute(q(bank, "UPDATE {s}.accounts SET balance = balance + %s WHERE id = %s"), (amount, target))
        conn.execute(q(bank, "INSERT INTO {s}.applied VALUES (%s, %s)"), (transfer, amount))
        if fail_once is not None and transfer in fail_once:
            fail_once.discard(transfer)
            raise ConnectionError("lost the network after the writes, before commit")
        row = conn.execute(q(bank, "SELECT balance FROM {s}.accounts WHERE id = %s"), (source,)).fetchone()
        assert row is not None
        return int(row[0])

    @app.workflow()
    def transfer(transfer_id: str, source: str, target: str, amount: int) -> int:
        return move(transfer_id, source, target, amount)

    return transfer


def test_transactional_step_commits_writes_and_checkpoint_together(
        app: pgdurable.App, bank: str, database_url: str, start_worker: Callable[..., Any]) -> None:
    transfer = register_transfer(app, bank)
    start_worker(app)
    assert app.enqueue(transfer, "t1", "alice", "bob", 100, workflow_id="t1").result(timeout=WAIT) == 900
    assert balances(database_url, bank) == {"alice": 900, "bob": 1100}
    step = app.steps("t1")[0]
    assert step.step_name == "move" and step.output == "900"
    # replay after a simulated crash: the recorded output comes back, the transfer is not applied again
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {}.workflow_executions SET status = 'enqueued' WHERE id = 't1'").format(
            sql.Identifier(app.schema)))
    assert app.handle("t1").result(timeout=WAIT) == 900
    assert balances(database_url, bank) == {"alice": 900, "bob": 1100}
    assert applied(database_url, bank) == {"t1": 1}


def test_a_step_failing_after_its_writes_leaves_no_trace(
        app: pgdurable.App, bank: str, database_url: str, start_worker: Callable[..., Any]) -> None:
    transfer = register_transfer(app, bank, fail_once={"t2"})
    start_worker(app)
    assert app.enqueue(transfer, "t2", "alice", "bob", 50, workflow_id="t2").result(timeout=WAIT) == 950
    assert balances(database_url, bank) == {"alice": 950, "bob": 1050}
    assert applied(database_url, bank) == {"t2": 1}  # the first attempt's writes were rolled back
    assert app.steps("t2")[0].attempts == 2


def test_a_failed_transactional_step_records_only_its_error(
        app: pgdurable.App, bank: str, database_url: str, start_worker: Callable[..., Any]) -> None:
    @app.transaction(max_attempts=2, interval=0.01)
    def overdraw(conn: psycopg.Connection[Any], amount: int) -> None:
        conn.execute(q(bank, "UPDATE {s}.accounts SET balance = balance - %s WHERE id = 'alice'"), (amount,))
        raise ValueError("insufficient funds")

    @app.workflow()
    def withdraw(amount: int) -> None:
        overdraw(amount)

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed, match="insufficient funds"):
        app.enqueue(withdraw, 5000, workflow_id="w1").result(timeout=WAIT)
    assert balances(database_url, bank)["alice"] == 1000
    step = app.steps("w1")[0]
    assert step.output is None and step.error is not None and step.attempts == 2


def test_serializable_conflicts_are_retried(app: pgdurable.App, bank: str, database_url: str,
                                           start_worker: Callable[..., Any]) -> None:
    @app.transaction(isolation="serializable")
    def add_interest(conn: psycopg.Connection[Any], account: str) -> int:
        level = conn.execute("SHOW transaction_isolation").fetchone()
        assert level == ("serializable",)
        row = conn.execute(q(bank, "SELECT sum(balance) FROM {s}.accounts")).fetchone()
        assert row is not None
        conn.execute(q(bank, "UPDATE {s}.accounts SET balance = balance + %s WHERE id = %s"),
                     (int(row[0]) // 100, account))
        return int(row[0])

    @app.workflow()
    def interest(account: str) -> int:
        return add_interest(account)

    start_worker(app, concurrency=8)
    handles = [app.enqueue(interest, account) for account in ["alice", "bob"] * 5]
    totals = sorted(h.result(timeout=WAIT) for h in handles)
    # serializable: every run saw the effect of all runs before it, as if they ran one at a time
    expected, total = [], 2000
    for _ in range(10):
        expected.append(total)
        total += total // 100
    assert totals == expected
    assert sum(balances(database_url, bank).values()) == total


def test_transactional_step_outside_a_workflow_is_a_plain_transaction(
        app: pgdurable.App, bank: str, database_url: str) -> None:
    @app.transaction()
    def deposit(conn: psycopg.Connection[Any], amount: int) -> int:
        conn.execute(q(bank, "UPDATE {s}.accounts SET balance = balance + %s WHERE id = 'bob'"), (amount,))
        return amount

    assert deposit(5) == 5
    assert balances(database_url, bank)["bob"] == 1005


def test_enqueue_in_the_callers_transaction(app: pgdurable.App, database_url: str,
                                            start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def fulfil(order_id: int) -> str:
        return f"fulfilled {order_id}"

    app.migrate()
    with psycopg.connect(database_url) as conn:
        app.enqueue(fulfil, 1, workflow_id="rolled-back", conn=conn)
        conn.rollback()
        handle = app.enqueue(fulfil, 2, workflow_id="committed", conn=conn)
        assert app.get("committed") is None  # not visible before the caller commits
        conn.commit()
    start_worker(app)
    assert handle.result(timeout=WAIT) == "fulfilled 2"
    assert app.get("rolled-back") is None


async def test_enqueue_async_in_the_callers_transaction(app: pgdurable.App, database_url: str,
                                                        start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    async def notify_customer(order_id: int) -> int:
        return order_id

    app.migrate()
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        handle = await app.enqueue_async(notify_customer, 7, conn=conn)
        await conn.commit()
    start_worker(app)
    assert await handle.result_async(timeout=WAIT) == 7


def test_sql_function_enqueues_validates_and_reports(app: pgdurable.App, database_url: str,
                                                     start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def ship(order_id: int, express: bool = False) -> str:
        return f"{order_id} {'express' if express else 'standard'}"

    app.migrate()
    fn = sql.Identifier(app.schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with conn.transaction():
            given = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('ship', '{{\"order_id\": 9}}', "
                                         "workflow_id => 'sql-1')").format(fn)).fetchone()
        assert given == ("sql-1",)
        again = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('ship', '{{\"order_id\": 9}}', "
                                     "workflow_id => 'sql-1')").format(fn)).fetchone()
        assert again == ("sql-1",)  # idempotent
        generated = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('ship', '{{\"order_id\": 3, \"express\": true}}', "
                                         "delay => interval '0 seconds')").format(fn)).fetchone()
        assert generated is not None and uuid.UUID(generated[0])
        for bad_call, message in [
            ("'ship', '[1, 2]'", "input must be a JSON object"),
            ("'ship', '{{}}', queue => 'no spaces allowed'", "not a valid queue name"),
            ("'', '{{}}'", "workflow_name must be"),
            ("'ship', '{{}}', start_at => now(), delay => interval '1 minute'", "start_at or delay"),
            ("'other', '{{}}', workflow_id => 'sql-1'", "already belongs to workflow ship"),
        ]:
            with pytest.raises(psycopg.Error, match=message):
                conn.execute(sql.SQL("SELECT {}.enqueue_workflow(" + bad_call + ")").format(fn))
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="limit is 8 MiB"):
            big = json.dumps({"blob": "x" * (9 * 1024 * 1024)})
            conn.execute(sql.SQL("SELECT {}.enqueue_workflow('ship', %s::jsonb)").format(fn), (big,))
        start_worker(app)
        assert app.handle("sql-1").result(timeout=WAIT) == "9 standard"
        assert app.handle(generated[0]).result(timeout=WAIT) == "3 express"
        status = conn.execute(sql.SQL("SELECT status, output FROM {}.workflow_status('sql-1')").format(fn)).fetchone()
        assert status == ("succeeded", "9 standard")
        assert conn.execute(sql.SQL("SELECT {}.cancel_workflow('sql-1')").format(fn)).fetchone() == (False,)
        waiting = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('ship', '{{\"order_id\": 1}}', "
                                       "delay => interval '1 hour')").format(fn)).fetchone()
        assert waiting is not None
        assert conn.execute(sql.SQL("SELECT {}.cancel_workflow(%s)").format(fn), waiting).fetchone() == (True,)


def test_psql_can_enqueue(app: pgdurable.App, database_url: str, start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def greet(name: str) -> str:
        return f"hello {name}"

    app.migrate()
    start_worker(app)
    statement = (f"BEGIN; SELECT {app.schema}.enqueue_workflow('greet', '{{\"name\": \"psql\"}}', "
                 "workflow_id => 'from-psql'); COMMIT;")
    done = subprocess.run(["psql", database_url, "-v", "ON_ERROR_STOP=1", "-qAtc", statement],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "from-psql"
    assert app.handle("from-psql").result(timeout=WAIT) == "hello psql"


async def test_a_second_driver_can_enqueue(app: pgdurable.App, database_url: str,
                                           start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def greet(name: str) -> str:
        return f"hello {name}"

    app.migrate()
    start_worker(app)
    dsn = database_url if "host=/" not in database_url else None
    if dsn is None:  # the embedded server listens on a socket directory given as ?host=
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(database_url)
        conn = await asyncpg.connect(host=params["host"], user=params.get("user", "postgres"),
                                     database=params.get("dbname", "postgres"))
    else:
        conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            new_id = await conn.fetchval(f"SELECT {app.schema}.enqueue_workflow($1, $2::jsonb)", "greet",
                                         json.dumps({"name": "asyncpg"}))
        rolled_back = conn.transaction()
        await rolled_back.start()
        await conn.fetchval(f"SELECT {app.schema}.enqueue_workflow($1, $2::jsonb, workflow_id => $3)",
                            "greet", json.dumps({"name": "never"}), "rolled-back")
        await rolled_back.rollback()
    finally:
        await conn.close()
    assert await app.handle(new_id).result_async(timeout=WAIT) == "hello asyncpg"
    assert app.get("rolled-back") is None


def test_application_role_cannot_touch_the_tables(app: pgdurable.App, database_url: str) -> None:
    app.migrate()
    app_role, worker_role = f"app_{uuid.uuid4().hex[:8]}", f"worker_{uuid.uuid4().hex[:8]}"
    schema = sql.Identifier(app.schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(app_role)))
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(worker_role)))
        try:
            conn.execute(sql.SQL("SELECT {}.grant_application_role(%s)").format(schema), (app_role,))
            conn.execute(sql.SQL("SELECT {}.grant_worker_role(%s)").format(schema), (worker_role,))
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(app_role)))
            new_id = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('x', '{{}}', workflow_id => 'by-app')").format(
                schema)).fetchone()
            assert new_id == ("by-app",)
            assert conn.execute(sql.SQL("SELECT status FROM {}.workflow_status('by-app')").format(
                schema)).fetchone() == ("enqueued",)
            for forbidden in ["UPDATE {}.workflow_executions SET status = 'succeeded'",
                              "DELETE FROM {}.workflow_executions",
                              "SELECT * FROM {}.workflow_executions",
                              "DELETE FROM {}.operation_outputs",
                              "INSERT INTO {}.workflow_executions (id, name) VALUES ('x', 'y')"]:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.SQL(forbidden).format(schema))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SELECT {}.checkpoint_step('by-app', 1, 0, 's', 'null', NULL, 1, now())").format(
                    schema))
            conn.execute("RESET ROLE")
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(worker_role)))
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}.workflow_executions").format(
                schema)).fetchone() == (1,)
            conn.execute(sql.SQL("UPDATE {}.workflow_executions SET priority = 1").format(schema))
            conn.execute("RESET ROLE")
        finally:
            conn.execute("RESET ROLE")
            for role in (app_role, worker_role):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_sqlalchemy_session_step_and_enqueue(app: pgdurable.App, bank: str, database_url: str,
                                             start_worker: Callable[..., Any]) -> None:
    @app.transaction()
    def pay(session: Session, amount: int) -> int:
        session.execute(text(f'UPDATE "{bank}".accounts SET balance = balance - :a WHERE id = :i'),
                        {"a": amount, "i": "alice"})
        balance = session.execute(text(f'SELECT balance FROM "{bank}".accounts WHERE id = :i'),
                                  {"i": "alice"}).scalar_one()
        return int(balance)

    @app.workflow()
    def checkout(amount: int) -> int:
        return pay(amount)

    app.migrate()
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(database_url))
    try:
        with Session(engine) as session:
            with session.begin():
                app.enqueue(checkout, 1, workflow_id="sa-rolled-back", conn=session)
                session.rollback()
            with session.begin():
                session.execute(text(f'INSERT INTO "{bank}".applied VALUES (:t, :a)'), {"t": "sa-1", "a": 30})
                handle = app.enqueue(checkout, 30, workflow_id="sa-1", conn=session)
    finally:
        engine.dispose()
    start_worker(app)
    assert handle.result(timeout=WAIT) == 970
    assert app.get("sa-rolled-back") is None
    assert applied(database_url, bank) == {"sa-1": 1}  # the business row and the workflow, together
    assert balances(database_url, bank)["alice"] == 970
    assert app.steps("sa-1")[0].step_name == "pay"


async def test_sqlalchemy_async_session_step(app: pgdurable.App, bank: str, database_url: str,
                                             start_worker: Callable[..., Any]) -> None:
    @app.transaction(isolation="repeatable read")
    async def refund(session: AsyncSession, amount: int) -> str:
        level = (await session.execute(text("SHOW transaction_isolation"))).scalar_one()
        await session.execute(text(f'UPDATE "{bank}".accounts SET balance = balance + :a WHERE id = :i'),
                              {"a": amount, "i": "bob"})
        return str(level)

    @app.workflow()
    async def refund_flow(amount: int) -> str:
        return await refund(amount)

    start_worker(app)
    assert await (await app.enqueue_async(refund_flow, 5)).result_async(timeout=WAIT) == "repeatable read"
    assert balances(database_url, bank)["bob"] == 1005
