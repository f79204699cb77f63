"""The cost of a table binding on the writes of the bound table: the insert rate of one table with no
binding, with a binding whose WHEN clause never holds, with a binding that enqueues a workflow for every
row, and, for comparison, with no binding but the same enqueue done by hand (enqueue_workflow in the same
statement), in interleaved rounds (so that a busy machine's slow moments fall on all of them alike).

Two kinds of writes, each per round and per variant:

  single  --rows single-row INSERTs, each its own transaction (autocommit), from one Python connection
  bulk    one INSERT ... SELECT generate_series(1, --bulk) (the per-row trigger cost, without round trips)

No worker runs: this measures the writer's side only (the trigger, the execution's insert, NOTIFY).

Usage, from the repository root:
    .venv/bin/python bench/bindings.py [--rounds 3] [--rows 2000] [--bulk 20000] [--url URL]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench; created if missing)

The run's schemas are dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

import pgdurable
from pgdurable.migrations import migrate

VARIANTS = ("unbound", "bound, never matching", "bound, every row", "unbound + enqueue_workflow")


def _setup(url: str, engine: str, shop: str) -> None:
    migrate(url, engine)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(shop)))
        for table in ("plain", "never", "every", "manual"):
            conn.execute(sql.SQL("CREATE TABLE {}.{} (id bigint PRIMARY KEY, status text NOT NULL, "
                                 "amount numeric NOT NULL, note text)").format(sql.Identifier(shop),
                                                                               sql.Identifier(table)))
    with pgdurable.App(url, schema=engine) as app:
        app.bind_table(f"{shop}.never", "bench_never", when="NEW.status = 'never'", name="never")
        app.bind_table(f"{shop}.every", "bench_every", name="every")


def _manual(engine: str, table: sql.Composable, rows: sql.Composable) -> sql.Composable:
    """An insert that enqueues by hand, one enqueue_workflow per row, in the same statement."""
    return sql.SQL("WITH o AS (INSERT INTO {} (id, status, amount, note) {} RETURNING *) "
                   "SELECT count({}.enqueue_workflow('bench_manual', jsonb_build_object('id', o.id, 'status', "
                   "o.status, 'amount', o.amount, 'note', o.note))) FROM o").format(table, rows, sql.Identifier(engine))


def _single(conn: psycopg.Connection[Any], table: sql.Composable, start: int, rows: int,
            manual: str | None = None) -> float:
    statement: sql.Composable = sql.SQL(
        "INSERT INTO {} (id, status, amount, note) VALUES (%s, 'paid', 12.5, 'x')").format(table)
    if manual:
        statement = _manual(manual, table, sql.SQL("VALUES (%s, 'paid', 12.5, 'x')"))
    began = time.perf_counter()
    for i in range(start, start + rows):
        conn.execute(statement, (i,))
    return rows / (time.perf_counter() - began)


def _bulk(conn: psycopg.Connection[Any], table: sql.Composable, start: int, rows: int,
          manual: str | None = None) -> float:
    statement: sql.Composable = sql.SQL("INSERT INTO {} (id, status, amount, note) SELECT i, 'paid', 12.5, 'x' "
                                        "FROM generate_series(%s::bigint, %s::bigint) i").format(table)
    if manual:
        statement = _manual(manual, table, sql.SQL("SELECT i, 'paid', 12.5, 'x' "
                                                   "FROM generate_series(%s::bigint, %s::bigint) i"))
    began = time.perf_counter()
    conn.execute(statement, (start, start + rows - 1))
    return rows / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--bulk", type=int, default=20000)
    parser.add_argument("--url", default=os.environ.get("PGDURABLE_BENCH_URL",
                                                        "postgresql://postgres@127.0.0.1:5432/pgdurable_bench"))
    args = parser.parse_args()
    tag = secrets.token_hex(4)
    engine, shop = f"bench_bind_{tag}", f"bench_bind_{tag}_app"
    _setup(args.url, engine, shop)
    tables = dict(zip(VARIANTS, (sql.Identifier(shop, t) for t in ("plain", "never", "every", "manual")),
                      strict=True))
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        with psycopg.connect(args.url, autocommit=True) as conn:
            next_id = 1
            for _ in range(args.rounds):
                for variant, table in tables.items():
                    for kind, run, rows in (("single", _single, args.rows), ("bulk", _bulk, args.bulk)):
                        manual = engine if variant == VARIANTS[3] else None
                        rates.setdefault((kind, variant), []).append(run(conn, table, next_id, rows, manual))
                        next_id += rows
            enqueued = conn.execute(sql.SQL("SELECT count(*) FROM {}.workflow_executions").format(
                sql.Identifier(engine))).fetchone()
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            for name in (shop, engine):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    print(f"{args.rounds} interleaved rounds; executions enqueued (binding and by hand): "
          f"{enqueued[0] if enqueued else 0}")
    print(f"{'writes':8} {'variant':28} {'median rows/s':>14} {'min':>10} {'max':>10} {'vs unbound':>11}")
    for kind in ("single", "bulk"):
        base = statistics.median(rates[(kind, VARIANTS[0])])
        for variant in VARIANTS:
            got = rates[(kind, variant)]
            print(f"{kind:8} {variant:28} {statistics.median(got):14,.0f} {min(got):10,.0f} {max(got):10,.0f} "
                  f"{statistics.median(got) / base:10.0%}")


if __name__ == "__main__":
    main()
