"""Where pgdurable's settings come from: arguments first, then the environment, then defaults."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .errors import ConfigurationError

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


def database_url_from_env() -> str | None:
    return os.environ.get("PGDURABLE_DATABASE_URL") or os.environ.get("DATABASE_URL") or None


def embedded_data_dir() -> Path:
    """Where the embedded PostgreSQL keeps its data: ``PGDURABLE_DATA_DIR`` or a per-user directory."""
    configured = os.environ.get("PGDURABLE_DATA_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_data_dir("pgdurable")) / "pg18"


def schema_name(explicit: str | None) -> str:
    name = explicit or os.environ.get("PGDURABLE_SCHEMA") or "pgdurable"
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"schema name {name!r} must be a lowercase SQL identifier (letters, digits, underscore)"
        )
    return name


@dataclass(frozen=True)
class Settings:
    """Engine tunables. The defaults suit production; tests shorten the timings."""

    # How long a claim is valid without a heartbeat. A crashed worker's executions resume elsewhere after
    # at most about this long.
    lease_seconds: float = 30.0
    # How often a worker looks for work when no NOTIFY arrived (a fallback, not the latency).
    poll_seconds: float = 2.0
    # How often the leader worker looks for expired leases of other (crashed) workers, passed deadlines and
    # unrunnable work (see worker/leader.py).
    sweep_seconds: float = 5.0
    # How many times an execution's lease may expire before it is dead-lettered.
    max_recoveries: int = 5
    # How long an execution may wait on a served queue whose workers do not know its workflow before it
    # is failed with a clear message. None keeps it waiting forever.
    unknown_workflow_grace_seconds: float | None = 300.0
    # Graceful shutdown: how long running workflows get to finish before they are released.
    shutdown_grace_seconds: float = 10.0
    # A worker process whose stop has not ended this long after the grace period (a statement the server never
    # answers, a task that ignores its cancellation) logs every thread's and task's stack and exits with
    # status 1; what it owned resumes elsewhere once the leases expire. A stop that goes well takes well
    # under a second beyond the grace period.
    shutdown_patience_seconds: float = 15.0
    # The largest input, step output or result accepted, as encoded JSON text. The SQL function
    # enqueue_workflow applies the same default limit.
    max_payload_bytes: int = 8 * 1024 * 1024
    # The application version stamped on every execution this app's workers start; only workers of the
    # same version resume it. None: ``PGDURABLE_APP_VERSION``, else a hash of the workflows' source code.
    app_version: str | None = None
    # Automatic retention: when set, the leader deletes one batch of finished executions (and their steps)
    # created and finished more than this many seconds ago every sweep_seconds. None keeps everything.
    retention_seconds: float | None = None
    # Executions deleted per pass by automatic retention: at most this many every sweep_seconds, per schema.
    retention_batch_size: int = 500
    # Adoption: a worker resumes executions of another application version once no worker of that version
    # heartbeated for this many seconds (their history must replay on this code, else they are parked).
    # None: strict per-version mode, executions wait for a worker of their own version. More than the
    # workers' heartbeat interval (lease_seconds / 3), so that a live worker is never taken for a gone one.
    adopt_after_seconds: float | None = 60.0
    # Citus (docs/scale-out.md): on a database with the citus extension, "auto" and "on" give a schema the
    # distributed layout when migrating it, "off" keeps it on the coordinator, undistributed ("on" also refuses
    # a database without Citus). None: ``PGDURABLE_CITUS``, else "auto".
    citus: str | None = None

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) and v > 0 for v in (self.lease_seconds, self.poll_seconds, self.sweep_seconds)):
            raise ConfigurationError("lease_seconds, poll_seconds and sweep_seconds must be positive")
        for name in ("shutdown_grace_seconds", "shutdown_patience_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigurationError(f"{name} must be a number of seconds >= 0, not {value!r}")
        if self.max_recoveries < 0:
            raise ConfigurationError("max_recoveries must be >= 0")
        if self.max_payload_bytes < 1024:
            raise ConfigurationError("max_payload_bytes must be at least 1024")
        if self.retention_seconds is not None and self.retention_seconds < 0:
            raise ConfigurationError("retention_seconds must be >= 0 (or None to keep everything)")
        if self.citus is not None and self.citus not in ("auto", "on", "off"):
            raise ConfigurationError(f"citus must be 'auto', 'on' or 'off', not {self.citus!r}")
        if self.retention_batch_size < 1:
            raise ConfigurationError("retention_batch_size must be at least 1")
        if self.adopt_after_seconds is not None and not self.adopt_after_seconds > self.heartbeat_seconds:
            raise ConfigurationError(
                f"adopt_after_seconds ({self.adopt_after_seconds}) must be more than the workers' heartbeat "
                f"interval, lease_seconds / 3 ({self.heartbeat_seconds:g} s), or None (never adopt)")

    @property
    def heartbeat_seconds(self) -> float:
        return self.lease_seconds / 3
