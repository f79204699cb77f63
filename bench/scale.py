"""pgdurable scaling benchmark: more worker processes, more concurrency, and a table full of history.

  W  queued three-step workflows/s with 1, 2 and 4 worker processes serving the same queue (concurrency C
     each). The workers are started first and left idle until all have registered; then the backlog of N
     workflows is enqueued with ONE app.enqueue_many call, which is one transaction, so every worker sees
     the whole backlog at the same instant (no worker gets a head start while the others boot). Measured
     from the first claim to the last completion (database timestamps).
  K  the same with one worker at concurrency 10, 100 and 1000. Sync workflows run in a thread each, so
     above --max-threads (default 256) the async flavour is used; the table says which kind each row ran.
  H  claim cost with H (default 1,000,000) finished executions in the table vs an empty table: the same
     backlog of step-less jobs is claimed (a) by direct claim statements (the worker's own SQL, LIMIT
     --claim-limit) timed from here, (b) under EXPLAIN ANALYZE, rolled back (server time only), and (c)
     drained by one worker process; printed as full/empty ratios (issue #13's target: within 1.1x), with
     the WAL each claim statement wrote. The empty table is a second schema, and the cases take turns for
     --rounds rounds (medians printed), so that a machine's drift over the run (several minutes, often
     tens of percent here) weighs on every case alike. The history is written as the engine writes it (--history-layout
     lived): --history-batch executions at a time enqueued, claimed, given --history-steps checkpoints and
     completed by the engine's own statements, so each page keeps the free space real executions leave;
     then VACUUM ANALYZE. Each measurement starts after a CHECKPOINT. --history-layout bulk inserts the
     finished rows in one INSERT ... SELECT instead: a layout the engine never writes, where every page's
     tail has room for one new row, so new executions scatter one per page (kept to show that effect).
     The lived history and the jobs carry the ids the engine chooses (--ids engine: time-ordered UUIDv7s,
     pgdurable.ids); --ids random gives them UUIDv4s, the engine's ids before migration 23, whose primary-key
     entries land on random pages of the history; --ids engine,random builds one history of each, in a
     schema each, and measures them in the same rounds.

Each row starts from empty tables (TRUNCATE) except for the history of H. A fresh schema per run, dropped
at the end, in the benchmark database (created if missing).

Usage, from the repository root:
    .venv/bin/python bench/scale.py [-n N] [-c C] [--workers 1,2,4] [--concurrencies 10,100,1000]
        [--kind sync|async] [--parts WKH] [--history H] [--ids engine,random] [--rounds R] [--claim-jobs J] [--url URL]
        [--results FILE]
    env: PGDURABLE_BENCH_URL (default postgresql://postgres@127.0.0.1:5432/pgdurable_bench)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable, as the workers do
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import (
    JOBS_QUEUE,
    WORK_QUEUE,
    Bench,
    CpuMeter,
    Pending,
    Results,
    WorkerProcess,
    add_common_arguments,
    build,
    connect,
    drain_span,
    drop_schema,
    enqueue_chunks,
    execute,
    pct,
    setup,
    step_count,
)
from pgdurable import store
from pgdurable.ids import new_execution_id
from pgdurable.sqlfiles import query as named_query

RESET = "TRUNCATE workflow_executions, operation_outputs, workers"


def make_ids(kind: str, n: int) -> list[str]:
    """n execution ids of a kind of --ids: the engine's own (UUIDv7) or random UUIDv4s."""
    if kind == "random":
        return [str(uuid.uuid4()) for _ in range(n)]
    return [new_execution_id() for _ in range(n)]


def drain_span_of(url: str, schema: str, ids: Sequence[str]) -> tuple[float, int, int]:
    """(seconds from the first claim to the last completion, executions succeeded, executions in all) of
    these executions, from the database's own timestamps."""
    with connect(url, schema) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM min(started_at))::float8, extract(epoch FROM max(completed_at))::float8,"
            "       count(*) FILTER (WHERE status = 'succeeded'), count(*)"
            " FROM workflow_executions WHERE id = ANY (%s)", (list(ids),)).fetchone()
    assert row is not None
    return float(row[1] - row[0]), int(row[2]), int(row[3])


def delete_executions(url: str, schema: str, ids: Sequence[str]) -> None:
    with connect(url, schema) as conn:
        conn.execute("DELETE FROM workflow_executions WHERE id = ANY (%s)", (list(ids),))
        conn.execute("VACUUM ANALYZE workflow_executions")


def drain_row(bench: Bench, args: argparse.Namespace, workers: int, concurrency: int, kind: str,
              prefix: str) -> tuple[float, float]:
    """Start ``workers`` idle workers, enqueue the backlog in one transaction, wait for the drain.
    Returns (workflows/s, steps/s) from the first claim to the last completion."""
    n = args.n
    execute(args.url, args.schema, RESET)
    flow = bench.flows[kind]["three"]
    items = [(i, 0.0) for i in range(n)]
    ids = [f"{prefix}-{i}" for i in range(n)]
    pending = Pending(args.url, args.schema)
    procs = [WorkerProcess(args.url, args.schema, WORK_QUEUE, concurrency) for _ in range(workers)]
    try:
        pending.wait_workers(workers, procs)
        time.sleep(0.5)  # past registration: listening, and idle in the claim loop
        meter = CpuMeter([p.pid for p in procs])
        t0 = time.time()
        bench.app.enqueue_many(flow, items, workflow_ids=ids)  # one transaction: visible all at once
        t1 = pending.wait_empty(WORK_QUEUE, procs)
        cpu = meter.line(f"{prefix} (from the enqueue)", t1 - t0)
    finally:
        for proc in procs:
            proc.stop()
        pending.close()
    drain, done, total = drain_span(args.url, args.schema, f"{prefix}-%")
    steps = step_count(args.url, args.schema, f"{prefix}-%")
    assert done == total == n and steps == 3 * n, f"{prefix}: {done} of {n} succeeded, {steps} steps"
    print(f"pgdurable scale workers={workers} C={concurrency} kind={kind} N={n}: {n / drain:.0f} workflows/s "
          f"({steps / drain:.0f} steps/s), first claim -> last completion {drain:.2f} s", flush=True)
    print(cpu, flush=True)
    return n / drain, steps / drain


def part_workers(bench: Bench, args: argparse.Namespace, results: Results) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for workers in args.workers:
        wf, st = drain_row(bench, args, workers, args.concurrency, args.kind, f"w{workers}")
        results[f"scale.workers.{workers}.wf_per_s"] = wf
        results[f"scale.workers.{workers}.steps_per_s"] = st
        results[f"scale.workers.{workers}.concurrency"] = args.concurrency
        results[f"scale.workers.{workers}.kind"] = args.kind
        rows.append((f"{workers} worker{'s' if workers > 1 else ''} x C={args.concurrency}", args.kind,
                     f"{wf:.0f}", f"{st:.0f}"))
    return rows


def part_concurrency(bench: Bench, args: argparse.Namespace, results: Results) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for concurrency in args.concurrencies:
        kind = "async" if concurrency > args.max_threads else args.kind
        wf, st = drain_row(bench, args, 1, concurrency, kind, f"c{concurrency}")
        results[f"scale.concurrency.{concurrency}.wf_per_s"] = wf
        results[f"scale.concurrency.{concurrency}.steps_per_s"] = st
        results[f"scale.concurrency.{concurrency}.kind"] = kind
        rows.append((f"1 worker x C={concurrency}", kind, f"{wf:.0f}", f"{st:.0f}"))
    return rows


# ---- claim cost ---------------------------------------------------------------------------------------------

HISTORY_SQL = """
INSERT INTO workflow_executions (id, name, queue, status, input, output, attempt, available_at, created_at,
                                 updated_at, started_at, completed_at)
SELECT 'hist-' || g, %(name)s, %(queue)s, 'succeeded', jsonb_build_object('i', g), to_jsonb(g), 1, t, t,
       t + interval '5 ms', t + interval '1 ms', t + interval '5 ms'
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT now() - make_interval(secs => (%(n)s - g) * 0.01) - interval '1 hour' AS t) AS at
"""

HISTORY_STEPS_SQL = """
INSERT INTO operation_outputs (execution_id, step_id, step_name, output, attempts, recorded_by_attempt,
                               started_at, completed_at)
SELECT 'hist-' || g, s, 'add_one', to_jsonb(g + s + 1), 1, 1, now() - interval '1 hour',
       now() - interval '1 hour'
FROM generate_series(1, %(n)s) AS g, generate_series(0, %(steps)s - 1) AS s
"""


@dataclass
class Case:
    """One table measured in part H: its schema, the App on it, and the kind of ids its jobs get."""
    label: str
    schema: str
    bench: Bench
    ids: str


def insert_history(args: argparse.Namespace, case: Case) -> None:
    n, steps, schema = args.history, args.history_steps, case.schema
    name = {0: "job", 1: "job_one_step"}.get(steps, "many_steps")
    t = time.perf_counter()
    with connect(args.url, schema) as conn:
        if args.history_layout == "bulk":
            conn.execute(HISTORY_SQL, {"n": n, "name": name, "queue": JOBS_QUEUE})
            if steps:
                conn.execute(HISTORY_STEPS_SQL, {"n": n, "steps": steps})
        else:
            lived_history(conn, case, args, name)
    inserted = time.perf_counter() - t
    execute(args.url, schema, "VACUUM ANALYZE workflow_executions", "VACUUM ANALYZE operation_outputs")
    with connect(args.url, schema) as conn:
        row = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('workflow_executions')),"
                           "       pg_size_pretty(pg_total_relation_size('operation_outputs'))").fetchone()
    assert row is not None
    ids = "" if args.history_layout == "bulk" else f", {case.ids} ids"
    print(f"pgdurable   H history ({args.history_layout}{ids}): {n} finished executions ({name}, {steps} step rows "
          f"each) written in {inserted:.1f} s, vacuumed in {time.perf_counter() - t - inserted:.1f} s; "
          f"workflow_executions {row[0]}, operation_outputs {row[1]} with indexes", flush=True)


def lived_history(conn: Any, case: Case, args: argparse.Namespace, name: str) -> None:
    """The history as the engine writes it, --history-batch executions at a time: enqueued by the insert
    every enqueue uses, claimed by the worker's claim, each step checkpointed and the execution completed by
    the worker's group-commit statements. Each row so has the versions (and, once vacuumed, the free space)
    a real execution leaves behind on its page. The completion trigger is off (session_replication_role):
    nobody listens, and it does not move rows.

    Vacuum runs when the table's own autovacuum settings (the schema's: 1000 dead rows + 1% of the table)
    would start it, whether or not autovacuum is on in this server (CI's configuration turns it off)."""
    conn.execute("SET session_replication_role = replica")
    app = case.bench.app
    names, batch = app.registry.names(), args.history_batch
    dead = 0
    for lo in range(0, args.history, batch):
        if dead > 1000 + 0.01 * lo:
            conn.execute("VACUUM ANALYZE workflow_executions")
            dead = 0
        dead += 2 * batch  # the claim's and the completion's old versions
        ids = make_ids(case.ids, min(lo + batch, args.history) - lo)
        rows = json.dumps([{"id": i, "input": {"i": g}} for g, i in enumerate(ids, lo)])
        store.run(conn, store.executions.enqueue_many(rows=rows, name=name, queue=JOBS_QUEUE, priority=0,
                                                      max_recoveries=5, delay=0.0))
        claimed = store.run(conn, store.claims.claim(queue=JOBS_QUEUE, names=names, owner="bench-history",
                                                     lease=3600.0, limit=len(ids), version=app.version))
        assert len(claimed) == len(ids), f"history: claimed {len(claimed)} of {len(ids)}"
        started = datetime.now(UTC).isoformat()
        for step in range(args.history_steps):
            store.run(conn, store.checkpoints.write_steps(json.dumps(
                [[c.id, c.attempt, step, "add_one", 1, started, step + 1, None] for c in claimed])))
        store.run(conn, store.checkpoints.write_completions(json.dumps(
            [[c.id, c.attempt, "succeeded", c.attempt, None] for c in claimed])))


def claim_figures(case: Case, args: argparse.Namespace) -> dict[str, float]:
    """The three claim measurements on whatever history the case's table holds now."""
    app, flow, j = case.bench.app, case.bench.flows["sync"]["job"], args.claim_jobs
    url, schema, label = args.url, case.schema, case.label
    names = app.registry.names()
    params = {"queue": JOBS_QUEUE, "names": names, "owner": "bench-claim", "lease": 3600.0,
              "limit": args.claim_limit, "version": app.version, "adopt": app.settings.adopt_after_seconds,
              "arm": False}
    # (a) and (b): a backlog claimed from here by the worker's own claim statement.
    claim_ids = make_ids(case.ids, j)
    enqueue_chunks(app, flow, [(i,) for i in range(j)], claim_ids, 10_000)
    # A checkpoint first: right after the history's gigabytes were written, the checkpointer is still
    # flushing them, and every commit measured would wait behind its writes.
    execute(url, schema, "VACUUM ANALYZE workflow_executions", "CHECKPOINT")
    server_ms, planning_ms, buffers = [], [], 0
    with connect(url, schema) as conn:
        for attempt in range(args.explains + 1):
            with conn.transaction(force_rollback=True):
                row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + named_query("claim"),
                                   params).fetchone()
            assert row is not None
            if attempt == 0:
                continue  # warm-up: a new backend loads its catalog caches
            plan: dict[str, Any] = row[0][0]
            server_ms.append(float(plan["Planning Time"]) + float(plan["Execution Time"]))
            planning_ms.append(float(plan["Planning Time"]))
            top = plan["Plan"]
            buffers = int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
    execute(url, schema, "VACUUM workflow_executions")  # the rolled-back claims' dead versions
    statement_s = []
    claimed = 0
    claim = store.claims.claim(queue=JOBS_QUEUE, names=names, owner="bench-claim", lease=3600.0, limit=args.claim_limit,
                               version=app.version, adopt=app.settings.adopt_after_seconds)
    with connect(url, schema) as conn:
        wal_before = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        while True:
            t = time.perf_counter()
            got = store.run(conn, claim)
            statement_s.append(time.perf_counter() - t)
            if not got:
                break
            claimed += len(got)
        wal_bytes = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn",
                                 (str(wal_before),)).fetchone()[0]
    assert claimed == j, f"{label}: claimed {claimed} of {j}"
    statement_s.pop()  # the last, empty claim
    delete_executions(url, schema, claim_ids)
    # (c): the same backlog drained by a worker process.
    drain_ids = make_ids(case.ids, j)
    enqueue_chunks(app, flow, [(i,) for i in range(j)], drain_ids, 10_000)
    execute(url, schema, "ANALYZE workflow_executions", "CHECKPOINT")
    pending = Pending(url, schema)
    worker = WorkerProcess(url, schema, JOBS_QUEUE, args.concurrency)
    try:
        pending.wait_empty(JOBS_QUEUE, [worker])
    finally:
        worker.stop()
        pending.close()
    drain, done, total = drain_span_of(url, schema, drain_ids)
    assert done == total == j, f"{label}: drained {done} of {j}"
    delete_executions(url, schema, drain_ids)
    statement_s.sort()
    server_ms.sort()
    figures = {"claim_ms": statistics.fmean(statement_s) * 1e3, "claim_p50_ms": pct(statement_s, .5) * 1e3,
               "server_ms": statistics.median(server_ms), "planning_ms": statistics.median(planning_ms),
               "buffers": float(buffers), "drain_per_s": j / drain,
               "wal_per_claim": float(wal_bytes) / len(statement_s)}
    print(f"pgdurable claim cost, {label}: {len(statement_s)} claim statements of LIMIT {args.claim_limit} "
          f"took {figures['claim_ms']:.3f} ms each (p50 {figures['claim_p50_ms']:.3f} ms, "
          f"{j / sum(statement_s):.0f} rows/s); server time (EXPLAIN ANALYZE, median of {args.explains}) "
          f"{figures['server_ms']:.3f} ms (planning {figures['planning_ms']:.3f} ms), {buffers} buffers; "
          f"{figures['wal_per_claim']:.0f} WAL bytes per claim statement; "
          f"one worker C={args.concurrency} drains {j} jobs at {figures['drain_per_s']:.0f} jobs/s", flush=True)
    return figures


def part_history(bench: Bench, args: argparse.Namespace, results: Results) -> list[tuple[str, ...]]:
    """The empty table and one history per kind of ids, measured in turns; medians over the rounds. The
    table's rows, its header row first."""
    execute(args.url, args.schema, RESET)
    cases = [Case("empty table", f"{args.schema}_empty", twin(args, f"{args.schema}_empty"), args.ids[0])]
    for i, kind in enumerate(args.ids):
        schema = args.schema if i == 0 else f"{args.schema}_{kind}"
        case = Case(f"{args.history} finished, {kind} ids", schema, bench if i == 0 else twin(args, schema), kind)
        insert_history(args, case)
        cases.append(case)
    runs: dict[str, list[dict[str, float]]] = {case.label: [] for case in cases}
    for r in range(args.rounds):
        for case in cases[r % len(cases):] + cases[:r % len(cases)]:  # each round starts with another case
            runs[case.label].append(claim_figures(case, args))
    median = {label: {key: statistics.median(run[key] for run in figures) for key in figures[0]}
              for label, figures in runs.items()}
    empty = median[cases[0].label]
    rows = [("claim statement (ms)", "claim_ms", ".3f"), ("claim server time (ms)", "server_ms", ".3f"),
            ("drain of the jobs (jobs/s)", "drain_per_s", ".0f"),
            ("WAL per claim statement (bytes)", "wal_per_claim", ".0f")]
    table_rows = [[title, format(empty[key], spec)] for title, key, spec in rows]
    for case in cases[1:]:
        full = median[case.label]
        ratio = {"claim_ms": full["claim_ms"] / empty["claim_ms"], "server_ms": full["server_ms"] / empty["server_ms"],
                 "drain": empty["drain_per_s"] / full["drain_per_s"]}
        verdict = "within" if max(ratio.values()) <= 1.1 else "NOT within"
        print(f"pgdurable claim cost ratio, {case.label} vs empty (medians of {args.rounds} rounds): claim statement "
              f"{ratio['claim_ms']:.2f}x, server time {ratio['server_ms']:.2f}x, drain time {ratio['drain']:.2f}x "
              f"({verdict} the 1.1x target), WAL per claim {full['wal_per_claim'] / empty['wal_per_claim']:.2f}x",
              flush=True)
        if case is cases[1]:
            for key, value in ratio.items():
                results[f"scale.claim_ratio.{key}"] = value
            results["scale.claim.history"] = args.history
            results["scale.claim.empty_claim_ms"] = empty["claim_ms"]
            results["scale.claim.full_claim_ms"] = full["claim_ms"]
            results["scale.claim.empty_drain_per_s"] = empty["drain_per_s"]
            results["scale.claim.full_drain_per_s"] = full["drain_per_s"]
        for row, (_, key, spec) in zip(table_rows, rows, strict=True):
            slower = empty[key] / full[key] if key == "drain_per_s" else full[key] / empty[key]
            row += [format(full[key], spec), f"{slower:.2f}x"]
    header = ("", "empty table", *(column for case in cases[1:] for column in (case.label, "ratio")))
    return [header, *(tuple(row) for row in table_rows)]


def twin(args: argparse.Namespace, schema: str) -> Bench:
    """Another schema of the benchmark database with the same App, migrated (dropped with the main one)."""
    args.twins.append(schema)
    made = build(args.url, schema)
    made.app.migrate()
    return made

def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def id_kinds(text: str) -> list[str]:
    kinds = text.split(",")
    if not kinds or any(kind not in ("engine", "random") for kind in kinds) or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError("--ids takes engine, random, or both separated by a comma")
    return kinds


def integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10_000,
                        help="three-step workflows per row of W and K (default 10000)")
    parser.add_argument("-c", "--concurrency", type=int, default=16,
                        help="concurrency of each worker in W and of the worker in H (default 16)")
    parser.add_argument("--workers", type=integers, default=[1, 2, 4],
                        help="worker process counts for W (default 1,2,4)")
    parser.add_argument("--concurrencies", type=integers, default=[10, 100, 1000],
                        help="concurrencies for K (default 10,100,1000)")
    parser.add_argument("--kind", choices=("sync", "async"), default="sync",
                        help="workflow flavour for W and K (default sync)")
    parser.add_argument("--max-threads", type=int, default=256,
                        help="in K, rows with a higher concurrency use async workflows (default 256)")
    parser.add_argument("--parts", default="WKH", help="which parts to run (default WKH)")
    parser.add_argument("--history", type=int, default=1_000_000,
                        help="finished executions in the table for H (default 1000000)")
    parser.add_argument("--history-steps", type=int, default=1,
                        help="operation_outputs rows per finished execution (default 1)")
    parser.add_argument("--history-layout", choices=("lived", "bulk"), default="lived",
                        help="lived (default): written batch by batch by the engine's own enqueue, claim, "
                             "checkpoint and completion statements; bulk: one INSERT of finished rows (a "
                             "layout the engine never writes: every page's tail fits a new row)")
    parser.add_argument("--history-batch", type=int, default=100,
                        help="executions per enqueue/claim/complete round of the lived history (default 100)")
    parser.add_argument("--ids", type=id_kinds, default=["engine"],
                        help="ids of H's lived history and jobs: engine (default; the engine's time-ordered "
                             "UUIDv7s), random (UUIDv4s, the engine's ids before migration 23), or both "
                             "(engine,random: a history of each, measured in the same rounds)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="H's rounds: each measures every case once, in turns (default 3)")
    parser.add_argument("--claim-jobs", type=int, default=20_000, help="backlog claimed in H (default 20000)")
    parser.add_argument("--claim-limit", type=int, default=16, help="LIMIT of the timed claims (default 16)")
    parser.add_argument("--explains", type=int, default=25,
                        help="EXPLAIN ANALYZE runs of the claim per case (default 25)")
    add_common_arguments(parser)
    args = parser.parse_args()
    args.parts = args.parts.upper()
    args.twins = []
    bench = setup(parser, args)
    results = Results(args.results)
    print(f"pgdurable   setup: {args.url} schema {args.schema}, python {sys.version.split()[0]}, "
          f"parts {args.parts}", flush=True)
    try:
        rows: list[tuple[str, ...]] = []
        if "W" in args.parts:
            rows += part_workers(bench, args, results)
        if "K" in args.parts:
            rows += part_concurrency(bench, args, results)
        history = part_history(bench, args, results) if "H" in args.parts else []
        results.save()
        if rows:
            print(f"\nqueued three-step workflows, backlog of {args.n} enqueued with one enqueue_many, drained:\n")
            print(table(("workers x concurrency", "kind", "workflows/s", "steps/s"), rows))
        if history:
            print(f"\nclaim cost, {args.claim_jobs} step-less jobs, medians of {args.rounds} rounds:\n")
            print(table(history[0], history[1:]))
    finally:
        bench.app.close()
        if not args.keep_schema:
            for schema in [args.schema, *args.twins]:
                drop_schema(args.url, schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
