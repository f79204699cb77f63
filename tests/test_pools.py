"""pgdurable's pools hand out the connection returned last (pools.py): a caller working one call at a time
keeps one warm server process instead of going round all of them. Checked on real connections, so that a
psycopg_pool release that changes the step the pools override shows here, not as a silent slowdown."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolClosed

import pgdurable
from pgdurable import pools
from pgdurable.pools import AsyncStackPool, StackPool
from tests.harness import terminate


def _backend(conn: Any) -> int:
    return int(conn.info.backend_pid)


def test_the_sync_pool_hands_out_the_connection_returned_last(database_url: str) -> None:
    with StackPool(database_url, min_size=3, max_size=3, open=True, kwargs={"autocommit": True}) as pool:
        pool.wait()
        a, b, c = pool.getconn(), pool.getconn(), pool.getconn()
        pids = [_backend(a), _backend(b), _backend(c)]
        assert len(set(pids)) == 3
        for conn in (a, b, c):
            pool.putconn(conn)
        # One caller at a time: always the connection returned last.
        for _ in range(5):
            with pool.connection() as conn:
                assert _backend(conn) == pids[2]
        # Concurrent callers get the others, newest first; the one idle longest comes last.
        first, second, third = pool.getconn(), pool.getconn(), pool.getconn()
        assert [_backend(first), _backend(second), _backend(third)] == [pids[2], pids[1], pids[0]]
        for conn in (first, second, third):
            pool.putconn(conn)


async def test_the_async_pool_hands_out_the_connection_returned_last(database_url: str) -> None:
    async with AsyncStackPool(database_url, min_size=2, max_size=2, open=False,
                              kwargs={"autocommit": True}) as pool:
        await pool.wait()
        a, b = await pool.getconn(), await pool.getconn()
        await pool.putconn(b)
        await pool.putconn(a)
        for _ in range(5):
            async with pool.connection() as conn:
                assert _backend(conn) == _backend(a)
        # A connection handed out by the pool while another caller waits stays correct under concurrency.
        seen = await asyncio.gather(*(_pid_after_sleep(pool) for _ in range(6)))
        assert set(seen) == {_backend(a), _backend(b)}


async def _pid_after_sleep(pool: AsyncStackPool) -> int:
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_sleep(0.01)")
        return _backend(conn)


def test_one_caller_enqueues_through_one_server_process(app: pgdurable.App) -> None:
    @app.workflow(queue="nobody_serves_this")
    def noop(i: int) -> int:
        return i

    def pid() -> int:
        with app.runtime.db.pool.connection() as conn:
            return _backend(conn)

    app.enqueue(noop, 0)
    with app.runtime.db.pool.connection() as one, app.runtime.db.pool.connection() as two:
        assert _backend(one) != _backend(two)  # the pool holds two connections now
    used = set()
    for i in range(10):
        app.enqueue(noop, i)
        used.update((pid(), pid()))
    assert len(used) == 1


def test_lend_takes_the_newest_connection_and_gives_it_back_without_the_pools_bookkeeping(
        database_url: str) -> None:
    """lend() takes and gives back an idle connection itself (the psycopg_pool release installed keeps the
    state it uses: should one rename it, this fails instead of every call quietly taking the slower path)."""
    with StackPool(database_url, min_size=2, max_size=2, open=True, kwargs={"autocommit": True}) as pool:
        pool.wait()
        assert pool._lean
        a, b = pool.getconn(), pool.getconn()
        pool.putconn(a)
        pool.putconn(b)
        requests = pool.get_stats().get("requests_num", 0)
        for _ in range(5):
            with pool.lend() as conn:
                assert _backend(conn) == _backend(b)
                assert conn.execute("SELECT 1").fetchone() == (1,)
        assert pool.get_stats().get("requests_num", 0) == requests  # neither getconn nor putconn ran
        with pool.lend() as first, pool.lend() as second:
            assert [_backend(first), _backend(second)] == [_backend(b), _backend(a)]
        assert len(pool._pool) == 2


def test_lend_leaves_what_is_not_plain_to_the_pool(database_url: str) -> None:
    """A connection given back in a transaction is rolled back, a broken one replaced, and one a waiting
    client needs handed to it, by psycopg_pool's own putconn."""
    with StackPool(database_url, min_size=1, max_size=1, open=True, kwargs={"autocommit": True}) as pool:
        pool.wait()
        with pool.lend() as conn:
            pid = _backend(conn)
            conn.execute("BEGIN")
            conn.execute("CREATE TEMP TABLE left_open (x int)")
        with pool.lend() as conn:  # the same connection, its transaction rolled back
            assert _backend(conn) == pid
            assert conn.execute("SELECT to_regclass('left_open')").fetchone() == (None,)
        with pool.lend() as conn:
            conn.pgconn.finish()  # broken while lent
        with pool.lend() as conn:  # a new connection in its place
            assert _backend(conn) != pid
            assert conn.execute("SELECT 1").fetchone() == (1,)
        got: list[int] = []
        with pool.lend() as conn:
            waiter = threading.Thread(target=lambda: got.append(_wait_for_connection(pool)))
            waiter.start()
            deadline = time.monotonic() + 30
            while not pool._waiting and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pool._waiting, "the second caller never waited"
            lent_pid = _backend(conn)
        waiter.join(30)
        assert got == [lent_pid]  # handed over as it came back, not left idle in the pool
    with pytest.raises(PoolClosed), pool.lend():
        pass


def _wait_for_connection(pool: StackPool) -> int:
    with pool.lend() as conn:
        return _backend(conn)


def test_connections_cut_while_idle_are_replaced_before_they_are_lent(
        named_app: tuple[pgdurable.App, str], database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app, application = named_app

    @app.workflow()
    def flow(x: int) -> int:
        return x

    async def twice_async() -> None:
        await asyncio.gather(*(app.enqueue_async(flow, i) for i in range(3)))  # the loop's pool: one connection or more
        assert terminate(database_url, application) >= 1
        for i in range(3):
            assert (await (await app.enqueue_async(flow, i)).get_async()).status == "enqueued"

    for i in range(3):
        app.enqueue(flow, i)
    # Idle long enough to be tested from now on (a restart takes longer than CHECK_AFTER_IDLE_SECONDS).
    monkeypatch.setattr(pools, "CHECK_AFTER_IDLE_SECONDS", 0.0)
    assert terminate(database_url, application) >= 1
    for i in range(3):  # every call answers: no failure for each pooled connection first
        assert app.enqueue(flow, i).get().status == "enqueued"
    asyncio.run(twice_async())


def test_a_connection_in_use_is_not_tested(app: pgdurable.App, monkeypatch: pytest.MonkeyPatch) -> None:
    tested: list[object] = []
    answers = pools._answers
    monkeypatch.setattr(pools, "_answers", lambda conn: tested.append(conn) or answers(conn))

    @app.workflow()
    def flow(x: int) -> int:
        return x

    app.enqueue(flow, 0)
    tested.clear()  # the pool's first connection may be older than the threshold by now (a loaded machine)
    for i in range(20):
        app.enqueue(flow, i)
    assert tested == []
    for conn in app.db.pool._pool:  # the idle ones, as if given back that long ago
        conn._pgdurable_idle_since = time.monotonic() - pools.CHECK_AFTER_IDLE_SECONDS
    app.enqueue(flow, 21)
    assert len(tested) == 1


def test_a_server_that_does_not_answer_is_named_after_a_short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not psycopg_pool's "couldn't get a connection after 30.00 sec", half a minute later."""
    monkeypatch.setattr(pools, "PROBE_AFTER_SECONDS", 0.2)
    nowhere = "postgresql://postgres@127.0.0.1:1/postgres"  # nothing listens on port 1

    said = r"no database connection: cannot reach a PostgreSQL server at 127\.0\.0\.1:1"

    async def lend_async() -> None:
        async with AsyncStackPool(nowhere, min_size=1, max_size=1, open=False) as pool, pool.lend():
            pass

    with (StackPool(nowhere, min_size=1, max_size=1, open=True) as pool,
          pytest.raises(psycopg.OperationalError, match=said), pool.lend()):
        pass
    with pytest.raises(psycopg.OperationalError, match=said):
        asyncio.run(lend_async())


def test_a_busy_pool_is_waited_for_past_the_probe(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pools, "PROBE_AFTER_SECONDS", 0.2)
    with StackPool(database_url, min_size=1, max_size=1, open=True, kwargs={"autocommit": True}) as pool:
        pool.wait()
        held = pool.getconn()
        releaser = threading.Timer(1.0, pool.putconn, (held,))  # well past the probe
        releaser.start()
        with pool.lend() as conn:  # the server answers the probe: the caller waits for the busy pool
            assert _backend(conn) == _backend(held)
        releaser.join()
