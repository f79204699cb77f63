"""The fault-injection suite (bench/chaos.py) in its short CI mode, as one test.

It starts a private PostgreSQL of its own (it restarts that server and kills its connections), so it does not
use the database the other tests are configured with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 400.0


@pytest.mark.timeout(TIMEOUT + 90)
def test_chaos_ci_mode_passes() -> None:
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "chaos.py"), "--ci"], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the script stops its workers and its server, then prints its table
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(f"bench/chaos.py --ci did not finish in {TIMEOUT:.0f} s:\n{output}")
    print(output)
    assert proc.returncode == 0, f"bench/chaos.py --ci failed (exit code {proc.returncode}):\n{output}"
    assert "\nPASS: 9 scenarios" in output, output
