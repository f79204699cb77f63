"""Citus (distributed PostgreSQL): what pgdurable must know of it today.

A database with the citus extension is migrated like any other, with pgdurable's tables and functions kept on
the coordinator (nothing is distributed yet): it then works exactly as a single-node PostgreSQL does. The
distributed layout is the plan of docs/scale-out.md."""

from __future__ import annotations

from typing import Any

import psycopg

from .sqlfiles import query


def installed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(query("citus_installed")).fetchone()
    return bool(row and row[0])


def prepare_migration(conn: psycopg.Connection[Any]) -> None:
    """Inside the migration's transaction: on a Citus database, keep what the migrations create on the
    coordinator. Does nothing (sends nothing more than one lookup) anywhere else."""
    if installed(conn):
        conn.execute(query("citus_defer_propagation"))
