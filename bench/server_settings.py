"""Server-wide PostgreSQL settings for the benchmarks that change them (bench/chaos.py, bench/bloat.py): read
one, or set it with ALTER SYSTEM and a reload, so that every session that did not set its own value uses the
new one from its next statement on. A superuser's job."""

from __future__ import annotations

import psycopg
from psycopg import sql


def current(url: str, name: str) -> str:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
        assert row is not None
        return str(row[0])


def reload(url: str, name: str, value: str | None) -> None:
    """ALTER SYSTEM SET ``name`` (or RESET, for None), then reload the configuration. For settings that take
    effect without a restart."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        if value is None:
            conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
        else:
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")
