"""Workflows that wait (durable sleep, messages, children, events), for tests that SIGKILL real workers.

Served by ``python -m pgdurable worker tests.apps.waiting:app``. Every effect is a transactional step that
inserts one row into ``<WAITING_SCHEMA>.effects`` (no unique constraint: an effect applied twice shows up
as two rows), so a test can count that each ran exactly once whatever was killed.

  WAITING_SCHEMA  the application schema (made by ``create``)
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg import sql

import pgdurable

app = pgdurable.App(lease_seconds=2.0, sweep_seconds=0.3, poll_seconds=0.3, app_version="waiting-test")


def create(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE TABLE {}.effects (execution_id text NOT NULL, label text NOT NULL, "
                         "pid integer NOT NULL, started timestamptz NOT NULL DEFAULT clock_timestamp(), "
                         "finished timestamptz)").format(sql.Identifier(schema)))


def define(app: pgdurable.App) -> Any:
    @app.transaction()
    def effect(conn: psycopg.Connection[Any], label: str) -> str:
        schema = sql.Identifier(os.environ["WAITING_SCHEMA"])
        conn.execute(sql.SQL("INSERT INTO {}.effects VALUES (%s, %s, %s)").format(schema),
                     (pgdurable.current_workflow_id(), label, os.getpid()))
        return label

    @app.workflow()
    def napper(n: int) -> list[str]:
        out = [effect(f"before-{n}")]
        for i in range(3):
            pgdurable.sleep(0.5)
            out.append(effect(f"after-{n}-{i}"))
        return out

    @app.workflow()
    def listener(n: int) -> list[Any]:
        got = [pgdurable.recv("in"), pgdurable.recv("in")]
        effect(f"heard-{n}")
        pgdurable.set_event("heard", got)
        return got

    @app.workflow()
    def kid(n: int, i: int) -> int:
        effect(f"kid-{n}-{i}")
        pgdurable.sleep(0.7)
        return n * 10 + i

    @app.workflow()
    def family(n: int) -> list[int]:
        kids = [app.enqueue(kid, n, i) for i in range(3)]
        total = pgdurable.gather(kids)
        effect(f"family-{n}")
        return total

    # A queue where at most 2 run at once across all workers; each job holds its place for 0.3 s inside
    # its transaction, and its row records when it started and finished (rolled back if it is killed).
    app.queue("limited", concurrency=2)

    @app.transaction()
    def slow_effect(conn: psycopg.Connection[Any], label: str) -> str:
        schema = sql.Identifier(os.environ["WAITING_SCHEMA"])
        conn.execute(sql.SQL("INSERT INTO {}.effects VALUES (%s, %s, %s)").format(schema),
                     (pgdurable.current_workflow_id(), label, os.getpid()))
        conn.execute("SELECT pg_sleep(0.3)")
        conn.execute(sql.SQL("UPDATE {}.effects SET finished = clock_timestamp() WHERE label = %s").format(schema),
                     (label,))
        return label

    @app.workflow(queue="limited")
    def limited_job(n: int) -> str:
        return slow_effect(f"limited-{n}")

    return napper, listener, kid, family, limited_job


napper, listener, kid, family, limited_job = define(app)
