"""One word for an execution's id on each side of the public boundary (ARCHITECTURE.md, "Vocabulary").

The public API (the App, handles, errors, the CLI, the dashboard's forms, the SQL API's parameters) calls it
``workflow_id``; the engine beneath the client layer calls it ``execution_id`` (as the tables do). This test
keeps the engine's side true: no module below the client layer defines a name ``workflow_id`` (a parameter, a
variable, a function). Reading the public attribute of a handle (``handle.workflow_id``) is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pgdurable"

# The client layer and above take the public option and may use the public word.
PUBLIC_SIDE = {"__init__.py", "app.py", "client.py", "enqueue.py", "local.py", "scheduling.py", "demo.py",
               "errors.py", "metrics.py", "tracing.py", "limits.py", "context.py", "workflows.py"}
PUBLIC_PACKAGES = {"cli", "dashboard", "contrib"}


def engine_modules() -> list[Path]:
    modules = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC)
        if relative.parts[0] in PUBLIC_PACKAGES or (len(relative.parts) == 1 and relative.name in PUBLIC_SIDE):
            continue
        modules.append(path)
    return modules


def defined_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    return names


def test_the_engine_side_is_found() -> None:
    found = {p.relative_to(SRC).as_posix() for p in engine_modules()}
    assert {"store/executions.py", "monitoring.py", "primitives.py", "events.py", "worker/executor.py"} <= found


@pytest.mark.parametrize("path", engine_modules(), ids=lambda p: p.relative_to(SRC).as_posix())
def test_the_engine_says_execution_id(path: Path) -> None:
    assert "workflow_id" not in defined_names(ast.parse(path.read_text(), str(path)))


def test_the_check_sees_a_parameter() -> None:
    assert "workflow_id" in defined_names(ast.parse("def f(workflow_id): pass"))
    assert "workflow_id" not in defined_names(ast.parse("ids = [h.workflow_id for h in handles]"))
