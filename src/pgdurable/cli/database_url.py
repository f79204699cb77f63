"""``pgdurable database-url [MODULE:APP]``: print the database URL pgdurable uses (for psql, scripts)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..app import App
from ..embedded import is_embedded
from ._common import AsJson, DatabaseUrl, load_app


def database_url(
    target: Annotated[str | None, typer.Argument(
        help="An App as MODULE:ATTRIBUTE: print the URL it uses. Without one: --database-url, else "
             "PGDURABLE_DATABASE_URL or DATABASE_URL, else the embedded server's.")] = None,
    database_url: DatabaseUrl = None, as_json: AsJson = False,
) -> None:
    """Print the database URL pgdurable connects to, password included (it is for psql and scripts).

    Example: psql "$(pgdurable database-url shop:app)"
    """
    app = load_app(target) if target else App(database_url)
    try:
        url = str(app.database_url)
        embedded = is_embedded(url)
        if as_json:
            print(json.dumps({"database_url": url, "schema": app.schema, "embedded": embedded}))
        else:
            print(url)
        if embedded:
            print("note: the embedded server runs while a pgdurable process (a worker, your app) uses it",
                  file=sys.stderr)
    finally:
        app.close()
