"""Retention on a large history: deleting old finished executions in batches (what pgdurable's retention does
today) against dropping time partitions, on the same rows (docs/scale-out.md, "Retention on a large history").

In a fresh schema of the benchmark database (dropped at the end):

1. The engine's own tables (a pgdurable migrate) get H finished executions (default 1,000,000), created
   evenly over the D days (default 10) before today, with S step outputs each (default 2), inserted by
   INSERT ... SELECT.
2. A partitioned copy, built here and not by the engine: the same columns and indexes, partitioned by range of
   created_at, one partition a day (the primary key and unique indexes gain created_at, as PostgreSQL requires;
   the step outputs carry their execution's created_at to be partitioned the same way), filled from (1).
3. Batches: pgdurable's retention statements (sql/queries/retention.sql: cleanup_cutoff, cleanup_batch) delete
   every execution of the K oldest days (default 5: half the history) with its steps, B at a time (default 1,000,
   the CLI's batch; the worker's automatic retention deletes 500 per sweep). Then the VACUUM that makes the
   space reusable. Time, WAL written, sizes.
4. Partitions: the K oldest daily partitions of both tables detached (DETACH PARTITION ... CONCURRENTLY) and
   dropped. Time, WAL written, sizes.
5. What partitioning costs the hot path: a lookup by id alone (every status read, every fenced write) must
   probe one index per partition. p50 of L lookups (default 2,000) of random ids, on both layouts.

Usage, from the repository root:
    .venv/bin/python bench/retention_partitions.py [--history H] [--days D] [--steps S] [--older-than-days K]
        [--batch B] [--lookups L] [--url URL]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench)
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import DEFAULT_URL, connect, drop_schema, ensure_database
from pgdurable import App, retention, store

HISTORY = """
INSERT INTO workflow_executions (id, name, queue, status, input, output, attempt, available_at, created_at,
                                 updated_at, started_at, completed_at)
SELECT 'h-' || g, 'bench.history', 'default', 'succeeded', jsonb_build_object('i', g), to_jsonb(g), 1, t, t,
       t + interval '5 ms', t + interval '1 ms', t + interval '5 ms'
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT date_trunc('day', now()) - make_interval(days => %(days)s) * (1 - (g - 1)::float8 / %(n)s) AS t)
     AS at
"""

HISTORY_STEPS = """
INSERT INTO operation_outputs (execution_id, step_id, step_name, output, attempts, recorded_by_attempt,
                               started_at, completed_at)
SELECT e.id, s, 'bench.step', jsonb_build_object('value', s), 1, 1, e.started_at, e.completed_at
FROM workflow_executions e, generate_series(0, %(steps)s - 1) AS s
"""


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_since(conn: psycopg.Connection[Any], lsn: str) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", (lsn,)).fetchone()
    assert row is not None
    return int(row[0])


def size(conn: psycopg.Connection[Any], *tables: str) -> int:
    """Bytes of the tables with their indexes (a partitioned table: all its partitions)."""
    total = 0
    for table in tables:
        row = conn.execute("SELECT CASE WHEN relkind = 'p' THEN (SELECT coalesce(sum(pg_total_relation_size(relid)), "
                           "0) FROM pg_partition_tree(c.oid) WHERE isleaf) ELSE pg_total_relation_size(c.oid) END "
                           "FROM pg_class c WHERE c.oid = %s::regclass", (table,)).fetchone()
        assert row is not None
        total += int(row[0])
    return total


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def partitioned_index(definition: str, table: str, partitioned: str) -> str:
    """An index definition of the engine's table (pg_get_indexdef), made for its partitioned copy: another name
    and table, and created_at added to a unique index (a unique index of a partitioned table must hold the
    partition key)."""
    definition = re.sub(r"INDEX (\S+) ON (\S+?)\." + table + " ",
                        lambda m: f"INDEX p_{m.group(1)} ON {m.group(2)}.{partitioned} ", definition, count=1)
    if definition.startswith("CREATE UNIQUE"):
        definition = re.sub(r"USING (\w+) \(([^)]*)\)", r"USING \1 (\2, created_at)", definition, count=1)
    return definition


def build_partitions(conn: psycopg.Connection[Any]) -> None:
    """p_executions and p_steps: the engine's two tables, partitioned by day of created_at, filled from them."""
    conn.execute("CREATE TABLE p_executions (LIKE workflow_executions INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
                 "PARTITION BY RANGE (created_at)")
    conn.execute("ALTER TABLE p_executions ADD PRIMARY KEY (id, created_at)")
    conn.execute("CREATE TABLE p_steps (LIKE operation_outputs INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "
                 "created_at timestamptz NOT NULL) PARTITION BY RANGE (created_at)")
    conn.execute("ALTER TABLE p_steps ADD PRIMARY KEY (execution_id, step_id, created_at)")
    for (definition,) in conn.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'workflow_executions'::regclass "
            "AND NOT indisprimary").fetchall():
        conn.execute(partitioned_index(definition, "workflow_executions", "p_executions"))
    row = conn.execute("SELECT date_trunc('day', min(created_at)), date_trunc('day', max(created_at)) "
                       "FROM workflow_executions").fetchone()
    assert row is not None
    first, last = row
    day = first
    while day <= last:
        suffix = day.strftime("%Y%m%d")
        for parent in ("p_executions", "p_steps"):
            conn.execute(sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(f"{parent}_{suffix}"), sql.Identifier(parent), sql.Literal(day),
                sql.Literal(day + datetime.timedelta(days=1))))
        day = day + datetime.timedelta(days=1)
    conn.execute("INSERT INTO p_executions SELECT * FROM workflow_executions")
    conn.execute("INSERT INTO p_steps SELECT o.*, e.created_at FROM operation_outputs o "
                 "JOIN workflow_executions e ON e.id = o.execution_id")
    conn.execute("VACUUM ANALYZE p_executions")
    conn.execute("VACUUM ANALYZE p_steps")


def lookups(conn: psycopg.Connection[Any], table: str, ids: list[str]) -> float:
    """p50 ms of a lookup by id alone (prepared, as the engine's statements are)."""
    statement = sql.SQL("SELECT status, attempt FROM {} WHERE id = %s").format(sql.Identifier(table))
    took = []
    for wid in ids:
        t = time.perf_counter()
        conn.execute(statement, (wid,), prepare=True).fetchone()
        took.append(time.perf_counter() - t)
    return statistics.median(took[10:]) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, default=1_000_000, help="finished executions (default 1,000,000)")
    parser.add_argument("--days", type=int, default=10, help="days they were created over (default 10)")
    parser.add_argument("--steps", type=int, default=2, help="step outputs each (default 2)")
    parser.add_argument("--older-than-days", type=int, default=5,
                        help="retention removes the executions of this many oldest days (default 5)")
    parser.add_argument("--batch", type=int, default=retention.DEFAULT_BATCH_SIZE,
                        help=f"executions per batch (default {retention.DEFAULT_BATCH_SIZE})")
    parser.add_argument("--lookups", type=int, default=2000, help="lookups by id timed (default 2000)")
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    if not 0 < args.older_than_days < args.days:
        parser.error("--older-than-days must be between 0 and --days")

    schema = f"retention_{secrets.token_hex(4)}"
    ensure_database(args.url)
    app = App(args.url, schema=schema)
    app.migrate()
    app.close()
    rows: list[tuple[str, str, str, str, str, str]] = []
    try:
        with connect(args.url, schema) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            print(f"retention: {args.url} (PostgreSQL {version[0] if version else '?'}), schema {schema}", flush=True)
            t = time.perf_counter()
            conn.execute(HISTORY, {"n": args.history, "days": args.days})
            conn.execute(HISTORY_STEPS, {"steps": args.steps})
            conn.execute("VACUUM ANALYZE workflow_executions")
            conn.execute("VACUUM ANALYZE operation_outputs")
            print(f"  history: {args.history:,} executions over {args.days} days, {args.steps} steps each, in "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
            t = time.perf_counter()
            build_partitions(conn)
            print(f"  partitioned copy built in {time.perf_counter() - t:.0f} s", flush=True)
            ids = [f"h-{random.randint(1, args.history)}" for _ in range(args.lookups)]
            lookup_plain = lookups(conn, "workflow_executions", ids)
            lookup_parts = lookups(conn, "p_executions", ids)
            partitions = conn.execute("SELECT count(*) FROM pg_partition_tree('p_executions') WHERE isleaf"
                                      ).fetchone()
            n_partitions = int(partitions[0]) if partitions else 0
            print(f"  lookup by id: {lookup_plain:.3f} ms (one table), {lookup_parts:.3f} ms "
                  f"({n_partitions} partitions)", flush=True)

            # 3. Batches, with pgdurable's own statements.
            before = size(conn, "workflow_executions", "operation_outputs")
            # The cutoff at the end of the K oldest days, as an age (what retention is given), so that both ways
            # remove the same executions.
            age = conn.execute("SELECT extract(epoch FROM clock_now() - (date_trunc('day', now()) "
                               "- make_interval(days => %s)))::float8", (args.days - args.older_than_days,)).fetchone()
            assert age is not None
            cutoff = store.run(conn, retention.cutoff(float(age[0])))
            statuses = sorted(store.executions.TERMINAL)
            lsn = wal_lsn(conn)
            deleted = steps = batches = 0
            slowest = 0.0
            t = time.perf_counter()
            while True:
                b = time.perf_counter()
                got = store.run(conn, retention.batch(cutoff, statuses, args.batch))
                slowest = max(slowest, time.perf_counter() - b)
                if not got.executions:
                    break
                deleted += got.executions
                steps += got.steps
                batches += 1
            took = time.perf_counter() - t
            wal = wal_since(conn, lsn)
            after = size(conn, "workflow_executions", "operation_outputs")
            t = time.perf_counter()
            conn.execute("VACUUM workflow_executions")
            conn.execute("VACUUM operation_outputs")
            vacuum = time.perf_counter() - t
            wal_vacuum = wal_since(conn, lsn) - wal
            print(f"  batches: {deleted:,} executions and {steps:,} steps in {batches} batches of {args.batch}, "
                  f"{took:.1f} s ({deleted / took:,.0f} executions/s, slowest batch {slowest * 1e3:.0f} ms), "
                  f"WAL {mb(wal)}; VACUUM {vacuum:.1f} s, WAL {mb(wal_vacuum)}; size {mb(before)} -> {mb(after)}",
                  flush=True)
            rows.append(("batched DELETE (retention.sql, batches of " f"{args.batch:,})", f"{deleted:,}",
                         f"{took:.1f} s + VACUUM {vacuum:.1f} s", f"{mb(wal)} + {mb(wal_vacuum)}",
                         f"{mb(before)} -> {mb(after)} (space reusable after VACUUM, not returned)",
                         f"{lookup_plain:.3f} ms"))

            # 4. Partitions: the old days detached and dropped.
            before = size(conn, "p_executions", "p_steps")
            old = [str(r[0]) for r in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'p_executions'::regclass ORDER BY c.relname LIMIT %s",
                (args.older_than_days,)).fetchall()]
            gone = conn.execute(sql.SQL("SELECT count(*) FROM ({}) AS old").format(sql.SQL(" UNION ALL ").join(
                sql.SQL("SELECT 1 FROM {}").format(sql.Identifier(name)) for name in old))).fetchone()
            lsn = wal_lsn(conn)
            t = time.perf_counter()
            for name in old:
                for parent, child in (("p_executions", name), ("p_steps", name.replace("p_executions", "p_steps"))):
                    conn.execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(
                        sql.Identifier(parent), sql.Identifier(child)))
                    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(child)))
            dropped = time.perf_counter() - t
            wal = wal_since(conn, lsn)
            after = size(conn, "p_executions", "p_steps")
            removed = int(gone[0]) if gone else 0
            print(f"  partitions: {len(old)} days ({removed:,} executions) detached and dropped in {dropped:.2f} s, "
                  f"WAL {wal / 1e3:,.0f} kB; size {mb(before)} -> {mb(after)}", flush=True)
            rows.append((f"DETACH CONCURRENTLY + DROP of {len(old)} daily partitions", f"{removed:,}",
                         f"{dropped:.2f} s", f"{wal / 1e3:,.0f} kB", f"{mb(before)} -> {mb(after)} (returned)",
                         f"{lookup_parts:.3f} ms ({n_partitions} partitions)"))
    finally:
        drop_schema(args.url, schema)

    print()
    print("| retention | executions removed | time | WAL | size, tables and indexes | lookup by id, p50 |")
    print("|---|---:|---:|---:|---|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
