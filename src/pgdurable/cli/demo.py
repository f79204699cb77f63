"""``pgdurable demo``: workflows that survive a SIGKILLed worker (the demo itself is ``pgdurable.demo``)."""

from __future__ import annotations

from typing import Annotated

import typer

from ._common import DatabaseUrl, console


def demo(
    database_url: DatabaseUrl = None,
    workflows: Annotated[int, typer.Option(help="How many workflows to run.")] = 3,
) -> None:
    """Watch workflows survive a SIGKILLed worker: they finish from their checkpoints on another one."""
    from ..demo import run_demo

    raise typer.Exit(run_demo(database_url, workflows, console))

