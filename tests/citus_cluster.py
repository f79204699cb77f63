"""The Citus cluster the Citus tests run against: PGDURABLE_CITUS_URL, else the coordinator that
.ci/citus/cluster.sh starts (127.0.0.1:9700). Without one the tests using ``citus_url`` skip, saying why."""

from __future__ import annotations

import os

import psycopg
import pytest

from pgdurable import citus

CITUS_URL = os.environ.get("PGDURABLE_CITUS_URL", "postgresql://postgres@127.0.0.1:9700/postgres")


@pytest.fixture(scope="module")
def citus_url() -> str:
    try:
        with psycopg.connect(CITUS_URL, connect_timeout=5) as conn:
            if not citus.installed(conn):
                pytest.skip(f"{CITUS_URL} has no citus extension: not a Citus coordinator")
            nodes = conn.execute("SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' "
                                 "AND shouldhaveshards AND isactive").fetchone()
    except psycopg.OperationalError as exc:
        pytest.skip(f"no Citus cluster at {CITUS_URL} (start one with .ci/citus/cluster.sh start, or set "
                    f"PGDURABLE_CITUS_URL): {str(exc).strip().splitlines()[0]}")
    assert nodes and nodes[0] >= 2, "the Citus tests need a cluster with at least two worker nodes"
    return CITUS_URL
