"""pgdurable on a Citus coordinator (docs/scale-out.md). Needs a Citus cluster (tests/citus_cluster.py); without
one these tests skip, saying why.

With the Citus setting off (``App(citus="off")``, ``PGDURABLE_CITUS=off``) a Citus database holds pgdurable's
tables on its coordinator, undistributed: the migrations must apply there (Citus propagates new functions to its
worker nodes unless told to defer, and then refuses a migration's ALTER FUNCTION ... SET search_path FROM
CURRENT) and everything must work as on a single-node PostgreSQL. The distributed layout, the default on Citus,
is tested by tests/test_citus_layout.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import citus
from pgdurable.migrations import latest_version
from tests import citus_cluster
from tests.conftest import FAST
from tests.harness import WAIT

citus_url = citus_cluster.citus_url


@pytest.fixture
def citus_app(citus_url: str) -> Iterator[pgdurable.App]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    app = pgdurable.App(citus_url, schema=schema, citus="off", **FAST)
    yield app
    app.close()
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_single_node_database_has_no_citus(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert citus.installed(conn) is False


def test_migrate_on_a_coordinator_keeps_everything_there(citus_app: pgdurable.App) -> None:
    assert citus_app.migrate()[-1] == latest_version()
    with psycopg.connect(citus_app.db.conninfo) as conn:
        propagated = conn.execute(
            "SELECT count(*) FROM pg_dist_object o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass "
            "AND o.objid = p.oid WHERE p.pronamespace = %s::regnamespace", (citus_app.schema,)).fetchone()
        distributed = conn.execute(
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE %s",
            (citus_app.schema + ".%",)).fetchone()
    assert propagated == (0,) and distributed == (0,)
    assert citus_app.migrate() == []  # a second migrate finds nothing to do


def test_workflow_and_sql_api_run_on_a_coordinator(citus_app: pgdurable.App,
                                                   start_worker: Callable[..., Any]) -> None:
    @citus_app.step()
    def double(x: int) -> int:
        return 2 * x

    @citus_app.workflow()
    def twice(x: int) -> int:
        return double(double(x))

    start_worker(citus_app)
    assert citus_app.enqueue(twice, 3, workflow_id="c-1").result(timeout=WAIT) == 12
    with psycopg.connect(citus_app.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(citus_app.schema)))
        conn.execute("SELECT enqueue_workflow('twice', '{\"x\": 5}', workflow_id => 'c-2')")
    assert citus_app.handle("c-2").result(timeout=WAIT) == 20
    assert [s.output for s in citus_app.steps("c-2")] == ["10", "20"]
