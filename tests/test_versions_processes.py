"""Version adoption across real processes: a worker process of version v1 is SIGKILLed in the middle of a
workflow; a worker process of v2 adopts the execution once v1's last heartbeat is older than the grace, and
finishes it from its checkpoints (each effect applied once)."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from tests.apps import versioned
from tests.harness import WAIT, wait_for


@pytest.fixture
def effects(database_url: str) -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    name = f"v_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        versioned.create(conn, name)
        try:
            yield name, conn
        finally:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_a_v2_process_adopts_what_a_sigkilled_v1_process_was_running(
        make_app: Callable[..., pgdurable.App], spawn_worker: Callable[..., Any], schema: str,
        effects: tuple[str, psycopg.Connection[Any]]) -> None:
    effects_schema, db = effects
    client = make_app(app_version="client")
    pipeline = versioned.define(client)
    client.migrate()
    db.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(schema), sql.Identifier(effects_schema)))

    def rows(label: str) -> list[tuple[Any, ...]]:
        return db.execute("SELECT version, started FROM effects WHERE label = %s", (label,)).fetchall()

    env = {"VERSIONED_SCHEMA": effects_schema}
    v1 = spawn_worker("tests.apps.versioned:app", env={**env, "PGDURABLE_APP_VERSION": "v1"})
    handle = client.enqueue(pipeline, 1, workflow_id="killed-mid-way")
    wait_for(lambda: rows("a-1"), WAIT, "v1 to run the first effect")
    v1.send_signal(signal.SIGKILL)  # inside the second effect's transaction, or about to be
    v1.wait()
    row = db.execute("SELECT status, app_version FROM workflow_executions WHERE id = 'killed-mid-way'").fetchone()
    assert row == ("running", "v1")
    (last_heartbeat,) = db.execute("SELECT heartbeat_at FROM workers WHERE app_version = 'v1'").fetchone() or (None,)
    assert last_heartbeat is not None  # a killed worker does not deregister: it counts as live for the grace

    spawn_worker("tests.apps.versioned:app", env={**env, "PGDURABLE_APP_VERSION": "v2"})
    assert handle.result(timeout=WAIT) == ["a-1", "hold-1", "b-1"]
    assert [r[0] for r in rows("a-1")] == ["v1"]  # from its checkpoint, not run again
    assert [r[0] for r in rows("hold-1")] == ["v2"]  # v1's attempt rolled back with its process
    assert [r[0] for r in rows("b-1")] == ["v2"]
    # Adopted only after the grace: v2 ran its first effect at least 3 s after v1's last heartbeat.
    grace = versioned.app.settings.adopt_after_seconds
    assert grace is not None and rows("hold-1")[0][1] >= last_heartbeat + timedelta(seconds=grace)
    final = db.execute("SELECT app_version, attempt FROM workflow_executions WHERE id = 'killed-mid-way'").fetchone()
    assert final is not None and final[0] == "v2" and final[1] >= 2
