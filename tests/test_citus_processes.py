"""The real-process tests of tests/test_processes.py (kill -9 exactly-once, the SIGSTOPped zombie, graceful and
forced shutdown, dead letters, unknown workflows), run again with their database on a Citus coordinator
(tests/citus_cluster.py; without a cluster they skip, saying why).

No test is copied: every test of that module, and its fixture ``h``, is collected here as well, with the
``database_url`` their fixtures build on overridden by the coordinator's. Whatever layout ``migrate`` chooses on
a Citus database (today its tables stay on the coordinator; docs/scale-out.md) is the one they exercise.
"""

from __future__ import annotations

import psycopg
import pytest

from pgdurable import citus
from tests import citus_cluster, test_processes

citus_url = citus_cluster.citus_url

# Every test of tests/test_processes.py, and the fixture they share, under the same names in this module.
globals().update({name: value for name, value in vars(test_processes).items()
                  if name.startswith("test_") or name == "h"})


@pytest.fixture(scope="module")
def database_url(citus_url: str) -> str:
    return citus_url


def test_these_run_on_a_citus_coordinator(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert citus.installed(conn)
