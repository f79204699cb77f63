"""Leases, delays and sweeps run on database time: workers whose clocks are hours off behave correctly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import crashy
from tests.conftest import CHILD_PYTHONPATH, REPO
from tests.harness import WAIT

SKEW_DIR = REPO / "tests" / "clockskew"  # its sitecustomize shifts time.time() and datetime.now()


def _env(skew_seconds: float) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SKEW_DIR}{os.pathsep}{CHILD_PYTHONPATH}",
            "PGDURABLE_TEST_CLOCK_SKEW": str(skew_seconds)}


@pytest.fixture
def skewed_workers(database_url: str, schema: str, tmp_path: Path) -> Iterator[Callable[[float], None]]:
    """Start `pgdurable worker` processes whose wall clock is shifted by an offset in seconds."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(skew_seconds: float) -> None:
        log = open(tmp_path / f"worker{skew_seconds:+.0f}.log", "wb")  # noqa: SIM115
        env = {**_env(skew_seconds), "PGDURABLE_DATABASE_URL": database_url, "PGDURABLE_SCHEMA": schema,
               "CRASHY_LEASE": "2.0"}
        procs.append(subprocess.Popen([sys.executable, "-m", "pgdurable", "worker", "tests.apps.crashy:app"],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_workers_with_skewed_clocks_keep_leases_and_delays(make_app: Callable[..., pgdurable.App],
                                                           skewed_workers: Callable[[float], None]) -> None:
    app = make_app()
    flows = crashy.define(app)
    app.db.ensure_schema()
    # One worker 3 hours behind, one 3 hours ahead. Were leases or sweeps on their clocks, the one ahead
    # would see every lease of the one behind as long expired and steal its executions.
    skewed_workers(-3 * 3600)
    skewed_workers(+3 * 3600)
    handles = [app.enqueue(flows.chain, 3, 0.05, 1, 3.0) for _ in range(6)]  # a 3 s step: longer than the lease
    delayed = app.enqueue(flows.chain, 1, 0.0, delay=2.0)
    assert all(handle.result(timeout=WAIT)["labels"] == ["s0", "s1", "s2"] for handle in handles)
    assert delayed.result(timeout=WAIT)["labels"] == ["s0"]
    with psycopg.connect(app.db.conninfo) as conn:
        rows = conn.execute(sql.SQL("SELECT id, attempt, recoveries, started_at - created_at "
                                    "FROM {}.workflow_executions").format(sql.Identifier(app.schema))).fetchall()
    by_id = {row[0]: row for row in rows}
    for handle in handles:
        _, attempt, recoveries, _ = by_id[handle.workflow_id]
        assert (attempt, recoveries) == (1, 0), "a lease was taken over although its worker was alive"
    assert by_id[delayed.workflow_id][3].total_seconds() >= 2.0  # the worker 3 h ahead did not start it early
    # And both workers really ran (their clocks were really shifted).
    owners = {s.recorded_by_attempt for h in handles for s in app.steps(h.workflow_id)}
    assert owners == {1}


def test_the_skewed_clock_is_really_skewed() -> None:
    shifted = subprocess.run(
        [sys.executable, "-c", "import time, datetime; print(time.time(), datetime.datetime.now().timestamp())"],
        capture_output=True, text=True, env=_env(-3 * 3600), check=True)
    wall, now = (float(v) for v in shifted.stdout.split())
    assert time.time() - wall > 3 * 3600 - 60 and time.time() - now > 3 * 3600 - 60
