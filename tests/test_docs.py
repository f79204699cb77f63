"""Every code block of README.md and docs/*.md runs, against the test database (how blocks are read and run:
tests/docs_blocks.py). One test per page: its blocks run in order, in a directory and a schema of its own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
from psycopg import sql

import pgdurable

from .docs_blocks import NOT_CODE, REPO, RUN, Block, blocks, pages

BLOCK_TIMEOUT = 300.0  # generous: a loaded machine; a block that works returns as soon as it is done
VENV_BIN = re.compile(r"(?<![\w/])\.venv/bin/")
CREATE_SCHEMA = re.compile(r"CREATE SCHEMA (?:IF NOT EXISTS )?([a-z_][a-z0-9_]*)", re.IGNORECASE)
SCHEMA_NAME = re.compile(r"(?<!['\w])pgdurable\.(?=[a-z_])")


class Page:
    """The running state of one page: its directory, schema, Python session and background processes."""

    def __init__(self, path: Path, directory: Path, database_url: str) -> None:
        self.path, self.directory, self.database_url = path, directory, database_url
        self.schema = f"docs_{uuid.uuid4().hex[:10]}"
        self.log_path = directory / "page.log"
        self.log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115
        self.session: subprocess.Popen[str] | None = None
        self.groups: list[int] = []
        self.own_schemas: set[str] = set()  # application schemas the page's blocks create, dropped at its end
        bin_dir = str(Path(sys.executable).parent)
        self.bin_dir = bin_dir
        inherited = os.environ.get("PYTHONPATH")
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)},
            "PGDURABLE_DATABASE_URL": database_url,
            "PGDURABLE_SCHEMA": self.schema,
            "PYTHONPATH": os.pathsep.join([str(directory), str(REPO / "src"), str(REPO),
                                           *([inherited] if inherited else [])]),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
        }

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def fail(self, block: Block, why: str) -> None:
        pytest.fail(f"{block.source} ({block.lang}) {why}\n--- block ---\n{block.code}--- page log (tail) ---\n"
                    f"{self.tail()}", pytrace=False)

    def python(self, block: Block) -> None:
        if self.session is None:
            self.session = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("docs_session.py"))], cwd=self.directory,
                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.session.stdin is not None and self.session.stdout is not None
        self.log.write(f"\n=== {block.source}\n".encode())
        self.log.flush()
        self.session.stdin.write(json.dumps({"name": block.source, "code": block.code}) + "\n")
        self.session.stdin.flush()
        answer = self.session.stdout.readline()  # the block's own deadlines (result(timeout=...)) bound this
        if not answer:
            self.fail(block, "ended the Python session")
        reply = json.loads(answer)
        if not reply["ok"]:
            self.fail(block, f"raised:\n{reply['error']}")

    def bash(self, block: Block) -> None:
        script = "set -euo pipefail\n" + VENV_BIN.sub(self.bin_dir + "/", block.code)
        self.log.write(f"\n=== {block.source}\n".encode())
        self.log.flush()
        proc = subprocess.Popen(["bash", "-c", script], cwd=self.directory, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.groups.append(proc.pid)  # what it leaves in the background runs until the page ends
        try:
            code = proc.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(block, f"did not finish within {BLOCK_TIMEOUT:.0f} s")
        if code != 0:
            self.fail(block, f"exited with code {code}")

    def sql(self, block: Block) -> None:
        text = SCHEMA_NAME.sub(f'"{self.schema}".', block.code)
        statements = [s.strip() for s in re.split(r";[ \t]*(?:--[^\n]*)?\n", text + "\n") if _has_sql(s)]
        rollback = block.marker == "rollback"
        try:
            with psycopg.connect(self.database_url, autocommit=not rollback) as conn:
                for statement in statements:
                    conn.execute(statement.rstrip(";"))
                if rollback:
                    conn.rollback()
        except psycopg.Error as exc:
            self.fail(block, f"failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self.session is not None:
            assert self.session.stdin is not None
            self.session.stdin.close()
            try:
                self.session.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.session.kill()
                self.session.wait()
        for group in self.groups:
            _signal_group(group, signal.SIGTERM)  # a worker stops gracefully on SIGTERM
        for group in self.groups:
            _wait_group(group)
        self.log.close()


def lint_files(page: Page, names: list[str]) -> None:
    """The modules a page's blocks make pass the project's ruff rules (examples/ is linted by CI's ruff step).
    E402: a block that continues a module may import what it needs where it starts. I001: how imports group
    depends on which packages are first party in the reader's project, which a page cannot know."""
    ruff = Path(page.bin_dir) / "ruff"
    if not names or not ruff.exists():
        return
    command = [str(ruff), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"),
               "--extend-ignore", "E402,I001", *names]
    found = subprocess.run(command, cwd=page.directory, capture_output=True, text=True)
    assert found.returncode == 0, f"{page.path.name}: ruff finds problems in its modules:\n{found.stdout}"


def _has_sql(statement: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in statement.splitlines())


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, sig)


def _wait_group(group: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    _signal_group(group, signal.SIGKILL)


@pytest.fixture
def page_runner(database_url: str, tmp_path: Path) -> Iterator[Any]:
    opened: list[Page] = []

    def open_page(path: Path) -> Page:
        page = Page(path, tmp_path, database_url)
        opened.append(page)
        return page

    yield open_page
    for page in opened:
        page.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            for name in [page.schema, *sorted(page.own_schemas)]:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_block_runs(path: Path, page_runner: Any) -> None:
    found = blocks(path)
    unknown = [b.source for b in found if b.lang not in RUN and b.lang not in NOT_CODE]
    assert not unknown, f"code blocks without a known language (one of {sorted(RUN | dict.fromkeys(NOT_CODE))}): " \
                        f"{unknown}"
    unjustified = [b.source for b in found if b.marker == "skip" and not b.reason]
    assert not unjustified, f"a docs-test skip needs its reason: {unjustified}"
    runnable = [b for b in found if b.kind and b.marker != "skip"]
    if not runnable:
        return
    page: Page = page_runner(path)
    page.own_schemas = {m[1] for b in runnable for m in CREATE_SCHEMA.finditer(b.code)}
    with pgdurable.App(page.database_url, schema=page.schema) as app:
        app.migrate()  # SQL blocks run after the application's schema exists, as they do for a reader
    for block in runnable:  # files first: a worker started by any block imports all of them
        if block.file_name:
            target = page.directory / block.file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a") as out:
                out.write(block.code)
    lint_files(page, sorted({b.file_name for b in runnable if b.file_name}))
    for block in runnable:
        if block.file_name:
            compile((page.directory / block.file_name).read_text(), block.file_name, "exec")
        elif block.included_file:
            compile(block.code, block.included_file, "exec")
        elif block.kind == "python":
            page.python(block)
        elif block.kind == "bash":
            page.bash(block)
        elif block.kind == "sql":
            page.sql(block)


def test_snippets_and_markers_are_read() -> None:
    """The reader itself: a skip needs a reason, includes resolve, sections come out without their markers."""
    from .docs_blocks import section_text

    text = "a\n<!-- --8<-- [start:one] -->\nb\n<!-- --8<-- [end:one] -->\nc\n"
    assert section_text(text, "one") == "b\n"
    assert section_text(text, None) == "a\nb\nc\n"
    with pytest.raises(ValueError):
        section_text(text, "two")
