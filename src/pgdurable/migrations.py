"""Apply the numbered SQL migrations in order, once, safely from many processes at once."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from . import citus
from .errors import ConfigurationError
from .sqlfiles import citus_migrations, migrations, schema_sql

log = logging.getLogger("pgdurable")

# The key mixes in the schema name, so two schemas migrate independently.
_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('pgdurable migrate ' || %s, 0))"


def latest_version() -> int:
    return migrations()[-1][0]


def applied_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The schema's migration version, 0 when pgdurable was never installed there."""
    row = conn.execute(
        "SELECT to_regclass(format('%%I.schema_migrations', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not row or not row[0]:
        return 0
    # (The Citus layout's scripts are recorded from citus.VERSION_OFFSET on: not single-node versions.)
    version = conn.execute(
        sql.SQL("SELECT coalesce(max(version) FILTER (WHERE version < {}), 0) FROM {}.schema_migrations").format(
            sql.Literal(citus.VERSION_OFFSET), sql.Identifier(schema))
    ).fetchone()
    return int(version[0]) if version else 0


def migrate(conninfo: str, schema: str, *, target: int | None = None, citus_mode: str | None = None,
            replay: bool = False) -> list[int]:
    """Bring ``schema`` up to date (or up to version ``target``, for tests of upgrades); returns the versions
    this call applied (empty if none were needed).

    After applying migrations, the grants of the roles recorded by ``grant_application_role`` and
    ``grant_worker_role`` are applied again (version 8 on), so tables and functions that a migration
    created or recreated are granted to the roles that existed before it.

    On a database with the citus extension, ``citus_mode`` (``auto``, the default, or ``on``; None:
    ``PGDURABLE_CITUS``) also gives the schema the distributed layout: after each single-node migration its
    Citus script of the same number, if any (recorded as ``citus.VERSION_OFFSET`` + its number). ``off``
    keeps a new schema on the coordinator, undistributed; a schema that has the layout keeps it whatever the
    mode (docs/scale-out.md).

    A new single-node schema is created by ``sql/schema.sql`` alone, with every migration recorded: the same
    catalogs as the migrations in order (tests/test_schema_sql.py compares them) for less than half of the
    server's work. ``replay`` (or a ``target``, or the Citus layout) runs the migrations one by one instead."""
    if target is not None and target not in {version for version, _, _ in migrations()}:
        raise ValueError(f"no migration has version {target}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return migrate_on(conn, schema, target=target, citus_mode=citus_mode, replay=replay)


def migrate_and_layout(conninfo: str, schema: str, *, apply: bool = True,
                       citus_mode: str | None = None) -> tuple[list[int], tuple[int, ...] | None]:
    """What a ``Database`` does on first use, on one connection: migrate (unless ``apply`` is false), then
    read the schema's layout (its Citus buckets, None for a single-node schema)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        applied = migrate_on(conn, schema, citus_mode=citus_mode) if apply else []
        return applied, citus.buckets(conn, schema)


def migrate_on(conn: psycopg.Connection[Any], schema: str, *, target: int | None = None,
               citus_mode: str | None = None, replay: bool = False) -> list[int]:
    """``migrate`` on an open autocommit connection."""
    mode = citus.mode(citus_mode)
    goal = latest_version() if target is None else target
    found = applied_version(conn, schema)
    if found > latest_version():
        raise ConfigurationError(
            f"schema {schema!r} is at version {found}, but this pgdurable knows versions up to "
            f"{latest_version()}: a newer pgdurable migrated it. Upgrade pgdurable here; running older code "
            "against a newer schema is refused")
    if found >= goal and not citus.layout_pending(conn, schema, mode, goal):
        return []
    applied: list[int] = []
    with conn.transaction():
        # Whoever holds the lock migrates; the others wait, then find nothing left to do.
        conn.execute(_LOCK_SQL, (schema,))
        on_citus = citus.prepare_migration(conn)
        if mode == "on" and not on_citus:
            raise ConfigurationError("PGDURABLE_CITUS=on (or App(citus='on')), but the database has no citus "
                                     "extension: it is not a Citus coordinator")
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        # Functions created with SET search_path FROM CURRENT pin this: our schema, then pg_temp last.
        conn.execute(sql.SQL("SET LOCAL search_path TO {}, pg_temp").format(sql.Identifier(schema)))
        # Asked again under the lock: another process may have created the schema meanwhile.
        fresh = applied_version(conn, schema) == 0
        # On a coordinator a new schema gets the distributed layout (the migrations replayed, each followed by
        # its layout script) unless citus="off"; a schema that has the layout keeps it, whatever the mode.
        layout_for_new = on_citus and mode != "off"
        if fresh and target is None and not replay and not layout_for_new:
            conn.execute(schema_sql())
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                                [(version, name) for version, name, _ in migrations()])
            applied = [version for version, _, _ in migrations()]
            conn.execute("SELECT reapply_role_grants()")
            log.info("schema %s created at version %d (sql/schema.sql)", schema, applied[-1])
            return applied
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        distribute = layout_for_new or (on_citus and any(v >= citus.VERSION_OFFSET for v in done))
        layout = {version: (name, text) for version, name, text in citus_migrations()} if distribute else {}
        for version, name, text in migrations():
            if version > goal:
                continue
            if version not in done:
                conn.execute(text)
                conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied.append(version)
                log.debug("applied migration %04d_%s to schema %s", version, name, schema)
            recorded = citus.VERSION_OFFSET + version
            if version in layout and recorded not in done:
                conn.execute(layout[version][1])
                conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                             (recorded, "citus_" + layout[version][0]))
                applied.append(recorded)
                log.debug("applied the Citus layout's %04d_%s to schema %s", version, layout[version][0], schema)
        if applied:
            row = conn.execute("SELECT to_regprocedure('reapply_role_grants()') IS NOT NULL").fetchone()
            if row and row[0]:
                conn.execute("SELECT reapply_role_grants()")
    if applied:  # one line, however many migrations a fresh database needed
        log.info("schema %s migrated to version %d", schema, applied[-1])
    return applied
