"""One clear line about a failed connection: which server (host and port, or socket), and what to do.

libpq's own text spreads over several lines, ends with a generic hint, and reports a missing database in the
same words whatever the cause; these messages say which of the usual cases it is. No message shows a password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .redaction import describe, redact

# 'connection to server at "db" (10.0.0.5), port 5432 failed: ...' / 'connection to server on socket "..." failed'
_AT = re.compile(r'connection to server at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+) failed: (?P<why>.*)')
_SOCKET = re.compile(r'connection to server on socket "(?P<socket>[^"]*)" failed: (?P<why>.*)')
_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]*)" does not exist')
_CREDENTIALS = ("password authentication failed", "no pg_hba.conf entry", "role \"", "authentication failed",
                "no password supplied", "permission denied for database")
_UNREACHABLE = ("connection refused", "could not translate host name", "failed to resolve host", "timeout expired",
                "no such file or directory", "network is unreachable", "no route to host", "name or service not known",
                "connection timed out", "could not connect", "server closed the connection")


@dataclass(frozen=True, slots=True)
class ConnectionProblem:
    kind: str  # "missing_database", "credentials", "unreachable" or "other"
    message: str

    @property
    def permanent(self) -> bool:
        """Whether waiting will not fix it (a missing database, refused credentials)."""
        return self.kind in ("missing_database", "credentials")


def explain(exc: BaseException, conninfo: str | None = None) -> ConnectionProblem:
    """What went wrong connecting with ``conninfo``, in one line naming the server."""
    text = str(exc)
    where, why = _server(text, conninfo)
    at = f" at {where}" if where else ""
    state = getattr(exc, "sqlstate", None) or ""
    missing = _MISSING_DATABASE.search(text)
    if state == "3D000" or missing:
        name = missing.group("name") if missing else _param(conninfo, "dbname") or "?"
        create = _createdb(conninfo, name, where)
        return ConnectionProblem("missing_database", redact(
            f'database "{name}" does not exist on the server{at}: create it ({create}, or '
            f'CREATE DATABASE "{name}" in psql), or fix the database name in the URL', conninfo))
    lowered = text.lower()
    if state.startswith("28") or any(hint.lower() in lowered for hint in _CREDENTIALS):
        return ConnectionProblem("credentials", redact(
            f"the server{at} refused these credentials: {why or describe(exc)}", conninfo))
    if isinstance(exc, psycopg.OperationalError) and any(hint in lowered for hint in _UNREACHABLE):
        return ConnectionProblem("unreachable", redact(
            f"cannot reach a PostgreSQL server{at}: {why or describe(exc)}", conninfo))
    return ConnectionProblem("other", redact(f"{describe(exc)}{f' (server{at})' if where else ''}", conninfo))


def _server(text: str, conninfo: str | None) -> tuple[str, str]:
    """(the server as host:port or socket, libpq's reason), from the last attempt the message reports, else
    from the connection string."""
    attempts = list(_AT.finditer(text)) + list(_SOCKET.finditer(text))
    if attempts:
        last = max(attempts, key=lambda m: m.start())
        why = last.group("why").strip()
        if "socket" in last.groupdict():
            return f"socket {last.group('socket')}", why
        return f"{last.group('host')}:{last.group('port')}", why
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    why = lines[0] if lines else ""
    if conninfo is None:
        return "", why  # neither the message nor a URL names it
    host = _param(conninfo, "host") or "localhost"
    port = _param(conninfo, "port") or "5432"
    if host.startswith("/"):
        return f"socket directory {host}", why
    return f"{host}:{port}", why


def _param(conninfo: str | None, key: str) -> str | None:
    if not conninfo:
        return None
    try:
        value = conninfo_to_dict(conninfo).get(key)
    except (psycopg.Error, ValueError, TypeError):
        return None
    return str(value) if value else None


def _createdb(conninfo: str | None, name: str, where: str) -> str:
    """The createdb command for the server at ``where`` (host:port, as the message or URL names it)."""
    host, _, port = where.rpartition(":") if where and not where.startswith("socket") else ("", "", "")
    parts = ["createdb"]
    for flag, value in (("-h", _param(conninfo, "host") or host), ("-p", _param(conninfo, "port") or port),
                        ("-U", _param(conninfo, "user"))):
        if value:
            parts += [flag, value]
    return " ".join([*parts, name])


# Citus reports a worker node it could not reach, or lost mid-statement, through the coordinator as an internal
# error (SQLSTATE XX000) rather than as a connection failure of the client's own session: in its own words, or
# in libpq's for the connection to that node ("server closed the connection unexpectedly ... CONTEXT: while
# executing command on 10.0.0.12:5432").
_CITUS_NODE_LOST = ("failure on connection marked as essential", "connection to the remote node", "invalid socket",
                    "server closed the connection", "connection refused", "could not connect", "connection timed out",
                    "no route to host", "network is unreachable")


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is something a later attempt may not meet (psycopg's OperationalError: a lost
    connection, a server shutting down, a cancelled statement; on Citus the coordinator's connection to a worker
    node failing) rather than anything about the statement or its data."""
    if isinstance(exc, psycopg.OperationalError):
        return True
    if type(exc) is psycopg.DatabaseError and exc.sqlstate is None:
        # An error result of libpq's own, with no SQLSTATE (the server's errors always have one): psycopg
        # raises it as a plain DatabaseError when the connection is lost while a statement runs (a server
        # restarted with -m immediate, seen by a result wait in the fault-injection test).
        return True
    text = str(exc).lower()
    return isinstance(exc, psycopg.errors.InternalError_) and any(hint in text for hint in _CITUS_NODE_LOST)
