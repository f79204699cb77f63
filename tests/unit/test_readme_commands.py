"""The README's two commands and CI agree: CI installs exactly as the README says, in the same virtual
environment, and runs the same test runner, demo and documentation checks. (The commands themselves run in CI;
this keeps a change to one from leaving the other behind.)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The lines of the README's "Two commands" block."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "the README's Two commands section has no bash block"
    return [line for line in block[1].splitlines() if line.strip()]


def ci_lines() -> list[str]:
    return [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]


def test_readme_has_two_commands_in_a_virtual_environment() -> None:
    demo, tests = readme_commands()
    for command in (demo, tests):
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install -e "), command
    assert demo.endswith("&& .venv/bin/pgdurable demo")
    assert tests.endswith("&& .venv/bin/pytest")


def test_ci_installs_and_tests_as_the_readme_says() -> None:
    _, tests = readme_commands()
    install = tests.removesuffix(" && .venv/bin/pytest")
    lines = ci_lines()
    assert any(line.startswith(install) for line in lines), f"CI does not run the README's install: {install}"
    activate = lines.index(". .venv/bin/activate")  # from here on, `pytest` is the README's .venv/bin/pytest
    assert any(line.startswith("PGDURABLE_TEST_DATABASE_URL=") and " pytest " in f"{line} "
               for line in lines[activate:]), "CI does not run pytest in the README's environment"
    assert any(line.endswith("pgdurable demo") for line in lines[activate:]), "CI does not run the README's demo"


def test_ci_builds_the_documentation_and_lints_docs() -> None:
    lines = ci_lines()
    assert any("mkdocs build --strict" in line for line in lines)
    assert "ruff check src tests bench examples docs" in lines
