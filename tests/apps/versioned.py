"""A workflow for the crash test of version adoption (tests/test_versions_processes.py): a worker process of
one version is SIGKILLed in the middle of it and a worker process of another version adopts it.

Served by ``python -m pgdurable worker tests.apps.versioned:app`` with ``PGDURABLE_APP_VERSION`` set (the same
code under two versions, as after a deploy of unrelated changes). Every effect is a transactional step that
inserts one row into ``<VERSIONED_SCHEMA>.effects`` with the version that ran it (a killed one rolls back).

  VERSIONED_SCHEMA  the application schema (made by ``create``)
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg import sql

import pgdurable

# Adopts 3 s after the last heartbeat of a version's last worker (heartbeats every lease / 3 = 0.67 s).
app = pgdurable.App(lease_seconds=2.0, sweep_seconds=0.3, poll_seconds=0.3, adopt_after_seconds=3.0)


def create(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE TABLE {}.effects (execution_id text NOT NULL, label text NOT NULL, "
                         "version text, started timestamptz NOT NULL DEFAULT clock_timestamp())")
                 .format(sql.Identifier(schema)))


def define(app: pgdurable.App) -> Any:
    @app.transaction()
    def effect(conn: psycopg.Connection[Any], label: str, hold: float = 0.0) -> str:
        conn.execute(sql.SQL("INSERT INTO {}.effects (execution_id, label, version) VALUES (%s, %s, %s)")
                     .format(sql.Identifier(os.environ["VERSIONED_SCHEMA"])),
                     (pgdurable.current_workflow_id(), label, os.environ.get("PGDURABLE_APP_VERSION")))
        if hold:
            conn.execute("SELECT pg_sleep(%s)", (hold,))  # long enough to be killed in
        return label

    @app.workflow()
    def pipeline(n: int) -> list[str]:
        return [effect(f"a-{n}"), effect(f"hold-{n}", hold=1.5), effect(f"b-{n}")]

    return pipeline


pipeline = define(app)
