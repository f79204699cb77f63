"""The fault-injection suite (bench/chaos.py) in cluster mode: its scenarios on the coordinator of a Citus cluster,
plus noderestart (a worker node stopped with ``pg_ctl -m immediate`` and started again mid-run).

It restarts the cluster's nodes, so it needs the data directory of a cluster that .ci/citus/cluster.sh started
(PGDURABLE_CITUS_DIR) and is not run beside other tests on that cluster: CI runs it in its Citus step, after
the other Citus tests. Without the variable it skips, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import chaos
from tests.test_chaos import REPO, TIMEOUT, run_chaos

CLUSTER_DIR = os.environ.get("PGDURABLE_CITUS_DIR", "")
# Every scenario on the cluster: 5-6 minutes alone, 8 under two CPU burners (seen 304 s and 492 s).
CLUSTER_TIMEOUT = 2 * TIMEOUT


@pytest.mark.skipif(not CLUSTER_DIR, reason="PGDURABLE_CITUS_DIR is not set (the data directory of a cluster of "
                                            ".ci/citus/cluster.sh, whose nodes this test restarts; CI sets it)")
@pytest.mark.timeout(CLUSTER_TIMEOUT + 90)
def test_chaos_on_a_citus_cluster_passes() -> None:
    # Every scenario, noderestart included. cancelq (statement_timeout = 100 ms for the workers on a cluster,
    # where a session that was cancelled reconnects to the nodes: docs/scale-out.md) passes because the
    # maintenance duties, group commits and heartbeats run one bucket per statement on the distributed layout
    # (docs/scale-out.md, "Maintenance duties").
    scenarios = [*chaos.SCENARIOS, *chaos.CLUSTER_SCENARIOS]
    output = run_chaos("--cluster", CLUSTER_DIR, "--scenarios", ",".join(scenarios), timeout=CLUSTER_TIMEOUT)
    assert f"\nPASS: {len(scenarios)} scenarios" in output, output
    assert "executions finished meanwhile" in output, output  # noderestart: work went on while a node was down


def test_noderestart_needs_a_cluster() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--ci", "--scenarios", "noderestart"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "noderestart with --cluster" in done.stderr
