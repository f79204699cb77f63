"""An app that never migrates (auto_migrate=False): its database and schema come from PGDURABLE_DATABASE_URL
and PGDURABLE_SCHEMA. Used to check how a worker of such an app starts against a database that is not there."""

from __future__ import annotations

import pgdurable

app = pgdurable.App(auto_migrate=False)


@app.workflow()
def noop() -> None:
    return None
