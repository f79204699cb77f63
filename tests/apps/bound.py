"""A workflow bound to a table, for tests that SIGKILL real workers while bound executions run.

Served by ``python -m pgdurable worker tests.apps.bound:app``. The bound table is ``<BOUND_SCHEMA>.orders``
(made by ``create``); the workflow's effect is a transactional step that inserts one row into
``<BOUND_SCHEMA>.effects`` (no unique constraint: an effect applied twice shows up as two rows).

  BOUND_SCHEMA  the application schema
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from psycopg import sql

import pgdurable

app = pgdurable.App(lease_seconds=2.0, sweep_seconds=0.3, poll_seconds=0.3, app_version="bound-test")


def create(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE TABLE {}.orders (id integer PRIMARY KEY, status text NOT NULL, "
                         "amount integer NOT NULL)").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE TABLE {}.effects (order_id integer NOT NULL, execution_id text NOT NULL, "
                         "pid integer NOT NULL)").format(sql.Identifier(schema)))


def define(app: pgdurable.App) -> Any:
    @app.step()
    def think(id: int) -> int:
        time.sleep(0.2)  # a window for the kill to land mid-run
        return id

    @app.transaction()
    def record(conn: psycopg.Connection[Any], id: int) -> None:
        conn.execute(sql.SQL("INSERT INTO {}.effects VALUES (%s, %s, %s)").format(
            sql.Identifier(os.environ["BOUND_SCHEMA"])), (id, pgdurable.current_workflow_id(), os.getpid()))

    @app.workflow()
    def fulfil(id: int, amount: int) -> int:
        think(id)
        record(id)
        think(id)
        return amount

    return fulfil


fulfil = define(app)
