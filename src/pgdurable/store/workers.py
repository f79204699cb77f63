"""The worker registry (which workers live, serving what) and the leader's advisory lock."""

from __future__ import annotations

from typing import Any

from .calls import Call, every, nothing


def register_worker(*, id: str, hostname: str, pid: int, queues: list[str], workflows: list[str],
                    concurrency: int, version: str, adopt: float | None = None,
                    lease: float | None = None) -> Call[None]:
    return Call("register_worker", {"id": id, "hostname": hostname, "pid": pid, "queues": queues,
                                    "workflows": workflows, "concurrency": concurrency, "version": version,
                                    "adopt": adopt, "lease": lease}, nothing)


def worker_heartbeat(id: str) -> Call[None]:
    return Call("worker_heartbeat", {"id": id}, nothing)


def deregister_worker(id: str) -> Call[None]:
    return Call("deregister_worker", {"id": id}, nothing)


def prune_workers() -> Call[None]:
    return Call("prune_workers", {}, nothing)


def arm_doorbell(*, id: str, queue: str) -> Call[None]:
    """The worker is about to sleep on this queue: the next enqueue into it notifies."""
    return Call("arm_doorbell", {"id": id, "queue": queue}, nothing)


def list_workers() -> Call[list[tuple[Any, ...]]]:
    return Call("list_workers", {}, every)


def list_unrunnable(limit: int) -> Call[list[tuple[Any, ...]]]:
    return Call("list_unrunnable", {"limit": limit}, every)


def try_leadership(schema: str) -> Call[bool]:
    return Call("try_leadership", {"schema": schema}, lambda rows: bool(rows[0][0]))


def holds_leadership(schema: str) -> Call[bool]:
    return Call("holds_leadership", {"schema": schema}, lambda rows: bool(rows[0][0]))
