"""Citus (distributed PostgreSQL): what pgdurable must know of it (docs/scale-out.md).

On a database with the citus extension, migrate gives a schema the distributed layout (unless told not to:
``PGDURABLE_CITUS=off``, ``App(citus="off")``): the single-node migrations first, with Citus's object
propagation deferred, then the Citus layout's own scripts (sql/citus/), which distribute the tables an
execution owns on its bucket and replace the functions that touch them. Such a schema records its layout (the
function ``citus_buckets()``): its connections then run the Citus versions of the named queries
(sql/queries/citus/), and the producer claims one bucket at a time."""

from __future__ import annotations

import os
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from .errors import ConfigurationError
from .sqlfiles import citus_migrations, query

# The Citus layout's script NNNN is recorded in schema_migrations as VERSION_OFFSET + NNNN.
VERSION_OFFSET = 10000
MODES = ("auto", "on", "off")
DOC = "docs/scale-out.md"


def mode(explicit: str | None) -> str:
    """The Citus setting: the one given, else ``PGDURABLE_CITUS``, else auto."""
    value = (explicit or os.environ.get("PGDURABLE_CITUS") or "auto").strip().lower()
    if value not in MODES:
        raise ConfigurationError(f"the Citus setting must be one of {', '.join(MODES)}, not {value!r}")
    return value


def installed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(query("citus_installed")).fetchone()
    return bool(row and row[0])


def prepare_migration(conn: psycopg.Connection[Any]) -> bool:
    """Inside the migration's transaction: on a Citus database, keep what the migrations create on the
    coordinator until the layout distributes it. Returns whether the database has Citus (one lookup)."""
    if installed(conn):
        conn.execute(query("citus_defer_propagation"))
        return True
    return False


def layout_pending(conn: psycopg.Connection[Any], schema: str, setting: str, goal: int) -> bool:
    """Whether an up-to-date schema still lacks a Citus script it should have (a schema migrated before its
    database had Citus, or with the setting off)."""
    if setting == "off" or not installed(conn):
        return False
    wanted = [VERSION_OFFSET + version for version, _, _ in citus_migrations() if version <= goal]
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}.schema_migrations WHERE version = ANY (%s)").format(
        sql.Identifier(schema)), (wanted,)).fetchone()
    return bool(row and row[0] < len(wanted))


def layout_lookup(schema: str) -> tuple[LiteralString, dict[str, str]]:
    """The statement (and its parameters) that says whether the schema has the Citus layout."""
    return query("citus_layout"), {"function": f'"{schema}".citus_buckets()'}


def has_layout(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether the schema has the Citus layout (one catalog lookup)."""
    row = conn.execute(*layout_lookup(schema)).fetchone()
    return bool(row and row[0])


def buckets(conn: psycopg.Connection[Any], schema: str) -> tuple[int, ...] | None:
    """The buckets of a schema with the Citus layout, in shard order; None for a single-node schema."""
    if not has_layout(conn, schema):
        return None
    found = conn.execute(sql.SQL("SELECT {}.citus_buckets()").format(sql.Identifier(schema))).fetchone()
    return tuple(found[0]) if found else None


def refuse(what: str) -> ConfigurationError:
    """What the first release on Citus cannot do, said plainly."""
    return ConfigurationError(f"{what} is not supported on a Citus (distributed) schema yet: see \"Open "
                              f"questions\" in {DOC}")
