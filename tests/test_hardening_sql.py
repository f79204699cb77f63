"""Hardening of the SQL side (issue 11): time limits that one bad row cannot break a queue with, upgrades that
repair bad rows and keep every role's grants, trigger functions immune to the caller's search_path, a worker
role that cannot rewrite the migration history, and schedule tick ids nobody else may take."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgdurable
from pgdurable.db import aconfigure
from pgdurable.migrations import latest_version, migrate
from pgdurable.sqlfiles import migrations
from pgdurable.worker.maintenance.scheduler import execution_id, fire_due
from tests.conftest import FAST
from tests.harness import execution, wait_for

TEN_YEARS = 315360000


@pytest.fixture
def owner(database_url: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of the schema's owner with the schema on its search_path (no migration)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


@pytest.fixture
def make_role(database_url: str, schema: str) -> Iterator[Callable[[str], str]]:
    """Create LOGIN roles (cluster-wide, so dropped again at the end, with their sessions and privileges)."""
    created: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        created.append(name)
        return name

    yield make
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in created:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def apps(make_role: Callable[[str], str]) -> Iterator[list[pgdurable.App]]:
    """Apps to close at the end (before the roles they log in as are dropped)."""
    opened: list[pgdurable.App] = []
    yield opened
    for app in opened:
        app.close()


def _as(database_url: str, role: str) -> psycopg.Connection[Any]:
    return psycopg.connect(make_conninfo(database_url, user=role), autocommit=True)


# -- 1, 2: time limits ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("arguments", "named"), [
    ("timeout_seconds => 'NaN'", "timeout_seconds"),
    ("timeout_seconds => 'Infinity'", "timeout_seconds"),
    ("timeout_seconds => '-Infinity'", "timeout_seconds"),
    ("timeout_seconds => 1e300", "timeout_seconds"),
    ("timeout_seconds => -1", "timeout_seconds"),
    ("timeout_seconds => 0", "timeout_seconds"),
    ("timeout_seconds => 315360000.5", "timeout_seconds"),
    ("start_at => 'infinity'", "start_at"),
    ("start_at => '-infinity'", "start_at"),
    ("start_at => '20000-01-01 00:00:00+00'", "start_at"),
    ("start_at => now() + interval '10 years 1 month'", "start_at"),
    ("start_at => now() - interval '10 years 1 month'", "start_at"),
    ("delay => make_interval(secs => 1e12)", "delay"),
    ("delay => make_interval(secs => 315360001)", "delay"),
    ("delay => interval '-1 second'", "delay"),
    ("workflow_id => 'sched:nightly:2026-01-01T00:00:00Z'", 'begins with "sched:"'),
])
def test_enqueue_workflow_refuses_non_finite_and_absurd_times(db: psycopg.Connection[Any], arguments: str,
                                                              named: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=named) as refused:
        db.execute(f"SELECT enqueue_workflow('job', '{{}}', {arguments})")  # type: ignore[arg-type]
    assert refused.value.sqlstate == "22023"
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (0,)


def test_enqueue_workflow_accepts_the_limits_themselves(db: psycopg.Connection[Any]) -> None:
    for arguments in ["timeout_seconds => 315360000", "timeout_seconds => 0.001",
                      "start_at => now() + interval '9 years'", "start_at => now() - interval '9 years'",
                      "delay => interval '10 years'", "delay => interval '0'"]:
        db.execute(f"SELECT enqueue_workflow('job', '{{}}', {arguments})")  # type: ignore[arg-type]
    assert db.execute("SELECT count(*) FROM workflow_executions").fetchone() == (6,)


@pytest.mark.parametrize("statement", [
    "INSERT INTO workflow_executions (id, name, timeout_seconds) VALUES ('x', 'job', 'NaN')",
    "INSERT INTO workflow_executions (id, name, timeout_seconds) VALUES ('x', 'job', 'Infinity')",
    "INSERT INTO workflow_executions (id, name, timeout_seconds) VALUES ('x', 'job', 1e300)",
    "INSERT INTO workflow_executions (id, name, timeout_seconds) VALUES ('x', 'job', 0)",
    "INSERT INTO workflow_executions (id, name, available_at) VALUES ('x', 'job', 'infinity')",
    "INSERT INTO workflow_executions (id, name, available_at) VALUES ('x', 'job', '-infinity')",
    "INSERT INTO workflow_executions (id, name, available_at) VALUES ('x', 'job', '20000-01-01 00:00:00+00')",
    "INSERT INTO workflow_executions (id, name, deadline) VALUES ('x', 'job', 'infinity')",
    "UPDATE workflow_executions SET timeout_seconds = 'NaN' WHERE id = 'good'",
    "UPDATE workflow_executions SET available_at = '-infinity' WHERE id = 'good'",
    "UPDATE workflow_executions SET deadline = '12000-01-01 00:00:00+00' WHERE id = 'good'",
    "INSERT INTO queues (name, rate_limit, rate_period_seconds) VALUES ('q', 1, 'NaN')",
    "INSERT INTO queues (name, rate_limit, rate_period_seconds) VALUES ('q', 1, 1e300)",
])
def test_the_table_refuses_rows_the_sql_api_would_refuse(db: psycopg.Connection[Any], statement: str) -> None:
    db.execute("INSERT INTO workflow_executions (id, name) VALUES ('good', 'job')")
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(statement)  # type: ignore[arg-type]


@pytest.mark.parametrize(("statement", "rule"), [
    ("INSERT INTO workflow_executions (id, name) VALUES ('', 'job')", "workflow_executions_id_check"),
    ("INSERT INTO workflow_executions (id, name, queue) VALUES ('x', 'job', 'no spaces')",
     "workflow_executions_queue_check"),
    ("INSERT INTO workflow_executions (id, name, status) VALUES ('x', 'job', 'paused')",
     "workflow_executions_status_check"),
    ("INSERT INTO workflow_executions (id, name, status) VALUES ('x', 'job', 'running')", "workflow_executions_check"),
    ("INSERT INTO workflow_executions (id, name, tags) VALUES ('x', 'job', '[1]')", "workflow_executions_tags_object"),
    ("UPDATE workflow_executions SET dedup_key = '' WHERE id = 'good'", "workflow_executions_dedup_key_check"),
    ("UPDATE workflow_executions SET debounce_deadline = 'infinity' WHERE id = 'good'",
     "workflow_executions_debounce_deadline_range"),
])
def test_a_broken_row_rule_is_named_in_the_error(db: psycopg.Connection[Any], statement: str, rule: str) -> None:
    """The rules live in one constraint (migration 25); the error still names the rule that broke."""
    db.execute("INSERT INTO workflow_executions (id, name) VALUES ('good', 'job')")
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        db.execute(statement)  # type: ignore[arg-type]
    assert raised.value.diag.constraint_name == rule
    assert raised.value.diag.table_name == "workflow_executions"
    assert f'violates check constraint "{rule}"' in str(raised.value)


_KEY = "k" * 200
_LOW, _HIGH = "0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"


@pytest.mark.parametrize(("column", "value", "rule"), [
    # At the limits: the fast path (migration 30) takes them, as the rules do.
    ("id", _KEY, None), ("id", "x", None), ("queue", "q" * 100, None), ("queue", "a.b:c-d_E9", None),
    ("queue", "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-", None), ("queue", "-", None),
    ("timeout_seconds", 315360000.0, None), ("timeout_seconds", 1e-9, None), ("available_at", _LOW, None),
    ("available_at", _HIGH, None), ("deadline", _HIGH, None), ("debounce_deadline", _LOW, None),
    ("concurrency_key", _KEY, None), ("dedup_key", "k", None), ("debounce_key", _KEY, None), ("tags", "{}", None),
    ("status", "cancelled", None),
    # Just past them: the rule-by-rule CASE names the rule.
    ("id", _KEY + "k", "workflow_executions_id_check"), ("queue", "q" * 101, "workflow_executions_queue_check"),
    ("queue", "", "workflow_executions_queue_check"), ("status", "paused", "workflow_executions_status_check"),
    # A queue name's characters (migration 32 tests them with ltrim, not a regular expression): one outside
    # the set anywhere, first or last, a line break after a valid name, a letter beyond ASCII, a % or _ as
    # LIKE would read them (the _ is allowed, the % not).
    ("queue", "a b", "workflow_executions_queue_check"), ("queue", " q", "workflow_executions_queue_check"),
    ("queue", "q/", "workflow_executions_queue_check"), ("queue", "q\n", "workflow_executions_queue_check"),
    ("queue", "é", "workflow_executions_queue_check"), ("queue", "q%", "workflow_executions_queue_check"),
    ("queue", "[q]", "workflow_executions_queue_check"), ("queue", "q" * 99 + "é", "workflow_executions_queue_check"),
    ("timeout_seconds", 315360000.001, "workflow_executions_timeout_seconds_range"),
    ("timeout_seconds", 0.0, "workflow_executions_timeout_seconds_range"),
    ("timeout_seconds", float("nan"), "workflow_executions_timeout_seconds_range"),
    ("available_at", "0001-01-01 23:59:59+00", "workflow_executions_available_at_range"),
    ("deadline", "9999-12-30 00:00:01+00", "workflow_executions_deadline_range"),
    ("debounce_deadline", "infinity", "workflow_executions_debounce_deadline_range"),
    ("concurrency_key", "", "workflow_executions_concurrency_key_check"),
    ("dedup_key", _KEY + "k", "workflow_executions_dedup_key_check"),
    ("debounce_key", "", "workflow_executions_debounce_key_check"),
    ("tags", "null", "workflow_executions_tags_object"), ("tags", "[]", "workflow_executions_tags_object"),
])
def test_the_row_rules_hold_at_their_limits(db: psycopg.Connection[Any], column: str, value: Any,
                                            rule: str | None) -> None:
    """check_execution_row's one-expression fast path takes exactly the rows its rule-by-rule CASE takes:
    each limit itself passes, and just past it the CASE names the broken rule."""
    row: dict[str, Any] = {"id": "x", "queue": "q", "status": "enqueued", "owner_id": None, "lease_expires": None,
                           "timeout_seconds": 30.0, "available_at": "2026-01-01 00:00:00+00", "deadline": None,
                           "concurrency_key": None, "dedup_key": None, "debounce_key": None,
                           "debounce_deadline": None, "tags": None, column: value}
    call = ("SELECT check_execution_row(%(id)s, %(queue)s, %(status)s, %(owner_id)s, %(lease_expires)s::timestamptz, "
            "%(timeout_seconds)s::float8, %(available_at)s::timestamptz, %(deadline)s::timestamptz, "
            "%(concurrency_key)s, %(dedup_key)s, %(debounce_key)s, %(debounce_deadline)s::timestamptz, "
            "%(tags)s::jsonb)")
    if rule is None:
        assert db.execute(call, row).fetchone() == (True,)
        return
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        db.execute(call, row)
    assert raised.value.diag.constraint_name == rule


def test_a_running_row_needs_its_owner_and_lease_and_only_it_has_them(db: psycopg.Connection[Any]) -> None:
    db.execute("INSERT INTO workflow_executions (id, name, status, owner_id, lease_expires) "
               "VALUES ('r', 'job', 'running', 'w', now() + interval '1 minute')")
    for statement in ["UPDATE workflow_executions SET lease_expires = NULL WHERE id = 'r'",
                      "UPDATE workflow_executions SET status = 'enqueued' WHERE id = 'r'"]:
        with pytest.raises(psycopg.errors.CheckViolation) as raised:
            db.execute(statement)  # type: ignore[arg-type]
        assert raised.value.diag.constraint_name == "workflow_executions_check"


def test_upgrading_fails_bad_rows_clearly_and_the_queue_keeps_running(
        database_url: str, schema: str, owner: psycopg.Connection[Any], make_app: Callable[..., pgdurable.App],
        start_worker: Callable[..., Any]) -> None:
    migrate(database_url, schema, target=5)
    enqueue = "SELECT enqueue_workflow('hardening_job', %s::jsonb, workflow_id => %s, {})"
    owner.execute(enqueue.format("priority => 0"), ('{"n": 1}', "good-before"))  # type: ignore[arg-type]
    bad = {  # what version 5's enqueue_workflow accepted
        "bad-nan": "timeout_seconds => 'NaN'",
        "bad-infinite-timeout": "timeout_seconds => 'Infinity'",
        "bad-huge-timeout": "timeout_seconds => 1e300",
        "bad-minus-infinity": "start_at => '-infinity'",
        "bad-infinity": "start_at => 'infinity'",
        "bad-year-20000": "start_at => '20000-01-01 00:00:00+00'",
        "bad-delay": "delay => make_interval(secs => 1e12)",
        "bad-running": "timeout_seconds => 'NaN'",
        "done-bad": "timeout_seconds => 'Infinity'",
    }
    for workflow_id, arguments in bad.items():
        owner.execute(enqueue.format(arguments), ('{"n": 2}', workflow_id))  # type: ignore[arg-type]
    owner.execute("UPDATE workflow_executions SET status = 'running', owner_id = 'ghost', attempt = 1, "
                  "lease_expires = now() + interval '1 hour' WHERE id = 'bad-running'")
    owner.execute("UPDATE workflow_executions SET status = 'succeeded', output = '4', completed_at = now() "
                  "WHERE id = 'done-bad'")
    owner.execute("UPDATE workflow_executions SET deadline = 'infinity' WHERE id = 'bad-year-20000'")

    assert migrate(database_url, schema) == [v for v, _, _ in migrations() if v > 5]

    rows = {row[0]: row[1:] for row in owner.execute(
        "SELECT id, status, error, timeout_seconds::text, available_at::text, deadline::text, owner_id "
        "FROM workflow_executions")}
    for workflow_id in bad.keys() - {"done-bad"}:
        status, error, timeout, available_at, _, owner_id = rows[workflow_id]
        assert status == "failed" and owner_id is None, workflow_id
        assert error["type"] == "pgdurable.InvalidParameters", workflow_id
        assert error["message"].startswith("refused by the upgrade to schema version 8: "), error
        if "timeout" in bad[workflow_id]:
            assert "timeout_seconds" in error["message"] and timeout is None, (workflow_id, error)
        else:
            assert "start time" in error["message"] and available_at is None, (workflow_id, error)
    assert "deadline infinity" in rows["bad-year-20000"][1]["message"]
    assert rows["done-bad"][:3] == ("succeeded", None, None)  # finished: only the bad value goes
    assert rows["good-before"][0] == "enqueued"

    app = make_app()

    @app.workflow(name="hardening_job")
    def job(n: int) -> int:
        return n * 2

    start_worker(app)
    assert app.handle("good-before").result(timeout=30) == 2
    assert app.enqueue(job, 5).result(timeout=30) == 10
    with pytest.raises(pgdurable.WorkflowFailed, match="timeout_seconds NaN"):
        app.handle("bad-nan").result(timeout=5)
    assert {w.id for w in app.list_workflows(limit=100)} >= set(bad)  # every row loads
    assert execution(app, "done-bad").status == "succeeded"


def test_one_row_cannot_make_a_claim_fail(database_url: str, schema: str, owner: psycopg.Connection[Any],
                                         make_app: Callable[..., pgdurable.App],
                                         start_worker: Callable[..., Any]) -> None:
    """Even with the table's constraints gone (a hand-edited schema), a timeout or rate period no interval can
    hold is clamped by the claims instead of stopping the queue."""
    app = make_app()

    @app.workflow(name="hardening_job")
    def job(n: int) -> int:
        return n * 2

    app.queue("limited", concurrency=2)
    app.queue("rated", rate_limit=100, rate_period=1.0)
    app.migrate()
    app.apply_queue_policies()
    owner.execute("ALTER TABLE workflow_executions DROP CONSTRAINT workflow_executions_row_rules")
    owner.execute("ALTER TABLE queues DROP CONSTRAINT queues_rate_period_seconds_range")
    owner.execute("UPDATE queues SET rate_period_seconds = 1e300 WHERE name = 'rated'")
    ids = []
    for queue in ("default", "limited", "rated"):
        ids.append(app.enqueue(job, 1, queue=queue).workflow_id)
        for n, timeout in enumerate(["1e300", "NaN", "Infinity"]):
            owner.execute("INSERT INTO workflow_executions (id, name, queue, input, timeout_seconds) "
                          "VALUES (%s, 'hardening_job', %s, %s::jsonb, %s::float8)",
                          (f"{queue}-{n}", queue, json.dumps({"n": n}), timeout))
            ids.append(f"{queue}-{n}")
        ids.append(app.enqueue(job, 3, queue=queue).workflow_id)
    start_worker(app, queues=["default", "limited", "rated"])
    for workflow_id in ids:
        app.handle(workflow_id).result(timeout=30)
    assert owner.execute("SELECT max(deadline) < now() + interval '10 years 1 day' FROM workflow_executions"
                         ).fetchone() == (True,)


def test_sleeping_until_the_end_of_time_stays_within_the_tables_limits(
        app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.workflow(name="hardening_forever")
    def forever() -> None:
        pgdurable.sleep_until(datetime.max.replace(tzinfo=UTC))

    start_worker(app)
    handle = app.enqueue(forever)
    wait_for(lambda: execution(app, handle.workflow_id).status == "waiting", 30, "the workflow to sleep")
    assert execution(app, handle.workflow_id).available_at == datetime(9999, 12, 30, tzinfo=UTC)
    assert [w.id for w in app.list_workflows(status="waiting")] == [handle.workflow_id]


# -- 9, 11: roles keep exactly their grants across upgrades ---------------------------------------------------

API = {"enqueue_workflow", "workflow_status", "cancel_workflow", "send_message", "workflow_event"}
GRANT_MANAGEMENT = {"grant_application_role", "grant_worker_role", "apply_application_grants",
                    "apply_worker_grants", "reapply_role_grants"}
TABLE_PRIVILEGES = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"]


def _privileges(conn: psycopg.Connection[Any], schema: str, role: str) -> dict[str, set[str]]:
    """Every privilege ``role`` holds on the schema and its objects (trigger functions aside: nobody can
    call those directly)."""
    held: dict[str, set[str]] = {"schema": {p for p in ("USAGE", "CREATE")
                                            if conn.execute("SELECT has_schema_privilege(%s, %s, %s)",
                                                            (role, schema, p)).fetchone() == (True,)}}
    for name, kind in conn.execute("SELECT relname, relkind FROM pg_class WHERE relnamespace = %s::regnamespace "
                                   "AND relkind IN ('r', 'v', 'S')", (schema,)).fetchall():
        qualified = f'"{schema}"."{name}"'
        if kind == "S":
            checks = [(p, "has_sequence_privilege") for p in ("USAGE", "SELECT", "UPDATE")]
        else:
            checks = [(p, "has_table_privilege") for p in TABLE_PRIVILEGES]
        held[name] = {p for p, fn in checks
                      if conn.execute(f"SELECT {fn}(%s, %s, %s)", (role, qualified, p)).fetchone() == (True,)}  # type: ignore[arg-type]
    for name, oid in conn.execute("SELECT p.proname, p.oid FROM pg_proc p WHERE p.pronamespace = %s::regnamespace "
                                  "AND p.prorettype <> 'trigger'::regtype", (schema,)).fetchall():
        if conn.execute("SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')", (role, oid)).fetchone() == (True,):
            held.setdefault(f"{name}()", set()).add("EXECUTE")
    return {name: privileges for name, privileges in held.items() if privileges}


def _expected_worker(conn: psycopg.Connection[Any], schema: str) -> dict[str, set[str]]:
    expected: dict[str, set[str]] = {"schema": {"USAGE"}}
    for name, kind in conn.execute("SELECT relname, relkind FROM pg_class WHERE relnamespace = %s::regnamespace "
                                   "AND relkind IN ('r', 'v', 'S')", (schema,)).fetchall():
        if kind == "S":
            expected[name] = {"USAGE", "SELECT"}
        elif name == "schema_migrations":
            expected[name] = {"SELECT"}
        elif name != "granted_roles":
            expected[name] = {"SELECT", "INSERT", "UPDATE", "DELETE"}
    for (name,) in conn.execute("SELECT proname FROM pg_proc WHERE pronamespace = %s::regnamespace "
                                "AND prorettype <> 'trigger'::regtype", (schema,)).fetchall():
        if name not in GRANT_MANAGEMENT:
            expected[f"{name}()"] = {"EXECUTE"}
    return expected


@pytest.mark.parametrize("version", [v for v, _, _ in migrations() if v >= 2])
def test_roles_granted_at_any_version_can_do_exactly_their_job_after_upgrading(
        version: int, database_url: str, schema: str, owner: psycopg.Connection[Any],
        make_role: Callable[[str], str], apps: list[pgdurable.App], start_worker: Callable[..., Any]) -> None:
    migrate(database_url, schema, target=version)
    app_role, worker_role = make_role("app"), make_role("worker")
    owner.execute("SELECT grant_application_role(%s)", (app_role,))
    owner.execute("SELECT grant_worker_role(%s)", (worker_role,))
    migrate(database_url, schema)
    assert owner.execute("SELECT max(version) FROM schema_migrations").fetchone() == (latest_version(),)

    # Exactly their privileges, as if granted on the latest version.
    assert _privileges(owner, schema, app_role) == {"schema": {"USAGE"}, **{f"{f}()": {"EXECUTE"} for f in API}}
    assert _privileges(owner, schema, worker_role) == _expected_worker(owner, schema)

    # The worker role runs real workflows: claims (plain and with a queue policy), steps, transactional steps,
    # messages, events, children, schedules, and its registry.
    worker_app = pgdurable.App(make_conninfo(database_url, user=worker_role), schema=schema, **FAST)
    apps.append(worker_app)
    worker_app.queue("limited", concurrency=2)

    @worker_app.step()
    def double(n: int) -> int:
        return n * 2

    @worker_app.transaction()
    def in_transaction(conn: psycopg.Connection[Any], n: int) -> int:
        return int(conn.execute("SELECT %s::int + 1", (n,)).fetchone()[0])  # type: ignore[index]

    @worker_app.workflow(name="hardening_child")
    def child(n: int) -> int:
        return n + 100

    @worker_app.workflow(name="hardening_job", queue="limited")
    def job(n: int) -> int:
        total = in_transaction(double(n))
        pgdurable.set_event("total", total)
        message = pgdurable.recv("go", timeout=30)
        return int(worker_app.enqueue(child, total + message["add"]).result(timeout=30))

    @worker_app.workflow(name="hardening_tick")
    def tick() -> str:
        return "ticked"

    # The application role: the five functions, and nothing else.
    with _as(database_url, app_role) as conn:
        api = sql.Identifier(schema)
        [(job_id,)] = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('hardening_job', '{{\"n\": 1}}', "
                                           "queue => 'limited')").format(api)).fetchall()
        [(doomed,)] = conn.execute(sql.SQL("SELECT {}.enqueue_workflow('hardening_job', '{{\"n\": 0}}', "
                                           "queue => 'nobody', workflow_id => 'doomed')").format(api)).fetchall()
        assert conn.execute(sql.SQL("SELECT {}.cancel_workflow(%s)").format(api), (doomed,)).fetchone() == (True,)
        assert conn.execute(sql.SQL("SELECT {}.send_message(%s, '{{\"add\": 10}}', 'go')").format(api),
                            (job_id,)).fetchone() == (True,)
        assert conn.execute(sql.SQL("SELECT status FROM {}.workflow_status(%s)").format(api),
                            (job_id,)).fetchone() == ("enqueued",)
        for forbidden in ["SELECT * FROM {}.workflow_executions", "DELETE FROM {}.workflow_messages",
                          "SELECT * FROM {}.schema_migrations", "SELECT * FROM {}.granted_roles",
                          "INSERT INTO {}.workflow_executions (id, name) VALUES ('x', 'y')",
                          "SELECT {}.claim_with_policy('limited', '{{x}}', 'me', 60, 1, 'v')",
                          "SELECT {}.set_queue_policy('limited', 100, NULL, NULL, NULL, NULL)",
                          "SELECT {}.checkpoint_step('x', 1, 0, 's', 'null', NULL, 1, now())",
                          "SELECT {}.reapply_role_grants()"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL(forbidden).format(api))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no escalating itself to a worker
            conn.execute(sql.SQL("SELECT {}.grant_worker_role(current_user)").format(api))

    start_worker(worker_app)
    worker_app.schedule("every-second", tick, "* * * * * *")
    assert worker_app.handle(job_id).result(timeout=30) == (1 * 2 + 1) + 10 + 100
    wait_for(lambda: [w for w in worker_app.list_workflows(name="hardening_tick", limit=5) if w.status == "succeeded"],
             30, "a scheduled tick to run as the worker role")
    worker_app.unschedule("every-second")
    with _as(database_url, app_role) as conn:
        assert conn.execute(sql.SQL("SELECT value FROM {}.workflow_event(%s, 'total')").format(sql.Identifier(schema)),
                            (job_id,)).fetchone() == (3,)

    # The worker role reads the migration history but cannot rewrite it, nor touch the grant records.
    with _as(database_url, worker_role) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (latest_version(),)
        for forbidden in ["INSERT INTO schema_migrations (version, name) VALUES (9999, 'x')",
                          "UPDATE schema_migrations SET version = 9999", "DELETE FROM schema_migrations",
                          "TRUNCATE schema_migrations", "SELECT * FROM granted_roles",
                          "INSERT INTO granted_roles (role_oid, kind) VALUES (1, 'worker')",
                          "SELECT grant_application_role(current_user)", "SELECT reapply_role_grants()"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(forbidden)  # type: ignore[arg-type]


def test_a_function_a_later_migration_recreates_is_granted_again(database_url: str, schema: str,
                                                                  owner: psycopg.Connection[Any],
                                                                  make_role: Callable[[str], str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What version 5 did to enqueue_workflow, by a future migration that knows nothing of roles: the runner
    re-applies the recorded grants after it."""
    migrate(database_url, schema)
    app_role, worker_role = make_role("app"), make_role("worker")
    owner.execute("SELECT grant_application_role(%s)", (app_role,))
    owner.execute("SELECT grant_worker_role(%s)", (worker_role,))
    future = """
        DROP FUNCTION workflow_status(text);
        CREATE FUNCTION workflow_status(workflow_id text)
        RETURNS TABLE (status text, output jsonb, error jsonb, attempt integer, created_at timestamptz,
                       completed_at timestamptz)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
        AS $$ SELECT e.status, e.output, e.error, e.attempt, e.created_at, e.completed_at
              FROM workflow_executions e WHERE e.id = workflow_id $$;
        REVOKE ALL ON FUNCTION workflow_status(text) FROM PUBLIC;
        CREATE TABLE future_things (id integer PRIMARY KEY);
    """
    known = migrations()
    monkeypatch.setattr("pgdurable.migrations.migrations", lambda: (*known, (known[-1][0] + 1, "future", future)))
    assert migrate(database_url, schema) == [known[-1][0] + 1]
    assert owner.execute("SELECT has_function_privilege(%s, 'workflow_status(text)', 'EXECUTE')",
                         (app_role,)).fetchone() == (True,)
    assert owner.execute("SELECT has_table_privilege(%s, 'future_things', 'SELECT, INSERT, UPDATE, DELETE')",
                         (worker_role,)).fetchone() == (True,)
    assert owner.execute("SELECT has_table_privilege(%s, 'future_things', 'SELECT')",
                         (app_role,)).fetchone() == (False,)


# -- 10: trigger functions ignore the caller's search_path -------------------------------------------------

def test_every_function_pins_its_search_path(db: psycopg.Connection[Any], schema: str) -> None:
    """Every function but clock_now(), which is inlined: its standard body's names were bound at creation."""
    unpinned = db.execute("SELECT proname, prosqlbody IS NOT NULL FROM pg_proc WHERE pronamespace = %s::regnamespace "
                          "AND NOT EXISTS (SELECT 1 FROM unnest(proconfig) c WHERE c LIKE 'search_path=%%')",
                          (schema,)).fetchall()
    assert unpinned == [("clock_now", True)]


def test_durable_time_ignores_the_callers_search_path(db: psycopg.Connection[Any], database_url: str,
                                                      schema: str) -> None:
    """clock_now() has no SET clause (so that it is inlined): a hostile search_path cannot redirect what it
    calls, on a test schema (test_clock_now) or not."""
    hostile = f"hostile_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(hostile)))
    try:
        db.execute(sql.SQL("CREATE FUNCTION {}.test_clock_now() RETURNS timestamptz LANGUAGE sql "
                           "AS $$ SELECT timestamptz '1999-01-01 00:00+00' $$").format(sql.Identifier(hostile)))
        with psycopg.connect(database_url, autocommit=True) as caller:
            caller.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(hostile), sql.Identifier(schema)))
            query = sql.SQL("SELECT {}.clock_now() - now() < interval '1 minute'").format(sql.Identifier(schema))
            assert caller.execute(query).fetchone() == (True,)
            db.execute("ALTER FUNCTION clock_now() SET pgdurable.test_clock = 'on'")
            db.execute("UPDATE test_clock SET ahead = interval '1 hour'")
            assert caller.execute(sql.SQL("SELECT {}.clock_now() - now() BETWEEN interval '59 minutes' "
                                          "AND interval '61 minutes'").format(sql.Identifier(schema))
                                  ).fetchone() == (True,)
    finally:
        db.execute("ALTER FUNCTION clock_now() RESET pgdurable.test_clock")
        db.execute("UPDATE test_clock SET ahead = interval '0'")
        db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(hostile)))


def test_triggers_use_pgdurable_objects_whatever_the_callers_search_path(
        db: psycopg.Connection[Any], database_url: str, schema: str) -> None:
    hostile = f"hostile_{uuid.uuid4().hex[:8]}"
    target = sql.Identifier(schema)
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(hostile)))
    # Workers sleep on the three queues (armed doorbells): their enqueues notify.
    db.execute(sql.SQL("INSERT INTO {}.worker_doorbells (queue, worker_id) VALUES ('q1', 'w'), ('q2', 'w'), "
                       "('default', 'w')").format(target))
    try:
        db.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(hostile)))
        # A shadowing table (the parent-wake-up UPDATE's target), shadowing doorbells (none armed) and a
        # shadowing pg_notify.
        db.execute("CREATE TABLE worker_doorbells (queue text, worker_id text, armed boolean)")
        db.execute("CREATE TABLE workflow_executions (id text, status text, wait_reason text, wakeups bigint, "
                   "available_at timestamptz)")
        db.execute("CREATE TABLE calls (channel text, payload text)")
        db.execute(sql.SQL("CREATE FUNCTION pg_notify(text, text) RETURNS void LANGUAGE sql "
                           "AS $$ INSERT INTO {}.calls VALUES ($1, $2) $$").format(sql.Identifier(hostile)))
        db.execute("INSERT INTO workflow_executions (id, status, wait_reason, wakeups) "
                   "VALUES ('parent', 'waiting', 'children', 0)")
        with psycopg.connect(database_url, autocommit=True) as listener:
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"{schema}_work")))
            db.execute(sql.SQL("SET search_path TO {}, pg_catalog, {}").format(sql.Identifier(hostile), target))
            # An enqueue, by hand and through the API; then a child finishing wakes its waiting parent.
            db.execute(sql.SQL("INSERT INTO {}.workflow_executions (id, name, queue) VALUES ('direct', 'x', 'q1')"
                               ).format(target))
            db.execute(sql.SQL("SELECT {}.enqueue_workflow('x', queue => 'q2')").format(target))
            db.execute(sql.SQL("INSERT INTO {}.workflow_executions (id, name, status, wait_reason, available_at) "
                               "VALUES ('parent', 'x', 'waiting', 'children', NULL)").format(target))
            db.execute(sql.SQL("INSERT INTO {}.workflow_executions (id, name, parent_id) "
                               "VALUES ('child', 'x', 'parent')").format(target))
            db.execute(sql.SQL("UPDATE {}.workflow_executions SET status = 'cancelled' WHERE id = 'child'"
                               ).format(target))
            # (The row inserted by hand wakes nobody: enqueues ring from the insert path, insert_executions_v2.)
            got = {n.payload for n in listener.notifies(timeout=2.0, stop_after=2)}
        assert got >= {"q2", "default"}
        assert db.execute(sql.SQL("SELECT count(*) FROM {}.calls").format(sql.Identifier(hostile))).fetchone() == (0,)
        assert db.execute(sql.SQL("SELECT status, wakeups FROM {}.workflow_executions WHERE id = 'parent'"
                                  ).format(target)).fetchone() == ("enqueued", 1)
        assert db.execute(sql.SQL("SELECT status, wakeups FROM {}.workflow_executions WHERE id = 'parent'"
                                  ).format(sql.Identifier(hostile))).fetchone() == ("waiting", 0)
    finally:
        db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(hostile)))


# -- 12: schedule tick ids ---------------------------------------------------------------------------------

async def test_a_squatted_tick_is_reported_and_a_refired_one_is_not(
        app: pgdurable.App, db: psycopg.Connection[Any], database_url: str, schema: str,
        caplog: pytest.LogCaptureFixture) -> None:
    app.schedule("nightly", "reports.nightly", "* * * * * *", queue="nobody", catch_up="all")
    [(start,)] = db.execute("SELECT date_trunc('second', now()) - interval '5 seconds'").fetchall()
    db.execute("UPDATE schedules SET next_fire_at = %s WHERE name = 'nightly'", (start,))
    other = execution_id("nightly", (start + timedelta(seconds=1)).astimezone(UTC))
    early = execution_id("nightly", (start + timedelta(seconds=2)).astimezone(UTC))
    # As an older version's enqueue_workflow let any application role do (this one refuses such ids):
    db.execute("INSERT INTO workflow_executions (id, name, queue) VALUES (%s, 'something.else', 'nobody')", (other,))
    db.execute("INSERT INTO workflow_executions (id, name, queue, created_at) "
               "VALUES (%s, 'reports.nightly', 'nobody', %s)", (early, start - timedelta(hours=1)))

    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        await aconfigure(conn, schema)
        with caplog.at_level(logging.WARNING, logger="pgdurable.schedules"):
            async with conn.transaction():
                fired = await fire_due(conn)
        assert {other, early} <= set(fired.fired) and not {other, early} & set(fired.enqueued)
        assert sorted(fired.squatted) == sorted([other, early])
        warned = [r.getMessage() for r in caplog.records if "did not fire" in r.getMessage()]
        assert len(warned) == 2 and all("schedule nightly: tick sched:nightly:" in w for w in warned), warned
        assert any("'something.else'" in w for w in warned)

        # The same ticks fired again (next_fire_at moved back by hand): those the firing itself enqueued are
        # taken, but not squatted; the squatted ones are reported again.
        db.execute("UPDATE schedules SET next_fire_at = %s WHERE name = 'nightly'", (start,))
        async with conn.transaction():
            again = await fire_due(conn)
        assert set(fired.enqueued) <= set(again.fired) and not set(fired.enqueued) & set(again.enqueued)
        assert sorted(again.squatted) == sorted([other, early])
    finally:
        await conn.close()


def test_an_application_role_cannot_take_a_ticks_id(db: psycopg.Connection[Any], database_url: str, schema: str,
                                                   make_role: Callable[[str], str]) -> None:
    app_role = make_role("app")
    db.execute("SELECT grant_application_role(%s)", (app_role,))
    with _as(database_url, app_role) as conn, pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"):
        conn.execute(sql.SQL("SELECT {}.enqueue_workflow('reports.nightly', workflow_id => "
                             "'sched:nightly:2030-01-01T00:00:00Z')").format(sql.Identifier(schema)))
    # Not a prefix elsewhere in the id, and ids merely resembling it are fine.
    db.execute("SELECT enqueue_workflow('x', workflow_id => 'my-sched:1')")
    db.execute("SELECT enqueue_workflow('x', workflow_id => 'schedule:1')")

