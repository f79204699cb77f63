"""Apply the numbered SQL migrations in order, once, safely from many processes at once."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from . import citus
from .errors import ConfigurationError
from .sqlfiles import migrations

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
    version = conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_migrations").format(sql.Identifier(schema))
    ).fetchone()
    return int(version[0]) if version else 0


def migrate(conninfo: str, schema: str, *, target: int | None = None) -> list[int]:
    """Bring ``schema`` up to date (or up to version ``target``, for tests of upgrades); returns the versions
    this call applied (empty if none were needed).

    After applying migrations, the grants of the roles recorded by ``grant_application_role`` and
    ``grant_worker_role`` are applied again (version 8 on), so tables and functions that a migration
    created or recreated are granted to the roles that existed before it."""
    if target is not None and target not in {version for version, _, _ in migrations()}:
        raise ValueError(f"no migration has version {target}")
    goal = latest_version() if target is None else target
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = applied_version(conn, schema)
        if found > latest_version():
            raise ConfigurationError(
                f"schema {schema!r} is at version {found}, but this pgdurable knows versions up to "
                f"{latest_version()}: a newer pgdurable migrated it. Upgrade pgdurable here; running older code "
                "against a newer schema is refused")
        if found >= goal:
            return []
        applied: list[int] = []
        with conn.transaction():
            # Whoever holds the lock migrates; the others wait, then find nothing left to do.
            conn.execute(_LOCK_SQL, (schema,))
            citus.prepare_migration(conn)
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            # Functions created with SET search_path FROM CURRENT pin this: our schema, then pg_temp last.
            conn.execute(sql.SQL("SET LOCAL search_path TO {}, pg_temp").format(sql.Identifier(schema)))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            for version, name, text in migrations():
                if version in done or version > goal:
                    continue
                conn.execute(text)
                conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied.append(version)
                log.debug("applied migration %04d_%s to schema %s", version, name, schema)
            if applied:
                row = conn.execute("SELECT to_regprocedure('reapply_role_grants()') IS NOT NULL").fetchone()
                if row and row[0]:
                    conn.execute("SELECT reapply_role_grants()")
        if applied:  # one line, however many migrations a fresh database needed
            log.info("schema %s migrated to version %d", schema, applied[-1])
        return applied
