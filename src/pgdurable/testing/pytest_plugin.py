"""pytest plugin (entry point ``pytest11``): the fixture ``pgdurable_harness``.

The application comes from the test's marker, ``@pytest.mark.pgdurable(app=my_app, time_skipping=True)``, or
else from a fixture named ``pgdurable_app`` that the project defines (in its conftest.py). The marker's other
keyword arguments are ``harness()``'s. The database is ``PGDURABLE_TEST_DATABASE_URL``, else the embedded
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Harness, harness


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pgdurable(app=None, **options): the pgdurable App (and harness() options) that the "
                   "pgdurable_harness fixture runs")


@pytest.fixture
def pgdurable_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The application running on a private test schema, with a worker and a time-skipping clock."""
    marker = request.node.get_closest_marker("pgdurable")
    options = dict(marker.kwargs) if marker is not None else {}
    app = options.pop("app", None)
    if app is None:
        try:
            app = request.getfixturevalue("pgdurable_app")
        except pytest.FixtureLookupError:
            raise pytest.UsageError(
                "pgdurable_harness needs an App: mark the test @pytest.mark.pgdurable(app=...) or define a "
                "fixture named pgdurable_app") from None
    with harness(app, **options) as opened:
        yield opened
