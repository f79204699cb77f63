"""Application versions across deploys: parking what this version cannot run, unparking it, and moving
executions from one version to another (see "Versions and deploys")."""

from __future__ import annotations

from dataclasses import dataclass

from .calls import Call, rows_of


def park(*, id: str, attempt: int, reason: str, previous: str | None) -> Call[bool]:
    return Call("park", {"id": id, "attempt": attempt, "reason": reason, "previous": previous}, bool)


def unpark(*, version: str, names: list[str]) -> Call[int]:
    """Re-enqueue the parked executions of one version (and of these workflows); how many."""
    return Call("unpark", {"version": version, "names": names}, len)


@dataclass(frozen=True, slots=True)
class AppVersion:
    app_version: str
    enqueued: int
    waiting: int
    running: int
    parked: int
    live_workers: int


def app_versions() -> Call[list[AppVersion]]:
    return Call("app_versions", {}, list, row_factory=rows_of(AppVersion))


def migrate_app_version(*, old: str, new: str) -> Call[int]:
    return Call("migrate_app_version", {"old": old, "new": new}, lambda rows: int(rows[0][0]))
