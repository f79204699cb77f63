"""pgdurable's async API opens one pool per event loop (db.py): a script that calls it under ``asyncio.run``
and never closes anything must still end, and leave no connection behind, however many loops it runs."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgdurable

# Eight concurrent enqueues on a loop's first use grow its pool beyond its first connection, so the loop often
# ends while a connection is being made: before db.py watched loops, psycopg_pool's worker swallowed that
# cancellation and asyncio.run waited for it forever (within 50 runs, every time it was tried).
SCRIPT = textwrap.dedent("""
    import asyncio, sys, time
    import psycopg
    import pgdurable

    conninfo, schema, application = sys.argv[1:4]
    app = pgdurable.App(conninfo, schema=schema)

    @app.workflow()
    def noop(x: int) -> int:
        return x

    async def burst() -> None:
        await asyncio.gather(*(app.enqueue_async(noop, i) for i in range(8)))

    for _ in range(40):
        asyncio.run(burst())
    # A closed session's server process may take a moment to leave pg_stat_activity (a loaded machine).
    with psycopg.connect(conninfo, autocommit=True, application_name="counting") as conn:
        deadline = time.monotonic() + 30
        while True:
            left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                (application,)).fetchone()[0]
            if left == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    print("connections left:", left)
""")


def test_asyncio_run_of_async_calls_ends_and_leaves_no_connection(app: pgdurable.App) -> None:
    app.migrate()
    application = f"loops-{uuid.uuid4().hex[:8]}"
    conninfo = make_conninfo(app.db.conninfo, application_name=application)
    done = subprocess.run([sys.executable, "-c", SCRIPT, conninfo, app.schema, application],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "connections left: 0", done.stdout + done.stderr
    assert "error connecting" not in done.stderr  # a cancelled connection attempt is no failure to connect
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        enqueued = conn.execute(f'SELECT count(*) FROM "{app.schema}".workflow_executions').fetchone()
    assert enqueued == (320,)


def test_closing_the_loops_pool_by_hand_still_works_and_a_new_loop_gets_a_new_pool(app: pgdurable.App) -> None:
    @app.workflow()
    def noop() -> None:
        return None

    pools = []

    async def enqueue_and_close() -> None:
        await app.enqueue_async(noop)
        pools.append(await app.db.async_pool())
        await app.db.aclose_loop_pool()
        await app.db.aclose_loop_pool()  # twice: nothing left to close

    asyncio.run(enqueue_and_close())
    asyncio.run(enqueue_and_close())
    assert pools[0] is not pools[1] and pools[0].closed and pools[1].closed
    assert app.db._async_pools == {} and app.db._loop_watchers == {}


# The closed loop's pool tasks are destroyed pending once collected (as any pool's would be): expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_loop_closed_without_cancelling_its_tasks_is_forgotten(app: pgdurable.App) -> None:
    @app.workflow()
    def noop() -> None:
        return None

    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.enqueue_async(noop))
    loop.close()  # no asyncio.run: its tasks were never cancelled, so nothing closed its pool
    assert loop in app.db._async_pools

    asyncio.run(app.enqueue_async(noop))  # the next loop's pool drops the closed loop's
    assert loop not in app.db._async_pools and loop not in app.db._loop_watchers
    del loop
    gc.collect()  # within this test, whose filter expects what the collection reports
