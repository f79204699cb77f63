"""Keeping database passwords out of messages, logs and tracebacks.

A database URL's password must never be shown, however malformed the URL (a bad port, a bad percent-escape,
an unescaped ``@``): libpq quotes the offending piece of the URL in its errors, and psycopg_pool logs them.

- ``check_database_url`` parses a URL once, up front, and refuses a malformed one with a ConfigurationError
  whose message names the problem with the password replaced by ``***``.
- ``redact`` removes the passwords of every URL this process was given (and any ``user:password@`` or
  ``password=`` it sees) from a text.
- ``RedactingFilter``, installed on pgdurable's and psycopg's loggers, applies ``redact`` to every record
  (message and traceback) those loggers emit.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .errors import ConfigurationError

MASK = "***"
_lock = threading.Lock()
_secrets: set[str] = set()

# user:password@ in a URL (the password up to the last @ before the path: an unescaped @ in it included)
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(?P<secret>[^/?#\s]*)@")
# password=... in a key/value connection string or a URL query (quoted or not)
_KEYWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:\\.|[^'\\])*'|[^\s&]+)", re.IGNORECASE)
# A key/value connection string starts with a keyword and '=' (host=... dbname=...).
_KEY_VALUE = re.compile(r"\s*\w+\s*=")
# The loggers whose records may quote a connection string or a libpq error.
LOGGERS = ("pgdurable", "pgdurable.worker", "pgdurable.dashboard", "pgdurable.schedules", "pgdurable.telemetry",
           "psycopg", "psycopg.pool")


def _candidates(conninfo: str) -> set[str]:
    """The password of ``conninfo`` in every form it may be quoted in: as written, percent-decoded, and (for
    an unescaped @) each piece around the @."""
    found: set[str] = set()
    for pattern in (_URL_USERINFO, _KEYWORD):
        for match in pattern.finditer(conninfo):
            secret = match.group("secret").strip("'")
            found |= {secret, unquote(secret)}
            found |= {piece for piece in secret.split("@") if len(piece) >= 3}
    try:
        password = conninfo_to_dict(conninfo).get("password")
    except (psycopg.Error, ValueError, TypeError):
        password = None
    if password:
        found.add(str(password))
    return {s for s in found if len(s) >= 2}


def remember(conninfo: str) -> None:
    """Redact this connection string's password from every message from now on (if it is at least 4
    characters: a shorter one would blank out common words; messages about ``conninfo`` itself redact it
    whatever its length)."""
    found = {s for s in _candidates(conninfo) if len(s) >= 4}
    if found - _secrets:
        with _lock:
            _secrets.update(found)
        install()


def redact(text: str, conninfo: str | None = None) -> str:
    """``text`` without any password: those of ``conninfo`` and every remembered URL, and whatever follows
    ``user:`` in a URL or ``password=``."""
    if not text:
        return text
    text = _URL_USERINFO.sub(lambda m: m.group("head") + MASK + "@", text)
    text = _KEYWORD.sub(lambda m: m.group("head") + MASK, text)
    secrets = set(_secrets) | (_candidates(conninfo) if conninfo else set())
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def check_database_url(conninfo: str) -> str:
    """``conninfo`` if libpq can use it; else ConfigurationError saying what is wrong, without its password.
    Also remembers its password for redaction."""
    remember(conninfo)
    scheme, separator, _ = conninfo.partition("://")
    if separator and scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"the database URL {redact(conninfo, conninfo)!r} is malformed: its scheme is {scheme!r}, and "
            "pgdurable needs PostgreSQL: postgresql://user@host:port/database")
    if not separator and not _KEY_VALUE.match(conninfo):
        # No scheme, so no pattern finds a password in it: show nothing of what precedes an @.
        shown = redact(MASK + "@" + conninfo.rpartition("@")[2] if "@" in conninfo else conninfo, conninfo)
        raise ConfigurationError(
            f"the database URL {shown!r} is malformed: it has no scheme; write it "
            "postgresql://user@host:port/database (or as key=value settings: host=... dbname=...)")
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise ConfigurationError(f"the database URL {redact(conninfo, conninfo)!r} is malformed: "
                                 f"{redact(str(exc).strip(), conninfo)}") from None
    for host in str(params.get("host") or "").split(","):
        if "@" in host:
            raise ConfigurationError(
                f"the database URL {redact(conninfo, conninfo)!r} is malformed: its host contains '@' (an '@' "
                "in a user name or password must be written %40)")
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(f"the database URL {redact(conninfo, conninfo)!r} is malformed: invalid "
                                     f"port {redact(port, conninfo)!r}")
    return conninfo


class SecretUrl(str):
    """A connection URL that is used as is (it is a ``str``) but whose repr masks its password, so that it
    can be shown in a REPL, a log of ``repr`` values or a traceback's locals without leaking it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact(str(self), str(self)))


def describe(exc: BaseException, conninfo: str | None = None) -> str:
    """One line about a connection error, without any password."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return redact(lines[-1] if lines else type(exc).__name__, conninfo)


class RedactingFilter(logging.Filter):
    """Removes passwords from a record's message and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let logging report it as it would
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_text = redact(text)
        return True


_FILTER = RedactingFilter()


def install() -> None:
    """Put the redacting filter on pgdurable's and psycopg's loggers (once)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
