"""Vacuum on a long history (migration 22): every vacuum of workflow_executions also cleans its indexes.

PostgreSQL 14 and later skip a vacuum's index pass when under 2% of the table's pages hold dead rows, which on
a long history is almost every vacuum. A claimed execution's dead entry in the claim index lies ahead of all
the queued work, where no insert cleans it up, so every claim would step over such entries until a pass
finally removes them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgdurable

HISTORY = 100_000  # finished executions: some 2,000 pages, so a few dozen changed rows are under 2% of them


def churn(conn: psycopg.Connection[Any], prefix: str) -> None:
    """Fifty executions enqueued, claimed and completed, as a worker's statements would change them."""
    conn.execute("INSERT INTO workflow_executions (id, name, queue) "
                 "SELECT %s || g, 'job', 'jobs' FROM generate_series(1, 50) AS g", (prefix,))
    conn.execute("UPDATE workflow_executions SET status = 'running', owner_id = 'w', attempt = 1, "
                 "lease_expires = now() + interval '1 minute', started_at = now() WHERE id LIKE %s",
                 (prefix + "%",))
    conn.execute("UPDATE workflow_executions SET status = 'succeeded', output = '1', owner_id = NULL, "
                 "lease_expires = NULL, completed_at = now() WHERE id LIKE %s", (prefix + "%",))


def vacuum_report(conn: psycopg.Connection[Any]) -> str:
    """What VACUUM (VERBOSE) says about workflow_executions."""
    said: list[str] = []

    def hear(notice: psycopg.errors.Diagnostic) -> None:
        said.append(f"{notice.message_primary}\n{notice.message_detail}")

    conn.add_notice_handler(hear)
    try:
        conn.execute("VACUUM (VERBOSE) workflow_executions")
    finally:
        conn.remove_notice_handler(hear)
    return "\n".join(said)


@pytest.fixture
def own_db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A migrated schema in a database of this test's own. A vacuum removes only the dead rows that no open
    transaction of the same database may still see, and the other tests of the suite share the test database:
    one of their transactions, open at the wrong moment, would leave the churn's dead rows in place (and no
    index pass to run)."""
    name = f"vacuum_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(database_url, dbname=name)
    try:
        with pgdurable.App(url, schema="pgdurable") as app:
            app.migrate()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET search_path TO pgdurable")
            yield conn
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_every_vacuum_of_a_long_history_cleans_the_claim_index(own_db: psycopg.Connection[Any]) -> None:
    db = own_db
    db.execute("INSERT INTO workflow_executions (id, name, queue, status, output, completed_at) "
               "SELECT 'h-' || g, 'job', 'jobs', 'succeeded', '1', now() FROM generate_series(1, %s) AS g",
               (HISTORY,))
    db.execute("VACUUM workflow_executions")
    churn(db, "a-")
    report = vacuum_report(db)
    assert "index scans: 1" in report, report
    assert "bypassed" not in report, report
    claimed = db.execute("SELECT count(*) FROM workflow_executions WHERE status = 'enqueued'").fetchone()
    assert claimed == (0,)

    # The same churn without the setting: PostgreSQL's default skips the pass, which is what the setting
    # is there to prevent (so this test would see it gone).
    db.execute("ALTER TABLE workflow_executions RESET (vacuum_index_cleanup)")
    churn(db, "b-")
    report = vacuum_report(db)
    assert "index scan bypassed" in report, report
