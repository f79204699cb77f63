"""pgdurable: durable Python workflows with PostgreSQL as the only orchestrator."""

import importlib
from typing import Any

from .app import App
from .client import WorkflowHandle
from .config import Settings
from .context import current_workflow_id
from .errors import (
    ConfigurationError,
    DuplicateWorkflow,
    LeaseLost,
    NonDeterminismError,
    PgDurableError,
    ResultTimeout,
    SchemaNotInstalled,
    SerializationError,
    StepFailed,
    StepTimeout,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowIdConflict,
    WorkflowNotFound,
    WorkflowTimeout,
)
from .primitives import (
    close_stream,
    close_stream_async,
    gather,
    gather_async,
    patched,
    recv,
    recv_async,
    set_event,
    set_event_async,
    set_tags,
    set_tags_async,
    sleep,
    sleep_async,
    sleep_until,
    sleep_until_async,
    write_stream,
    write_stream_async,
)
from .serialization import JsonSerializer, Serializer
from .workflows import Workflow

__all__ = [
    "App",
    "ConfigurationError",
    "DuplicateWorkflow",
    "JsonSerializer",
    "LeaseLost",
    "NonDeterminismError",
    "PgDurableError",
    "ResultTimeout",
    "SchemaNotInstalled",
    "SerializationError",
    "Serializer",
    "Settings",
    "StepFailed",
    "StepTimeout",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowFailed",
    "WorkflowHandle",
    "WorkflowIdConflict",
    "WorkflowNotFound",
    "WorkflowTimeout",
    "close_stream",
    "close_stream_async",
    "current_workflow_id",
    "gather",
    "gather_async",
    "patched",
    "recv",
    "recv_async",
    "set_event",
    "set_event_async",
    "set_tags",
    "set_tags_async",
    "sleep",
    "sleep_async",
    "sleep_until",
    "sleep_until_async",
    "write_stream",
    "write_stream_async",
]

# Submodules with optional dependencies, imported on first use (``pgdurable.metrics`` needs prometheus-client,
# ``pgdurable.tracing`` opentelemetry-api, ``pgdurable.dashboard`` starlette): ``import pgdurable`` stays light.
_LAZY_SUBMODULES = frozenset({"metrics", "tracing", "dashboard", "demo"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
