"""pgdurable: durable Python workflows with PostgreSQL as the only orchestrator."""

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
    gather,
    gather_async,
    patched,
    recv,
    recv_async,
    set_event,
    set_event_async,
    sleep,
    sleep_async,
    sleep_until,
    sleep_until_async,
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
    "current_workflow_id",
    "gather",
    "gather_async",
    "patched",
    "recv",
    "recv_async",
    "set_event",
    "set_event_async",
    "sleep",
    "sleep_async",
    "sleep_until",
    "sleep_until_async",
]
