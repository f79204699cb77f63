"""Start-up and connection errors are clear messages with exit code 2, never a traceback, and never show the
database password: malformed URLs (bad port, bad percent-escape, unescaped @, bad syntax) in every command,
the library and the logs, and workers that do not migrate against a missing or unreachable database."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.redaction import redact

from .conftest import CHILD_PYTHONPATH

SECRET = "S3cr3tPw"
MALFORMED = [
    f"postgresql://postgres:{SECRET}@127.0.0.1:99999/db",  # port out of range
    f"postgresql://postgres:{SECRET}@127.0.0.1:abc/db",  # port not a number
    f"postgresql://postgres:{SECRET}%zz@127.0.0.1/db",  # bad percent-escape in the password
    f"postgresql://postgres:%zz{SECRET}@127.0.0.1/db",
    f"postgresql://postgres:{SECRET}@[::1/db",  # unclosed IPv6 bracket
    f"postgresql://postgres:{SECRET[:4]}@{SECRET[4:]}@127.0.0.1/db",  # an unescaped @ in the password
    f"postgres ql://postgres:{SECRET}@127.0.0.1/db",  # not a URL, nor key=value
    f"host=127.0.0.1 password={SECRET} port=abc",
    f"host=127.0.0.1 password='{SECRET}",  # unterminated quote
    f"postgresql://postgres:{SECRET}@127.0.0.1/db?sslmode=bogus",
]
TRACEBACK = "Traceback (most recent call last)"


def _leaks(text: str) -> bool:
    return SECRET in text or SECRET[:4] + "@" in text or SECRET[4:] in text


@pytest.mark.parametrize("url", MALFORMED)
def test_commands_refuse_a_malformed_url_without_showing_its_password(url: str, schema: str) -> None:
    runner = CliRunner()
    for args in (["status", "--json"], ["status"], ["workflows", "list"], ["workflows", "show", "x"],
                 ["migrate"], ["cleanup", "--older-than", "1d"], ["workers", "--json"]):
        result = runner.invoke(cli, [*args, "--database-url", url, "--schema", schema])
        shown = result.output + (result.stderr if result.stderr_bytes is not None else "")
        assert result.exit_code == 2, (args, shown)
        assert not _leaks(shown), (args, shown)
        assert TRACEBACK not in shown, (args, shown)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        if args == ["status", "--json"]:
            report = json.loads(result.stdout)
            assert report["healthy"] is False and report["exit_code"] == 2 and report["error"]


@pytest.mark.parametrize("url", MALFORMED)
def test_the_library_refuses_a_malformed_url_without_showing_its_password(
        url: str, schema: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app = pgdurable.App(url, schema=schema)
    try:
        with pytest.raises((pgdurable.ConfigurationError, Exception)) as raised:
            app.enqueue("anything")
        text = "".join(traceback.format_exception(raised.value))
        assert not _leaks(text) and not _leaks(str(raised.value)), text
        if "sslmode" not in url:  # libpq checks option values when it connects
            assert isinstance(raised.value, pgdurable.ConfigurationError)
            assert "malformed" in str(raised.value)
    finally:
        app.close()
    assert not _leaks(caplog.text), caplog.text


def test_redaction_of_messages_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    url = f"postgresql://app:{SECRET}@db.example:5432/shop"
    assert redact(f"could not connect with {url}") == "could not connect with postgresql://app:***@db.example:5432/shop"
    assert SECRET not in redact(f"host=x password={SECRET} user=y")
    assert SECRET not in redact(f"bad token {SECRET}", url)
    pgdurable.redaction.remember(url)
    caplog.set_level(logging.INFO)
    logging.getLogger("psycopg.pool").warning("error connecting: %s", SECRET)
    try:
        raise RuntimeError(f"boom {SECRET}")
    except RuntimeError:
        logging.getLogger("pgdurable.worker").exception("failed")
    assert SECRET not in caplog.text and "***" in caplog.text


# ---- workers that do not migrate ----------------------------------------------------------------------------

def _worker(url: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgdurable", "worker", "tests.apps.no_migrate:app", *args],
                          env={**os.environ, "PGDURABLE_DATABASE_URL": url, "PGDURABLE_SCHEMA": schema,
                               "PYTHONPATH": CHILD_PYTHONPATH},
                          capture_output=True, text=True, timeout=120)


def _with_password(database_url: str, **changes: Any) -> str:
    params = {**conninfo_to_dict(database_url), "password": SECRET, **changes}
    return make_conninfo(**params)


def _assert_clear(done: subprocess.CompletedProcess[str], *words: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert TRACEBACK not in output and "PoolTimeout" not in output, output
    assert not _leaks(output), output
    flat = " ".join(output.split())
    for word in words:
        assert word in flat, output


def test_a_worker_without_migration_refuses_a_database_that_does_not_exist(database_url: str,
                                                                           schema: str) -> None:
    done = _worker(_with_password(database_url, dbname="no_such_db_pgdurable"), schema, "--wait-for-db", "60")
    _assert_clear(done, "no_such_db_pgdurable", "does not exist")


def test_a_worker_without_migration_gives_up_on_a_closed_port(database_url: str, schema: str) -> None:
    done = _worker(_with_password(database_url, host="127.0.0.1", port="1", connect_timeout="1"), schema,
                   "--wait-for-db", "2")
    _assert_clear(done, "did not answer within 2 s")


def test_a_worker_without_migration_refuses_a_schema_without_pgdurable(database_url: str, schema: str) -> None:
    done = _worker(_with_password(database_url), schema, "--wait-for-db", "10")
    _assert_clear(done, "not installed in schema", "pgdurable migrate")


def test_a_worker_refuses_a_malformed_url(schema: str) -> None:
    done = _worker(f"postgresql://postgres:{SECRET}%zz@127.0.0.1/db", schema, "--wait-for-db", "10")
    _assert_clear(done, "malformed")
