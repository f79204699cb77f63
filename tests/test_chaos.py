"""The fault-injection suite (bench/chaos.py) in its short CI mode, as one test.

It starts a private PostgreSQL of its own (it restarts that server and kills its connections), so it does not
use the database the other tests are configured with. CI runs it once, in a step of its own: the two passes of
the suite (PostgreSQL 15, embedded 18) set PGDURABLE_SKIP_CHAOS, and the skip names that step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import chaos

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 400.0
SKIP_CHAOS = os.environ.get("PGDURABLE_SKIP_CHAOS", "")


def run_chaos(*options: str, timeout: float = TIMEOUT) -> str:
    """Run ``bench/chaos.py --ci`` with these options; its output, or the test fails with it."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "chaos.py"), "--ci", *options], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the script stops its workers and its server, then prints its table
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(f"bench/chaos.py --ci {' '.join(options)} did not finish in {timeout:.0f} s:\n{output}")
    print(output)
    assert proc.returncode == 0, f"bench/chaos.py --ci failed (exit code {proc.returncode}):\n{output}"
    return output


@pytest.mark.skipif(bool(SKIP_CHAOS), reason=f"PGDURABLE_SKIP_CHAOS={SKIP_CHAOS!r}: the fault-injection test "
                                             "runs once per CI, in its own step of .ci/run")
@pytest.mark.timeout(TIMEOUT + 90)
def test_chaos_ci_mode_passes() -> None:
    output = run_chaos()
    assert "\nPASS: 9 scenarios" in output, output


def test_the_harness_changes_server_settings_in_a_session_exempt_from_the_workers_statement_timeout(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancelq scenario sets statement_timeout = 20 ms server-wide; resetting it (ALTER SYSTEM RESET, then
    pg_reload_conf) in a session bound by it was cancelled under load, leaving it on for later scenarios."""
    server: Any = object.__new__(chaos.PrivateServer)  # its settings methods, without starting a server
    server.url = database_url
    server.admin_url = chaos._with_app_name(database_url, chaos.ADMIN_APP_NAME)
    used: list[str] = []

    class Recorded(Exception):
        pass

    def connect(conninfo: str, **kwargs: Any) -> Any:
        used.append(conninfo)
        raise Recorded  # never run ALTER SYSTEM on the shared test server

    monkeypatch.setattr(chaos.psycopg, "connect", connect)
    for call in (lambda: server.reload_setting("statement_timeout", None), lambda: server.configure(x="1")):
        with pytest.raises(Recorded):
            call()
    monkeypatch.undo()
    assert used == [server.admin_url] * 2
    # What the server-wide setting does to a session that does not set its own (PGOPTIONS: the same priority
    # as the configuration file for this purpose: below the session's own options).
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=1ms")
    with psycopg.connect(database_url, autocommit=True) as plain, pytest.raises(psycopg.errors.QueryCanceled):
        plain.execute("SELECT pg_sleep(0.05)")
    with psycopg.connect(server.admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_sleep(0.05)")  # not cancelled
        assert admin.execute("SHOW application_name").fetchone() == (chaos.ADMIN_APP_NAME,)
