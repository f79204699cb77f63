"""Load the SQL that ships with the package: numbered migrations and named query blocks."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def _read(folder: str, filename: str) -> LiteralString:
    # The package's own files: as trusted as the literals in this module.
    path = resources.files("pgdurable") / "sql"
    return (path / folder / filename if folder else path / filename).read_text(encoding="utf-8")


@cache
def migrations() -> tuple[tuple[int, str, LiteralString], ...]:
    """(version, name, sql) for every file ``NNNN_name.sql``, in version order."""
    found = []
    for entry in (resources.files("pgdurable") / "sql" / "migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return tuple(sorted(found))


@cache
def citus_migrations() -> tuple[tuple[int, str, LiteralString], ...]:
    """(version, name, sql) for every file ``sql/citus/NNNN_name.sql``: the Citus layout's scripts, each applied
    after the single-node migration of the same number (docs/scale-out.md)."""
    found = []
    for entry in (resources.files("pgdurable") / "sql" / "citus").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return tuple(sorted(found))


@cache
def queries() -> dict[str, LiteralString]:
    """Every named block of every ``sql/queries/*.sql`` file, by name."""
    return _blocks("queries")


@cache
def citus_queries() -> dict[str, LiteralString]:
    """The named blocks of ``sql/queries/citus/*.sql``: the Citus layout's versions of some of ``queries()``,
    under the same names."""
    blocks = _blocks("queries/citus")
    unknown = set(blocks) - set(queries())
    if unknown:
        raise RuntimeError(f"Citus queries override no single-node query: {sorted(unknown)}")
    return blocks


def _blocks(folder: str) -> dict[str, LiteralString]:
    blocks: dict[str, LiteralString] = {}
    directory = resources.files("pgdurable") / "sql"
    for part in folder.split("/"):
        directory = directory / part
    for entry in directory.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in blocks:
                raise RuntimeError(f"duplicate query name {name!r} in {entry.name}")
            # Comments go: psycopg would read a placeholder written in a comment as a real one.
            lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
            blocks[name] = "\n".join(lines).strip().rstrip(";")
    return blocks


def query(name: str, citus: bool = False) -> LiteralString:
    """The named query; ``citus``: its Citus layout's version where there is one."""
    if citus:
        found = citus_queries().get(name)
        if found is not None:
            return found
    return queries()[name]


@cache
def schema_sql() -> LiteralString:
    """``sql/schema.sql``: the current schema in one script (what a new single-node schema is created by,
    checked against the migrations by tests/test_schema_sql.py)."""
    return _read("", "schema.sql")
