"""The pytest plugin of pgdurable.testing, in a pytest of its own (pytester): the pgdurable_harness fixture
takes the App from the test's marker or from a pgdurable_app fixture, and says what is missing otherwise."""

from __future__ import annotations

import os
import tomllib

import pytest

from tests.conftest import CHILD_PYTHONPATH, REPO

pytest_plugins = ["pytester"]

_APP = '''
import pgdurable

app = pgdurable.App("postgresql://nobody@127.0.0.1:1/none")  # the harness moves it to a test schema


@app.workflow
def remind(name: str) -> str:
    pgdurable.sleep(3 * 86400)
    return f"reminded {name}"
'''


@pytest.fixture
def project(pytester: pytest.Pytester, database_url: str, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", f"{CHILD_PYTHONPATH}{os.pathsep}{pytester.path}")
    monkeypatch.setenv("PGDURABLE_TEST_DATABASE_URL", database_url)
    pytester.makepyfile(reminders=_APP)
    return pytester


def _run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    # The plugin by name: this checkout's entry point is not installed (pip would point the venv here).
    return project.runpytest_subprocess("-p", "pgdurable.testing.pytest_plugin", "-p", "no:cacheprovider", *args)


def test_the_fixture_takes_the_app_from_a_fixture_or_a_marker(project: pytest.Pytester) -> None:
    project.makeconftest('''
import pytest

from reminders import app


@pytest.fixture
def pgdurable_app():
    return app
''')
    project.makepyfile(test_reminders='''
import time
from datetime import timedelta

import pytest

from reminders import app, remind


def test_from_the_fixture(pgdurable_harness):
    start = pgdurable_harness.now()
    assert pgdurable_harness.run(remind, "ann") == "reminded ann"
    assert pgdurable_harness.now() - start >= timedelta(days=3)
    assert app.schema == pgdurable_harness.schema


@pytest.mark.pgdurable(app=app, time_skipping=False)
def test_from_the_marker(pgdurable_harness):
    handle = app.enqueue(remind, "bob")
    deadline = time.monotonic() + 60
    while handle.status() != "waiting":  # asleep, until a time counted from its start
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pgdurable_harness.skip(3 * 86400 + 1)  # nothing skips by itself: move time by hand
    assert handle.result(timeout=60) == "reminded bob"
    assert pgdurable_harness.skips == 0
''')
    result = _run(project)
    result.assert_outcomes(passed=2)


def test_without_an_app_the_fixture_says_how_to_give_one(project: pytest.Pytester) -> None:
    project.makepyfile(test_nothing='''
def test_needs_an_app(pgdurable_harness):
    pass
''')
    result = _run(project)
    result.stdout.fnmatch_lines(["*pgdurable_harness needs an App*"])
    assert result.ret != 0


def test_the_declared_entry_point_loads_the_plugin_alone_or_beside_p(project: pytest.Pytester) -> None:
    # As an install registers it: pyproject's pytest11 entry point, in a dist-info on the path.
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    info = project.mkdir("site") / "pgdurable_entry-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pgdurable-entry\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    os.environ["PYTHONPATH"] += os.pathsep + str(project.path / "site")  # (monkeypatched: restored after)
    alone = project.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    alone.stdout.fnmatch_lines(["pgdurable_harness -- *pytest_plugin.py*"])
    beside = _run(project, "--fixtures")  # -p with the same module: no "already registered" error
    beside.stdout.fnmatch_lines(["pgdurable_harness -- *pytest_plugin.py*"])
    assert alone.ret == beside.ret == 0
