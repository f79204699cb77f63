"""pgdurable: durable Python workflows with PostgreSQL as the only orchestrator."""

from .app import App
from .client import WorkflowHandle
from .config import Settings
from .context import current_workflow_id
from .errors import (
    ConfigurationError,
    LeaseLost,
    NonDeterminismError,
    PgDurableError,
    ResultTimeout,
    SerializationError,
    StepFailed,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowIdConflict,
    WorkflowNotFound,
)
from .serialization import JsonSerializer, Serializer
from .workflows import Workflow

__all__ = [
    "App",
    "ConfigurationError",
    "JsonSerializer",
    "LeaseLost",
    "NonDeterminismError",
    "PgDurableError",
    "ResultTimeout",
    "SerializationError",
    "Serializer",
    "Settings",
    "StepFailed",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowFailed",
    "WorkflowHandle",
    "WorkflowIdConflict",
    "WorkflowNotFound",
    "current_workflow_id",
]
