"""Exceptions raised by pgdurable."""

from __future__ import annotations

from typing import Any


class PgDurableError(Exception):
    """Base class of every pgdurable error."""


class ConfigurationError(PgDurableError):
    """The application is configured in a way that cannot work."""


def migrate_command(schema: str | None = None) -> str:
    """The command that installs or upgrades pgdurable's schema (named when it is not the default)."""
    return "pgdurable migrate" + (f" --schema {schema}" if schema and schema != "pgdurable" else "")


class SchemaNotInstalled(ConfigurationError):
    """pgdurable's tables or functions are missing from the schema a statement ran on: the schema was never
    migrated (an App with ``auto_migrate=False``, a worker or CLI pointed at a new database), or it is older
    than this code."""

    def __init__(self, schema: str | None, detail: str) -> None:
        self.schema = schema
        where = f"schema {schema!r}" if schema else "the schema used"
        super().__init__(
            f"pgdurable is not installed in {where} of this database, or is older than this pgdurable ({detail}): "
            f"run `{migrate_command(schema)}` with the same database URL, or call app.migrate()")


class SerializationError(PgDurableError, TypeError):
    """A value could not be encoded to (or decoded from) the payload format."""


class NonDeterminismError(BaseException):
    """A workflow replayed differently from how it first ran (its code changed under a running execution).

    Raised inside the workflow to stop the replay; the engine then parks the execution (nothing written) for
    a worker whose code matches its history. A BaseException, like asyncio.CancelledError, so that a
    workflow's ``except Exception`` cannot swallow it (the engine checks at the end in any case).
    """


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
