"""Workflows for killing real workers in the middle of a debounced execution and of a stream.

Served by ``python -m pgdurable worker tests.apps.prims:app``. Effects are transactional steps that insert one
row into ``<PRIMS_SCHEMA>.effects`` (no unique constraint: an effect applied twice shows up twice).

  PRIMS_SCHEMA  the application schema (made by ``create``)
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from psycopg import sql

import pgdurable

app = pgdurable.App(lease_seconds=2.0, sweep_seconds=0.3, poll_seconds=0.3, app_version="prims-test")


def create(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE TABLE {}.effects (execution_id text NOT NULL, label text NOT NULL, "
                         "pid integer NOT NULL)").format(sql.Identifier(schema)))


def define(app: pgdurable.App) -> Any:
    @app.transaction()
    def effect(conn: psycopg.Connection[Any], label: str) -> str:
        conn.execute(sql.SQL("INSERT INTO {}.effects VALUES (%s, %s, %s)").format(
            sql.Identifier(os.environ["PRIMS_SCHEMA"])), (pgdurable.current_workflow_id(), label, os.getpid()))
        return label

    @app.step()
    def slowly(seconds: float) -> None:
        time.sleep(seconds)

    @app.workflow()
    def debounced(n: int) -> int:
        effect(f"start-{n}")
        slowly(1.5)  # the worker is killed here
        effect(f"end-{n}")
        return n

    @app.workflow()
    def streamer(count: int) -> int:
        for i in range(count):
            pgdurable.write_stream("out", i)
            slowly(0.1)
        pgdurable.close_stream("out")
        return count

    return debounced, streamer


debounced, streamer = define(app)
