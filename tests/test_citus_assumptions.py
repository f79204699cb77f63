"""What the plan of docs/scale-out.md relies on in Citus itself, checked on a real cluster (tests/citus_cluster.py;
without one these tests skip, saying why), so that a Citus upgrade that changes any of it fails here first.

Each test works in a schema of its own with one small table distributed on a smallint ``bucket`` column, the
way the plan distributes the engine's tables."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests import citus_cluster
from tests.harness import WAIT

citus_url = citus_cluster.citus_url
SHARDS = 4


@pytest.fixture
def scratch(citus_url: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """An autocommit connection to the coordinator, its search_path on a fresh schema holding ``items``,
    distributed on ``bucket`` over a few shards."""
    name = f"ca_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda _: None)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        conn.execute("CREATE TABLE items (bucket smallint NOT NULL, id text NOT NULL, status text NOT NULL, "
                     "seq bigint GENERATED ALWAYS AS IDENTITY, owner text, PRIMARY KEY (bucket, id))")
        conn.execute("SELECT create_distributed_table('items', 'bucket', shard_count => %s)", (SHARDS,))
        try:
            yield conn, name
        finally:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def node_of(conn: psycopg.Connection[Any], bucket: int) -> int:
    row = conn.execute("SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = "
                       "get_shard_id_for_distribution_column('items', %s::smallint)", (bucket,)).fetchone()
    assert row is not None
    return int(row[0])


def buckets_on_two_nodes(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    by_node: dict[int, int] = {}
    for bucket in range(64):
        by_node.setdefault(node_of(conn, bucket), bucket)
    assert len(by_node) >= 2, f"every bucket of 0..63 is on one node: {by_node}"
    first, second = list(by_node.values())[:2]
    return first, second


CLAIM = ("WITH picked AS (SELECT id FROM items WHERE {where} status = 'enqueued' ORDER BY seq LIMIT 1 "
         "FOR UPDATE SKIP LOCKED) UPDATE items i SET status = 'running', owner = %(owner)s FROM picked "
         "WHERE {where2} i.id = picked.id RETURNING i.id")


def test_a_claim_routed_to_a_bucket_skips_locked_rows_and_an_unrouted_one_is_refused(
        citus_url: str, scratch: tuple[psycopg.Connection[Any], str]) -> None:
    conn, name = scratch
    conn.execute("INSERT INTO items (bucket, id, status) VALUES (1, 'a', 'enqueued'), (1, 'b', 'enqueued')")
    routed = CLAIM.format(where="bucket = %(b)s AND", where2="i.bucket = %(b)s AND")
    with psycopg.connect(citus_url) as other:  # holds the first claim's row lock until the end of the test
        other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        assert other.execute(routed, {"b": 1, "owner": "w1"}).fetchall() == [("a",)]
        assert conn.execute(routed, {"b": 1, "owner": "w2"}).fetchall() == [("b",)]  # skipped the locked row
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="FOR UPDATE/SHARE"):
        conn.execute(CLAIM.format(where="", where2=""), {"owner": "w3"})


def test_a_notify_reaches_only_the_node_whose_session_sent_it(
        citus_url: str, scratch: tuple[psycopg.Connection[Any], str]) -> None:
    """A trigger on a shard notifies on the worker node holding it; a coordinator session notifies the
    coordinator, also from a transaction that wrote to two worker nodes (two-phase commit)."""
    conn, name = scratch
    channel = f"{name}_work"
    first, second = buckets_on_two_nodes(conn)
    conn.execute("SET citus.enable_unsafe_triggers = on")
    conn.execute(sql.SQL("CREATE FUNCTION {}.notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "PERFORM pg_notify({}, NEW.id); RETURN NULL; END $$").format(
                             sql.Identifier(name), sql.Literal(channel)))
    conn.execute("CREATE TRIGGER items_notify AFTER INSERT ON items FOR EACH ROW EXECUTE FUNCTION notify_insert()")
    workers = conn.execute("SELECT nodename, nodeport FROM pg_dist_node "
                           "WHERE shouldhaveshards AND noderole = 'primary'").fetchall()
    listeners = {port: psycopg.connect(make_conninfo(citus_url, host=host, port=port), autocommit=True)
                 for host, port in workers}
    listeners[0] = psycopg.connect(citus_url, autocommit=True)  # 0: the coordinator
    try:
        for listener in listeners.values():
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        conn.execute("INSERT INTO items (bucket, id, status) VALUES (%s, 'from-a-shard', 'enqueued')", (first,))
        conn.execute("DROP TRIGGER items_notify ON items")
        with conn.transaction():
            conn.execute("SELECT pg_notify(%s, 'from-the-coordinator')", (channel,))
            conn.execute("INSERT INTO items (bucket, id, status) VALUES (%s, 'x', 'enqueued')", (first,))
            conn.execute("INSERT INTO items (bucket, id, status) VALUES (%s, 'y', 'enqueued')", (second,))
        shard_node = node_of(conn, first)
        for port, payload in ((0, "from-the-coordinator"), (shard_node, "from-a-shard")):
            assert [n.payload for n in listeners[port].notifies(timeout=WAIT, stop_after=1)] == [payload], port
        # Both were delivered by now; nothing else arrives anywhere (the other worker node included).
        assert {port: [n.payload for n in listener.notifies(timeout=0.5)] for port, listener in listeners.items()} \
            == {port: [] for port in listeners}
    finally:
        for listener in listeners.values():
            listener.close()


def test_a_session_setting_is_not_seen_by_a_routed_query(scratch: tuple[psycopg.Connection[Any], str]) -> None:
    """The query runs on the worker node, in Citus's session there: durable time (pgdurable.fake_now, the test
    clock) must be read on the coordinator and passed in."""
    conn, _ = scratch
    conn.execute("INSERT INTO items (bucket, id, status) VALUES (1, 'a', 'enqueued')")
    conn.execute("SET pgdurable.fake_now = '2030-01-01 00:00+00'")
    assert conn.execute("SELECT current_setting('pgdurable.fake_now', true)").fetchone() == ("2030-01-01 00:00+00",)
    assert conn.execute("SELECT current_setting('pgdurable.fake_now', true) FROM items "
                        "WHERE bucket = 1 AND id = 'a'").fetchone() == (None,)


def test_one_bucket_value_per_shard_can_be_chosen(scratch: tuple[psycopg.Connection[Any], str]) -> None:
    """Consecutive bucket values do not cover the shards; the smallest value Citus places on each shard does."""
    conn, _ = scratch
    rows = conn.execute(
        "SELECT shardid, min(g)::smallint FROM generate_series(0, 32767) g, "
        "LATERAL get_shard_id_for_distribution_column('items', g::smallint) AS shardid GROUP BY shardid").fetchall()
    values = [value for _, value in rows]
    assert len(rows) == SHARDS and len(set(values)) == SHARDS
    placed = {shard for (shard,) in conn.execute(
        "SELECT get_shard_id_for_distribution_column('items', v) FROM unnest(%s::smallint[]) v", (values,))}
    assert placed == {shard for shard, _ in rows}


def test_generic_plans_of_an_insert_select_with_parameters_are_refused(
        scratch: tuple[psycopg.Connection[Any], str]) -> None:
    """Why no function forces generic plans on Citus (the same statement works with custom plans)."""
    conn, _ = scratch
    insert = ("INSERT INTO items (bucket, id, status) SELECT (r ->> 'bucket')::smallint, r ->> 'id', 'enqueued' "
              "FROM jsonb_array_elements(%s::jsonb) r")
    conn.execute(insert, ('[{"bucket": 1, "id": "custom"}]',), prepare=True)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="could not create distributed plan"):
        conn.execute(insert + " ON CONFLICT DO NOTHING", ('[{"bucket": 1, "id": "generic"}]',), prepare=True)
    assert conn.execute("SELECT id FROM items").fetchall() == [("custom",)]
