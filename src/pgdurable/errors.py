"""Exceptions raised by pgdurable."""

from __future__ import annotations

from typing import Any


class PgDurableError(Exception):
    """Base class of every pgdurable error."""


class ConfigurationError(PgDurableError):
    """The application is configured in a way that cannot work."""


class SerializationError(PgDurableError, TypeError):
    """A value could not be encoded to (or decoded from) the payload format."""


class NonDeterminismError(PgDurableError):
    """A workflow replayed differently from how it first ran (its code changed under a running execution)."""


class LeaseLost(PgDurableError):
    """This worker no longer owns the execution: another worker took it over, or it was cancelled.

    Raised inside the workflow at its next durable write; the engine stops the workflow without writing.
    """


class WorkflowNotFound(PgDurableError, LookupError):
    """No execution has this id."""


class WorkflowIdConflict(PgDurableError):
    """An execution with this id already exists for a different workflow."""


class DuplicateWorkflow(PgDurableError):
    """An unfinished execution of the queue already holds this dedup key (``on_duplicate="raise"``)."""

    def __init__(self, existing_id: str, dedup_key: str | None) -> None:
        self.existing_id = existing_id
        self.dedup_key = dedup_key
        super().__init__(f"dedup key {dedup_key!r} is held by unfinished execution {existing_id}")


class ResultTimeout(PgDurableError, TimeoutError):
    """The workflow did not finish within the requested timeout. It keeps running."""


class WorkflowFailed(PgDurableError):
    """The workflow ended failed (or cancelled); ``error`` holds what was recorded."""

    def __init__(self, workflow_id: str, status: str, error: dict[str, Any] | None) -> None:
        self.workflow_id = workflow_id
        self.status = status
        self.error = error or {}
        self.type: str = self.error.get("type", "")
        self.remote_message: str = self.error.get("message", "")
        self.remote_traceback: str = self.error.get("traceback", "")
        detail = f"{self.type}: {self.remote_message}" if self.type else status
        super().__init__(f"workflow {workflow_id} {status}: {detail}")


class WorkflowCancelled(WorkflowFailed):
    """The workflow was cancelled before it finished."""


class WorkflowTimeout(WorkflowFailed):
    """The workflow's deadline (``timeout_seconds``, its own or a parent's) passed before it finished."""


class StepTimeout(PgDurableError, TimeoutError):
    """An attempt of a step ran longer than the step's ``timeout``. The attempt failed (and is retried by the
    step's policy): an async step was cancelled; a sync step's thread, which cannot be stopped, was abandoned
    and whatever it returns later is ignored; a transactional step's statement was cancelled by the server."""


class StepFailed(PgDurableError):
    """Replay of a recorded step error whose original exception type cannot be rebuilt here."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.error = error
        super().__init__(f"{error.get('type', 'Exception')}: {error.get('message', '')}")


def outcome_error(workflow_id: str, status: str, info: dict[str, Any] | None) -> WorkflowFailed:
    """The exception a waiter gets for an execution that ended ``status`` with error ``info``."""
    if status == "cancelled":
        return WorkflowCancelled(workflow_id, status, info)
    if info and info.get("type") == "pgdurable.WorkflowTimeout":
        return WorkflowTimeout(workflow_id, status, info)
    return WorkflowFailed(workflow_id, status, info)
