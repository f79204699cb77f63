"""``pgdurable worker MODULE:APP``: load the application and run a worker until SIGTERM/SIGINT."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import ConfigurationError
from ..worker import run_until_stopped
from ._common import fail, load_app, setup_logging


def worker(
    target: Annotated[str, typer.Argument(help="The App to serve, as MODULE:ATTRIBUTE.")],
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", "-q", help="Queue to serve (repeatable). Default: every queue the app declares (app.queue, "
                              "@app.workflow(queue=...), schedules), and default.")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Executions run at once.")] = 16,
    wait_for_db: Annotated[float, typer.Option(
        "--wait-for-db", help="Seconds to keep retrying while the database does not answer at start.")] = 300.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Serve Prometheus metrics on this port (needs pgdurable\\[metrics]).")] = None,
    metrics_host: Annotated[str, typer.Option("--metrics-host", help="Address for --metrics-port.")] = "127.0.0.1",
) -> None:
    """Run a worker: claim executions, run them, heartbeat, sweep. SIGTERM/SIGINT stops it gracefully.

    Example: pgdurable worker shop:app --queue orders --concurrency 32 --metrics-port 9100
    """
    setup_logging(verbose)
    app = load_app(target)
    if metrics_port is not None:
        try:
            from ..metrics import PrometheusMetrics
        except ImportError:
            fail("--metrics-port needs the metrics extra: pip install 'pgdurable[metrics]'")
        app.observe(PrometheusMetrics(app)).serve(metrics_port, metrics_host)  # type: ignore[attr-defined]

    from ..startup import wait_for_database

    try:
        wait_for_database(app.db, wait_for_db)
    except ConfigurationError as exc:
        fail(f"worker: {exc}")

    run_until_stopped(app.worker(queues=queue or None, concurrency=concurrency))
