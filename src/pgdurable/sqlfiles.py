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
def queries() -> dict[str, LiteralString]:
    """Every named block of every ``sql/queries/*.sql`` file, by name."""
    blocks: dict[str, LiteralString] = {}
    for entry in (resources.files("pgdurable") / "sql" / "queries").iterdir():
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


def query(name: str) -> LiteralString:
    return queries()[name]


@cache
def schema_sql() -> LiteralString:
    """``sql/schema.sql``: the current schema in one script (documentation, checked against the migrations
    by tests/test_schema_sql.py)."""
    return _read("", "schema.sql")
