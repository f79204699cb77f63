"""A pgdurable app whose workflow runs on a cron schedule of every second, for tests with real worker processes.

Served by ``python -m pgdurable worker tests.apps.scheduled:app`` (the ``spawn_worker`` fixture sets
PGDURABLE_DATABASE_URL and PGDURABLE_SCHEMA). Each worker stores the schedule when it starts (the decorator
declares it); every worker fires it. The workflow returns its tick's time, so a test can compare the two.
"""

from __future__ import annotations

from datetime import datetime

import pgdurable

app = pgdurable.App(lease_seconds=2.0, poll_seconds=0.5, sweep_seconds=0.3, shutdown_grace_seconds=1.0)


@app.scheduled("* * * * * *", name="every-second", catch_up="all")
@app.workflow(name="scheduled.tick")
def tick(scheduled_at: datetime) -> str:
    return scheduled_at.isoformat()
