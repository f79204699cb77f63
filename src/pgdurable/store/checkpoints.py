"""What attempts record (step checkpoints and completions, written by the group commit, fenced by attempt)
and what replay and the read paths read back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from .calls import Call, Rows, every, rows_of


@dataclass(frozen=True, slots=True)
class RecordedStep:
    step_name: str
    output: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Step:
    step_id: int
    step_name: str
    output: str | None
    error: str | None
    attempts: int
    recorded_by_attempt: int
    started_at: datetime
    completed_at: datetime


def _recorded_steps(rows: list[dict[str, Any]]) -> dict[str, dict[int, RecordedStep]]:
    found: dict[str, dict[int, RecordedStep]] = {}
    for row in rows:
        found.setdefault(row["execution_id"], {})[row["step_id"]] = RecordedStep(
            row["step_name"], row["output"], row["error"])
    return found


def load_steps(ids: list[str]) -> Call[dict[str, dict[int, RecordedStep]]]:
    return Call("load_steps", {"ids": ids}, _recorded_steps, row_factory=dict_row)


# What a group commit wrote, by (execution_id, attempt, step_id or None for a completion): keyed by the
# attempt too, so that two attempts of one execution in one batch never take each other's outcome.
WriteKey = tuple[str, int, int | None]


def _written(rows: Rows) -> set[WriteKey]:
    return {(row[0], row[1], row[2]) for row in rows}


def write_steps(rows: str, few: bool = False) -> Call[set[WriteKey]]:
    """Step checkpoints as one JSON array; returns (execution_id, attempt, step_id) of the rows written.
    ``few``: a batch of a few rows (single node), planned for them: each execution looked up by its id."""
    return Call("write_steps_few" if few else "write_steps", {"rows": rows}, _written)


def write_step(execution_id: str, attempt: int, step_id: int, step_name: str, tries: int, started_at: datetime,
               output: str | None, error: str | None) -> Call[set[WriteKey]]:
    """``write_steps`` of one step (single node), from scalar parameters; ``output``, ``error``: JSON texts."""
    return Call("write_step", {"execution_id": execution_id, "attempt": attempt, "step_id": step_id,
                               "step_name": step_name, "tries": tries, "started_at": started_at,
                               "output": output or "null", "error": error}, _written)


def write_completions(rows: str, bells: str = "[]", few: bool = False) -> Call[set[WriteKey]]:
    """Completions as one JSON array; returns (execution_id, attempt, None) of the executions finished.
    ``bells``: a JSON array of [worker_id, queue], the doorbells to arm in the same statement (single node).
    ``few``: as for ``write_steps``."""
    return Call("write_completions_few" if few else "write_completions", {"rows": rows, "bells": bells}, _written)


def write_checkpoints(steps: str, completions: str, bells: str = "[]", few: bool = False) -> Call[set[WriteKey]]:
    """``write_steps`` and ``write_completions`` in one statement (single node): what both return."""
    return Call("write_checkpoints_few" if few else "write_checkpoints",
                {"steps": steps, "completions": completions, "bells": bells}, _written)


def list_steps(id: str) -> Call[list[Step]]:
    return Call("list_steps", {"id": id}, every, row_factory=rows_of(Step))
