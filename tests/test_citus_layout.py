"""The distributed Citus layout (docs/scale-out.md): a schema migrated on a Citus coordinator has the tables an
execution owns distributed on its bucket, and the same application code runs on it as on a single node. Needs a
Citus cluster (tests/citus_cluster.py); without one these tests skip, saying why.

Ids are picked so that the executions of a test live on different worker nodes where that matters (a send, a
child and its parent, a transactional step's table)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgdurable
from pgdurable import citus, store
from pgdurable.migrations import latest_version
from pgdurable.worker.maintenance import Deps
from pgdurable.worker.maintenance.sweeper import Sweeper
from tests import citus_cluster
from tests.conftest import FAST
from tests.harness import WAIT, wait_for

citus_url = citus_cluster.citus_url

OWNED_TABLES = {"workflow_executions", "operation_outputs", "workflow_messages", "workflow_events",
                "workflow_streams", "awaited_executions"}


@pytest.fixture
def make_citus_app(citus_url: str) -> Iterator[Callable[..., pgdurable.App]]:
    made: list[pgdurable.App] = []

    def make(**options: Any) -> pgdurable.App:
        app = pgdurable.App(citus_url, schema=f"t_{uuid.uuid4().hex[:12]}", **{**FAST, **options})
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()
        with psycopg.connect(citus_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(app.schema)))


@pytest.fixture
def capp(make_citus_app: Callable[..., pgdurable.App]) -> pgdurable.App:
    return make_citus_app()


def node_of(app: pgdurable.App, execution_id: str) -> int:
    """The port of the worker node that holds this execution's bucket."""
    with psycopg.connect(app.db.conninfo) as conn:
        row = conn.execute(sql.SQL(
            "SELECT p.nodeport FROM pg_dist_shard_placement p WHERE p.shardid = "
            "get_shard_id_for_distribution_column(%s::regclass, {}.bucket_of(%s))").format(
                sql.Identifier(app.schema)), (f"{app.schema}.workflow_executions", execution_id)).fetchone()
    assert row is not None
    return int(row[0])


def id_on_another_node(app: pgdurable.App, prefix: str, other: str) -> str:
    """The first of prefix-0, prefix-1, ... whose bucket lives on another node than ``other``'s."""
    return next(f"{prefix}-{i}" for i in range(1000) if node_of(app, f"{prefix}-{i}") != node_of(app, other))


def test_migrate_distributes_what_an_execution_owns(capp: pgdurable.App) -> None:
    applied = capp.migrate()
    assert applied[-2:] == [latest_version(), citus.VERSION_OFFSET + latest_version()]
    schema = capp.schema
    with psycopg.connect(capp.db.conninfo) as conn:
        parts = conn.execute(
            "SELECT logicalrelid::regclass::text, partmethod, colocationid FROM pg_dist_partition "
            "WHERE logicalrelid::regclass::text LIKE %s", (schema + ".%",)).fetchall()
        triggers = conn.execute(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal AND tgrelid::regclass::text "
            "= ANY (%s)", ([f"{schema}.{t}" for t in OWNED_TABLES],)).fetchall()
        shards = conn.execute("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = %s::regclass",
                              (f"{schema}.workflow_executions",)).fetchone()
        buckets = conn.execute(sql.SQL("SELECT {}.citus_buckets()").format(sql.Identifier(schema))).fetchone()
        placed = conn.execute(sql.SQL(
            "SELECT count(DISTINCT get_shard_id_for_distribution_column(%s::regclass, b)) "
            "FROM unnest({}.citus_buckets()) AS b").format(sql.Identifier(schema)),
            (f"{schema}.workflow_executions",)).fetchone()
        spread = conn.execute(sql.SQL(
            "SELECT count(DISTINCT {0}.bucket_of('id-' || i)) FROM generate_series(1, 3200) AS i").format(
                sql.Identifier(schema))).fetchone()
    distributed = {name.split(".", 1)[1]: (method, colocation) for name, method, colocation in parts}
    assert set(distributed) == OWNED_TABLES  # the small tables stay on the coordinator
    assert {method for method, _ in distributed.values()} == {"h"}
    assert len({colocation for _, colocation in distributed.values()}) == 1  # co-located
    assert triggers == []  # no trigger on a distributed table
    assert shards is not None and buckets is not None and placed is not None and spread is not None
    assert len(buckets[0]) == shards[0] == placed[0] == spread[0]  # one bucket per shard, every one used
    capp.db.ensure_schema()
    assert capp.db.distributed and capp.db.buckets == tuple(buckets[0])
    assert capp.migrate() == []


def test_the_setting_off_keeps_a_new_schema_on_the_coordinator(
        make_citus_app: Callable[..., pgdurable.App]) -> None:
    app = make_citus_app(citus="off")
    assert app.migrate()[-1] == latest_version()
    with psycopg.connect(app.db.conninfo) as conn:
        found = conn.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE %s",
                             (app.schema + ".%",)).fetchone()
    assert found == (0,)
    assert make_citus_app(citus="off").migrate() != [] and not app.db.distributed


def test_steps_result_and_the_sql_api(capp: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @capp.step()
    def double(x: int) -> int:
        return 2 * x

    @capp.workflow()
    def twice(x: int) -> int:
        return double(double(x))

    start_worker(capp)
    handles = [capp.enqueue(twice, i, workflow_id=f"many-{i}") for i in range(12)]  # over several buckets
    assert [h.result(timeout=WAIT) for h in handles] == [4 * i for i in range(12)]
    assert len({node_of(capp, h.workflow_id) for h in handles}) == 2
    assert [s.output for s in capp.steps("many-3")] == ["6", "12"]
    with psycopg.connect(capp.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(capp.schema)))
        conn.execute("SELECT enqueue_workflow('twice', '{\"x\": 5}', workflow_id => 'sql-1')")
        assert capp.handle("sql-1").result(timeout=WAIT) == 20
        assert conn.execute("SELECT status, output FROM workflow_status('sql-1')").fetchone() == ("succeeded", 20)


def test_sleep_send_recv_and_events_across_buckets(capp: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @capp.workflow()
    def receiver() -> list[Any]:
        pgdurable.set_event("state", "listening")
        return [pgdurable.recv("orders"), pgdurable.recv("orders")]

    @capp.workflow()
    def sender(to: str) -> str:
        pgdurable.sleep(0.3)
        capp.send(to, {"n": 1}, topic="orders")
        capp.send(to, {"n": 2}, topic="orders")
        return "sent"

    start_worker(capp, concurrency=2)
    capp.migrate()
    receiving = capp.enqueue(receiver, workflow_id="rx")
    sender_id = id_on_another_node(capp, "tx", "rx")
    sending = capp.enqueue(sender, "rx", workflow_id=sender_id)
    assert sending.result(timeout=WAIT) == "sent"
    assert receiving.result(timeout=WAIT) == [{"n": 1}, {"n": 2}]
    assert capp.get_event("rx", "state") == "listening"
    assert capp.steps(sender_id)[0].step_name == "pgdurable.sleep"


def test_children_on_another_node_wake_their_parent(capp: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @capp.workflow()
    def square(x: int) -> int:
        return x * x

    @capp.workflow()
    def parent(n: int) -> list[int]:
        return pgdurable.gather([capp.enqueue(square, i) for i in range(n)])

    capp.migrate()
    # the first child (its id is "<parent>:0") on the other node than its parent
    parent_id = next(f"parent-{i}" for i in range(1000)
                     if node_of(capp, f"parent-{i}") != node_of(capp, f"parent-{i}:0"))
    start_worker(capp, concurrency=1)  # the parent must release its only slot for its children to run
    assert capp.enqueue(parent, 4, workflow_id=parent_id).result(timeout=WAIT) == [0, 1, 4, 9]
    children = capp.children(parent_id)
    assert len(children) == 4 and len({node_of(capp, c[0]) for c in children} | {node_of(capp, parent_id)}) == 2


def test_an_execution_enqueued_past_its_deadline_is_failed_by_it_not_run(capp: pgdurable.App,
                                                                        start_worker: Callable[..., Any]) -> None:
    # What a parent is when a child that inherited its deadline failed first, in an earlier bucket of the
    # deadline check, and woke it: enqueued, its deadline passed. It must end failed by its own deadline, as on a
    # single node (where the one statement fails both), never run and fail with its child's timeout.
    ran: list[str] = []

    @capp.workflow()
    def late() -> str:
        ran.append(pgdurable.current_workflow_id() or "")
        return "ran"

    capp.migrate()
    handle = capp.enqueue(late, workflow_id="late-1")
    with psycopg.connect(capp.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {s}.workflow_executions SET deadline = now() - interval '1 second' "
                             "WHERE bucket = {s}.bucket_of('late-1') AND id = 'late-1'").format(
                                 s=sql.Identifier(capp.schema)))
    start_worker(capp, concurrency=2)
    with pytest.raises(pgdurable.WorkflowTimeout):
        handle.result(timeout=WAIT)
    assert ran == []
    execution = capp.get("late-1")
    assert execution is not None and (execution.status, execution.attempt) == ("failed", 0)


def test_cancel_reaches_a_child_on_another_node(capp: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @capp.workflow()
    def forever() -> None:
        pgdurable.recv("never")

    @capp.workflow()
    def parent() -> None:
        capp.enqueue(forever).result()

    start_worker(capp, concurrency=2)
    capp.migrate()
    parent_id = next(f"cancel-{i}" for i in range(1000)
                     if node_of(capp, f"cancel-{i}") != node_of(capp, f"cancel-{i}:0"))
    handle = capp.enqueue(parent, workflow_id=parent_id)
    wait_for(lambda: len(capp.children(parent_id)) == 1
             and capp.handle(parent_id + ":0").status() == "waiting", WAIT, "the child to wait")
    assert capp.cancel(parent_id)
    with pytest.raises(pgdurable.WorkflowCancelled):
        handle.result(timeout=WAIT)
    assert capp.handle(parent_id + ":0").status() == "cancelled"


def test_retries_and_a_transactional_step_on_a_colocated_table(
        capp: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    capp.migrate()
    table = sql.Identifier(capp.schema, "orders")
    with psycopg.connect(capp.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (bucket smallint NOT NULL, execution_id text NOT NULL, "
                             "total integer NOT NULL, PRIMARY KEY (bucket, execution_id))").format(table))
        conn.execute("SELECT create_distributed_table(%s, 'bucket', colocate_with => %s)",
                     (f"{capp.schema}.orders", f"{capp.schema}.workflow_executions"))
    failures = {"flaky": 2}
    lock = threading.Lock()

    @capp.step(max_attempts=3, interval=0.01)
    def flaky() -> int:
        with lock:
            if failures["flaky"]:
                failures["flaky"] -= 1
                raise ConnectionError("try again")
        return 21

    @capp.transaction()
    def record(conn: psycopg.Connection[Any], total: int) -> int:
        me = pgdurable.current_workflow_id()
        conn.execute(sql.SQL("INSERT INTO {} VALUES ({}.bucket_of(%s), %s, %s)").format(
            table, sql.Identifier(capp.schema)), (me, me, total))
        return total

    @capp.workflow()
    def order() -> int:
        return record(2 * flaky())

    start_worker(capp)
    assert capp.enqueue(order, workflow_id="order-1").result(timeout=WAIT) == 42
    assert capp.steps("order-1")[0].attempts == 3  # the flaky step, after two failures
    with psycopg.connect(capp.db.conninfo) as conn:
        assert conn.execute(sql.SQL("SELECT total FROM {} WHERE execution_id = 'order-1'").format(table)
                            ).fetchall() == [(42,)]


def test_enqueue_in_the_callers_transaction(capp: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @capp.workflow()
    def fulfil(n: int) -> int:
        return n + 1

    capp.migrate()
    with psycopg.connect(capp.db.conninfo) as conn:
        capp.enqueue(fulfil, 1, workflow_id="rolled-back", conn=conn)
        conn.rollback()
        handle = capp.enqueue(fulfil, 2, workflow_id="committed", conn=conn)
        conn.commit()
    start_worker(capp)
    assert handle.result(timeout=WAIT) == 3
    with pytest.raises(pgdurable.WorkflowNotFound):
        capp.handle("rolled-back").get()


def test_what_the_first_release_refuses(capp: pgdurable.App) -> None:
    @capp.workflow()
    def noop() -> None:
        return None

    capp.migrate()
    with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"docs/scale-out\.md"):
        capp.enqueue(noop, dedup_key="k")
    with psycopg.connect(capp.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(capp.schema)))
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"docs/scale-out\.md"):
            conn.execute("SELECT set_queue_policy('q', 2, NULL, NULL, NULL, NULL)")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="distributed or reference table"):
        capp.bind_table(f"{capp.schema}.workflow_executions", noop)


def test_retention_deletes_finished_executions_in_every_bucket(capp: pgdurable.App,
                                                               start_worker: Callable[..., Any]) -> None:
    @capp.step()
    def one() -> int:
        return 1

    @capp.workflow()
    def done(i: int) -> int:
        return one() + i

    @capp.workflow()
    def parent() -> None:
        capp.enqueue(done, 0).result()
        pgdurable.recv("never")

    start_worker(capp)
    handles = [capp.enqueue(done, i, workflow_id=f"old-{i}") for i in range(8)]
    assert [h.result(timeout=WAIT) for h in handles] == [i + 1 for i in range(8)]
    capp.enqueue(parent, workflow_id="keeper")
    wait_for(lambda: [c[2] for c in capp.children("keeper")] == ["succeeded"], WAIT, "the waiting parent's child")
    assert capp.cleanup(older_than=0, batch_size=3) == 8  # the child of an unfinished parent is kept
    with psycopg.connect(capp.db.conninfo) as conn:
        left = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(
            sql.Identifier(capp.schema, "workflow_executions"))).fetchall()
        steps = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE execution_id LIKE 'old-%%'").format(
            sql.Identifier(capp.schema, "operation_outputs"))).fetchone()
    assert left == [("keeper",), ("keeper:0",)] and steps == (0,)


def test_an_expired_lease_is_swept_back_and_run_again(make_citus_app: Callable[..., pgdurable.App],
                                                     start_worker: Callable[..., Any]) -> None:
    app = make_citus_app(lease_seconds=1.0, adopt_after_seconds=None)

    @app.workflow()
    def once() -> str:
        return "ran"

    app.migrate()
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        # an execution claimed by a worker that died: running, its lease already over
        conn.execute(sql.SQL("SELECT * FROM {}.insert_executions_v2(%s::jsonb)").format(
            sql.Identifier(app.schema)),
            ('[{"id": "orphan", "name": "once", "owner_id": "gone", "lease_seconds": 0.001}]',))
    start_worker(app)
    assert app.handle("orphan").result(timeout=WAIT) == "ran"
    assert app.handle("orphan").get().recoveries == 1


def test_a_binding_on_a_coordinator_table_enqueues_into_the_buckets(capp: pgdurable.App,
                                                                    start_worker: Callable[..., Any]) -> None:
    @capp.workflow()
    def welcome(id: int, email: str) -> str:
        return f"welcome {email} ({id})"

    capp.migrate()
    table = sql.Identifier("public", f"{capp.schema}_signups")
    with psycopg.connect(capp.db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, email text NOT NULL)").format(table))
    try:
        capp.bind_table(f"public.{capp.schema}_signups", welcome)
        start_worker(capp)
        with psycopg.connect(capp.db.conninfo) as conn:  # the trigger fires on the coordinator, in this transaction
            conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a@example.com'), (2, 'b@example.com')").format(table))
        wait_for(lambda: sorted(e.output for e in capp.list_workflows(name="welcome") if e.output) == [
            '"welcome a@example.com (1)"', '"welcome b@example.com (2)"'], WAIT, "both bound executions")
    finally:
        with psycopg.connect(capp.db.conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE {}").format(table))


def test_a_duty_goes_on_in_the_other_buckets_while_one_buckets_statement_is_cancelled(
        make_citus_app: Callable[..., pgdurable.App]) -> None:
    # Two orphans (running, their lease over) in buckets on different nodes; the shard holding the first is
    # locked on its worker node, so the sweep's statement there waits until its statement_timeout cancels it.
    app = make_citus_app(lease_seconds=1.0, adopt_after_seconds=None)
    app.migrate()
    blocked = "orphan-a"
    swept = id_on_another_node(app, "orphan-b", blocked)
    with psycopg.connect(app.db.conninfo, autocommit=True) as conn:
        for orphan in (blocked, swept):
            conn.execute(sql.SQL("SELECT * FROM {}.insert_executions_v2(%s::jsonb)").format(
                sql.Identifier(app.schema)),
                (f'[{{"id": "{orphan}", "name": "gone", "owner_id": "gone", "lease_seconds": 0.001}}]',))
        buckets = citus.buckets(conn, app.schema)
        row = conn.execute(sql.SQL("SELECT shard_name(%s::regclass, get_shard_id_for_distribution_column("
                                   "%s::regclass, {}.bucket_of(%s)))").format(sql.Identifier(app.schema)),
                           (f"{app.schema}.workflow_executions",) * 2 + (blocked,)).fetchone()
        bucket_of_blocked = conn.execute(sql.SQL("SELECT {}.bucket_of(%s)").format(sql.Identifier(app.schema)),
                                         (blocked,)).fetchone()
    assert buckets is not None and row is not None and bucket_of_blocked is not None
    node = psycopg.conninfo.make_conninfo(app.db.conninfo, port=node_of(app, blocked))

    def status(execution_id: str) -> str:
        return app.handle(execution_id).get().status

    session: list[psycopg.AsyncConnection[Any]] = []  # the duty's connection during a pass

    async def run(call: store.Call[Any]) -> Any:
        return await store.arun(session[0], call)

    async def sweep_once(sweeper: Sweeper) -> None:
        conn = await app.db.aconnect()
        try:
            # bounds the wait on the locked shard (no assertion on time: only on what was swept)
            await conn.execute("SET statement_timeout = '2s'")
            session[:] = [conn]
            await sweeper.once()
        finally:
            await conn.close()

    sweeper = Sweeper(Deps(run=run, worker_id="test", settings=app.runtime.settings,
                           observers=app.runtime.observers, buckets=lambda: buckets))
    with psycopg.connect(node) as locker:
        locker.execute("SET citus.enable_manual_changes_to_shards = on")  # a shard may be locked by hand
        locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(*row[0].split("."))))
        asyncio.run(sweep_once(sweeper))
        assert status(swept) == "enqueued"  # swept although another bucket's statement failed
        assert sweeper.per_bucket.failures == 1
        assert sweeper.per_bucket.size(bucket_of_blocked[0]) < sweeper.per_bucket.LARGEST  # a smaller batch
        locker.rollback()
    assert status(blocked) == "running"  # left for the next pass
    asyncio.run(sweep_once(sweeper))
    assert status(blocked) == "enqueued"
    assert sweeper.per_bucket.failures == 1
