"""The NOTIFY channels pgdurable uses, named once.

A schema's channels are ``"<schema>_<kind>"``. The SQL side names them with the function
``notify_channel(kind)`` (see sql/schema.sql); tests/test_schema_sql.py checks that both agree.
"""

from __future__ import annotations

from typing import Final, Literal

from psycopg import sql

Kind = Literal["work", "done", "result", "stop", "event", "schedules"]

# work: an execution became enqueued (payload: its queue); done: one finished (payload: its id); result:
# one finished (payload: its id, status and outcome, see completions.parse_result); stop: a running one was
# cancelled or timed out (payload: its id); event: one published an event (payload: its id); schedules: a
# schedule may be due sooner than planned (payload: empty).
KINDS: Final[tuple[Kind, ...]] = ("work", "done", "result", "stop", "event", "schedules")


def channel(schema: str, kind: Kind) -> str:
    """The channel name of ``kind`` for the pgdurable schema ``schema`` (LISTEN it as an identifier)."""
    if kind not in KINDS:
        raise ValueError(f"unknown channel kind {kind!r}")
    return f"{schema}_{kind}"


def listen(schema: str, *kinds: Kind) -> sql.Composed:
    """``LISTEN`` on the channels of these kinds, as one statement."""
    return sql.SQL("; ").join(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema, kind))) for kind in kinds)
