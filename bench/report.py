"""One markdown table from the figures of a bench/run_all.sh run, with the anchors beside ours.

Reads the JSON that bench/throughput.py, bench/scale.py and bench/memory.py merge their headline figures
into (--results), and optionally the output of ../shared/anchors/run.sh (--anchors) and of pgbench
(--pgbench-c1, --pgbench-c32: a one-row INSERT per transaction from 1 and from 32 clients).

The last column is how many times better pgdurable does than the anchor: ours/anchor for rates,
anchor/ours for times, so > 1 always means pgdurable is ahead.

Usage: .venv/bin/python bench/report.py --results FILE [--anchors FILE] [--pgbench-c1 FILE]
           [--pgbench-c32 FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DBOS_QUEUE = re.compile(r"^dbos mode=(\w+) poll=([\d.]+) N=(\d+): enqueue (\d+)/s, (\d+) workflows/s "
                        r"\((\d+) steps/s\), enqueue->start p50 ([\d.]+) ms p99 ([\d.]+) ms")
DBOS_STEPS = re.compile(r"^dbos sequential steps: (\d+) in ([\d.]+) s = ([\d.]+) ms/step")
DBOS_ROUND_TRIP = re.compile(r"^dbos enqueue->result round trip: p50 ([\d.]+) ms, max ([\d.]+) ms")
PGQUEUER = re.compile(r"^pgqueuer N=(\d+) batch=(\d+): enqueue (\d+)/s, drain (\d+) jobs/s")
ABSURD = re.compile(r"^absurd mode=(\w+) conc=(\d+) poll=([\d.]+) N=(\d+): enqueue (\d+)/s, (\d+) workflows/s "
                    r"\((\d+) steps/s\), enqueue->start p50 ([\d.]+) ms p99 ([\d.]+) ms")
PROCRASTINATE = re.compile(r"^procrastinate mode=(\w+) conc=(\d+) N=(\d+): enqueue (\d+)/s, (\d+) jobs/s")
PGBENCH_LATENCY = re.compile(r"^latency average = ([\d.]+) ms", re.MULTILINE)
PGBENCH_TPS = re.compile(r"^tps = ([\d.]+)", re.MULTILINE)


@dataclass
class Anchors:
    """The anchor figures found in run.sh's output, by what they measure."""

    dbos_queue: list[dict[str, float]] = field(default_factory=list)  # one per queue run (poll 1.0, 0.05)
    dbos_direct: dict[str, float] | None = None
    dbos_ms_per_step: float | None = None
    dbos_round_trip_p50: float | None = None
    pgq: dict[str, float] | None = None
    absurd: list[dict[str, Any]] = field(default_factory=list)  # one per run.sh's Absurd run (sync, poll, async)
    procrastinate: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Anchors:
        found = cls()
        for line in text.splitlines():
            if m := DBOS_QUEUE.match(line):
                figures = {"poll": float(m[2]), "n": float(m[3]), "enqueue": float(m[4]), "wf": float(m[5]),
                           "steps": float(m[6]), "p50": float(m[7]), "p99": float(m[8])}
                if m[1] == "queue":
                    found.dbos_queue.append(figures)
                else:
                    found.dbos_direct = figures
            elif m := DBOS_STEPS.match(line):
                found.dbos_ms_per_step = float(m[3])
            elif m := DBOS_ROUND_TRIP.match(line):
                found.dbos_round_trip_p50 = float(m[1])
            elif m := PGQUEUER.match(line):
                found.pgq = {"n": float(m[1]), "batch": float(m[2]), "enqueue": float(m[3]), "drain": float(m[4])}
            elif m := ABSURD.match(line):
                found.absurd.append({"mode": m[1], "poll": float(m[3]), "n": float(m[4]), "enqueue": float(m[5]),
                                     "wf": float(m[6]), "p50": float(m[8])})
            elif m := PROCRASTINATE.match(line):
                found.procrastinate.append({"mode": m[1], "n": float(m[3]), "enqueue": float(m[4]),
                                            "jobs": float(m[5])})
        return found

    def best_absurd(self) -> dict[str, Any] | None:
        return max(self.absurd, key=lambda f: f["wf"]) if self.absurd else None

    def best_dbos_queue(self) -> dict[str, float] | None:
        return max(self.dbos_queue, key=lambda f: f["wf"]) if self.dbos_queue else None


def pgbench(path: str | None) -> tuple[float | None, float | None]:
    """(latency average in ms, tps) of a pgbench run's output."""
    if not path or not Path(path).exists():
        return None, None
    text = Path(path).read_text()
    latency, tps = PGBENCH_LATENCY.search(text), PGBENCH_TPS.search(text)
    return (float(latency[1]) if latency else None), (float(tps[1]) if tps else None)


def number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


class Table:
    HEADER = ("figure", "pgdurable", "target", "anchor (same machine, same run)", "x vs anchor (>1: pgdurable ahead)")

    def __init__(self) -> None:
        self.rows: list[tuple[str, ...]] = []

    def add(self, figure: str, ours: float | None, unit: str, *, target: str = "", met: bool | None = None,
            anchor_name: str = "", anchor: float | None = None, higher_is_better: bool = True) -> None:
        if ours is None:
            return
        mark = "" if met is None else (" ✓" if met else " ✗")
        ratio = "—"
        if anchor:
            ratio = f"{ours / anchor if higher_is_better else anchor / ours:.2f}x"
        anchor_text = f"{anchor_name}: {number(anchor, unit)}" if anchor is not None else (anchor_name or "—")
        self.rows.append((figure, number(ours, unit), (target + mark) if target else "—", anchor_text, ratio))

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.HEADER) + " |", "|" + "|".join(["---"] * len(self.HEADER)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def build(ours: dict[str, Any], anchors: Anchors | None, c1: tuple[float | None, float | None],
          c32: tuple[float | None, float | None]) -> Table:
    t = Table()
    get = ours.get
    dbos = anchors.best_dbos_queue() if anchors else None
    dbos_name = f"DBOS queue (poll {dbos['poll']:g} s, N={dbos['n']:.0f})" if dbos else ""

    # Queued three-step workflows through one worker (A), then its capacity on a backlog (F).
    n = get("A.n")
    t.add(f"A queued 3-step workflows/s, 1 worker C={get('A.concurrency')} {get('A.kind')}, enqueue from 1 thread "
          f"(N={n})", get("A.wf_per_s"), "wf/s", target="≥ 20x DBOS queued",
          met=_ge(get("A.wf_per_s"), 20 * dbos["wf"]) if dbos else None,
          anchor_name=dbos_name, anchor=dbos["wf"] if dbos else None)
    t.add("A steps/s (same run)", get("A.steps_per_s"), "steps/s", anchor_name=dbos_name,
          anchor=dbos["steps"] if dbos else None)
    t.add("A enqueue->start p50 (same run)", get("A.start_p50_ms"), "ms", anchor_name=dbos_name,
          anchor=dbos["p50"] if dbos else None, higher_is_better=False)
    t.add("A enqueue->start p99 (same run)", get("A.start_p99_ms"), "ms", anchor_name=dbos_name,
          anchor=dbos["p99"] if dbos else None, higher_is_better=False)
    t.add("A one-at-a-time app.enqueue rate (same run)", get("A.enqueue_per_s"), "/s", anchor_name=dbos_name,
          anchor=dbos["enqueue"] if dbos else None)
    for key in sorted(k for k in ours if re.fullmatch(r"A\d+\.wf_per_s", k)):
        k = key.split(".")[0][1:]
        t.add(f"A queued 3-step workflows/s, enqueue from {k} threads", ours[key], "wf/s",
              anchor_name=dbos_name, anchor=dbos["wf"] if dbos else None)
        t.add(f"A enqueue rate from {k} threads (same run)", get(f"A{k}.enqueue_per_s"), "/s")
    absurd = anchors.best_absurd() if anchors else None
    if absurd:
        t.add("A queued 3-step workflows/s, against Absurd's best run", get("A.wf_per_s"), "wf/s",
              target="≥ 5x Absurd", met=_ge(get("A.wf_per_s"), 5 * absurd["wf"]),
              anchor_name=f"Absurd 0.5 ({absurd['mode']} worker, poll {absurd['poll']:g} s, N={absurd['n']:.0f})",
              anchor=absurd["wf"])
        t.add("A one-at-a-time enqueue rate, against Absurd's spawn_task", get("A.enqueue_per_s"), "/s",
              anchor_name="Absurd 0.5 spawn_task", anchor=absurd["enqueue"])
    if anchors and anchors.procrastinate:
        runs = "; ".join(f"{f['mode']}: {f['jobs']:.0f} jobs/s, enqueue {f['enqueue']:.0f}/s"
                         for f in anchors.procrastinate)
        t.rows.append(("(procrastinate 3.10, step-less jobs, same run)", "", "", runs, ""))
    if anchors and len(anchors.dbos_queue) > 1:
        other = [f"poll {f['poll']:g} s: {f['wf']:.0f} wf/s, start p50 {f['p50']:.1f} ms"
                 for f in anchors.dbos_queue if f is not dbos]
        t.rows.append(("(other DBOS queue runs)", "", "", "; ".join(other), ""))
    if anchors and anchors.dbos_direct:
        d = anchors.dbos_direct
        t.rows.append(("(DBOS start_workflow, in-process, no queue)", "", "",
                       f"{d['wf']:.0f} wf/s, start p50 {d['p50']:.1f} ms", ""))
    t.add(f"F worker capacity: 3-step workflows/s on a backlog of {get('F.n')}, 1 worker C={get('F.concurrency')}, "
          "first claim -> last completion", get("F.wf_per_s"), "wf/s")
    t.add("F steps/s (same run)", get("F.steps_per_s"), "steps/s")

    # Sequential steps, against a single-client commit.
    c1_latency, c1_tps = c1
    ms_step = get("B.ms_per_step")
    target = f"≤ 1.6 x pgbench c1 = {1.6 * c1_latency:.2f} ms" if c1_latency else ""
    t.add(f"B sequential steps, ms/step (app.start, {get('B.steps')} steps)", ms_step, "ms", target=target,
          met=(ms_step <= 1.6 * c1_latency) if (ms_step and c1_latency) else None,
          anchor_name="DBOS" if anchors and anchors.dbos_ms_per_step else "",
          anchor=anchors.dbos_ms_per_step if anchors else None, higher_is_better=False)
    if ms_step and c1_latency:
        t.rows.append(("B ms/step ÷ pgbench single-client commit latency", f"{ms_step / c1_latency:.2f}x", "≤ 1.6x",
                       "—", "—"))
    t.add("pgbench -c 1: one-row INSERT commit latency", c1_latency, "ms", target="reference")
    t.add("pgbench -c 1: tps", c1_tps, "tps", target="reference")
    t.add("pgbench -c 32: tps", c32[1], "tps", target="reference")
    t.add("pgbench -c 32: latency average", c32[0], "ms", target="reference")

    # What an enqueue and a checkpoint cost, as ratios to a pgbench one-row commit of the same round (costs.py).
    if get("costs") is not None:
        costs = ours["costs"]
        floor = f"pgbench one-row INSERT commit, 1 client: {costs['floor_ms']:.3f} ms"
        if "driver_ms" in costs:  # since 2026-12-05
            t.rows.append(("cost: the same one-row INSERT commit from Python (psycopg, prepared), ms (÷ pgbench)",
                           f"{costs['driver_ms']:.3f} ms ({costs['driver_ratio']:.2f}x)", "reference", floor, "—"))
        for key, label, limit in (("enqueue", "app.enqueue, one at a time", 1.5),
                                  ("sql_enqueue", "SELECT enqueue_workflow(), 1 client", None),
                                  ("step", "sequential step checkpoint (app.start)", 1.3)):
            ratio = costs[f"{key}_ratio"]
            to_driver = costs.get(f"{key}_to_driver")
            driver = f"; {to_driver:.2f}x)" if to_driver else ")"
            t.rows.append((f"cost: {label}, ms (÷ pgbench commit of the same round"
                           + ("; ÷ the psycopg INSERT)" if to_driver else ")"),
                           f"{costs[f'{key}_ms']:.3f} ms ({ratio:.2f}x{driver}",
                           f"≤ {limit}x" + (" ✓" if ratio <= limit else " ✗") if limit else "—", floor, "—"))
        for clients, figures in costs["contention"].items():
            t.rows.append((f"cost: enqueue inside application transactions, {clients} clients, tps with the "
                           "engine's wake-ups ÷ with no worker", f"{figures['ratio']:.2f}x",
                           "≥ 0.95x" + (" ✓" if figures["ratio"] >= 0.95 else " ✗"),
                           f"{figures['with_tps']:.0f} vs {figures['without_tps']:.0f} tps", "—"))
            if "ratio_to_polling" in figures:
                t.rows.append((f"cost: the same, {clients} clients, ÷ beside a worker polling every 5 ms with no "
                               "bell (the wake-ups alone)", f"{figures['ratio_to_polling']:.2f}x", "—",
                               f"{figures['with_tps']:.0f} vs {figures['polling_tps']:.0f} tps", "—"))

    # Wake-ups beside a live worker, by enqueue rate (rings.py).
    def by_rate(run: str) -> tuple[float, int]:
        clients, rate = run.split("@")
        return (float("inf") if rate == "max" else float(rate), int(clients))

    for run, figures in sorted((get("rings") or {}).items(), key=lambda item: by_rate(item[0])):
        clients, rate = run.split("@")
        who = f"pgbench, {clients} client{'s' if clients != '1' else ''}"
        where = (f"{who} at {rate}/s" if rate != "max" else f"{who} unthrottled ({figures['tps']:,.0f}/s)"
                 ) + ", into a queue one worker serves"
        t.rows.append((f"wake-ups: NOTIFYs per enqueue, {where}; enqueue->claim p50 / p90",
                       f"{figures['notifies_per_enqueue']:.3f}; {figures['claim_p50_ms']:.2f} / "
                       f"{figures['claim_p90_ms']:.2f} ms", "—", "—", "—"))

    # Latency.
    dbos_rt = anchors.dbos_round_trip_p50 if anchors else None
    t.add("C enqueue->result round trip p50, one-step workflow, closed loop", get("C.roundtrip_p50_ms"), "ms",
          anchor_name="DBOS (queue poll 1 s)" if dbos_rt else "", anchor=dbos_rt, higher_is_better=False)
    t.add(f"L light load (1 per 20 ms, {get('L.n')}x): enqueue->start p50", get("L.start_p50_ms"), "ms",
          target="≤ 3 ms", met=_le(get("L.start_p50_ms"), 3))
    t.add("L enqueue->start p99", get("L.start_p99_ms"), "ms", target="≤ 20 ms", met=_le(get("L.start_p99_ms"), 20))
    t.add("L enqueue->result round trip p50, one-step workflow", get("L.roundtrip_p50_ms"), "ms",
          target="≤ 10 ms", met=_le(get("L.roundtrip_p50_ms"), 10),
          anchor_name="DBOS (queue poll 1 s)" if dbos_rt else "", anchor=dbos_rt, higher_is_better=False)
    t.add("L enqueue->result round trip p99", get("L.roundtrip_p99_ms"), "ms")

    # Jobs and bulk enqueue.
    pgq = anchors.pgq if anchors else None
    pgq_name = f"pgqueuer (N={pgq['n']:.0f}, batch {pgq['batch']:.0f})" if pgq else ""
    d_drain, pgq_drain = get("D.drain_jobs_per_s"), pgq["drain"] if pgq else None
    t.add(f"D jobs drain, step-less {get('D.kind')} jobs, 1 worker C={get('D.concurrency')} (N={get('D.jobs')})",
          d_drain, "jobs/s", target="≥ 0.5x pgqueuer",
          met=(d_drain >= 0.5 * pgq_drain) if isinstance(d_drain, (int, float)) and pgq_drain else None,
          anchor_name=pgq_name, anchor=pgq_drain)
    t.add("D jobs enqueue, enqueue_many in batches of 1000", get("D.enqueue_per_s"), "/s",
          anchor_name=pgq_name, anchor=pgq["enqueue"] if pgq else None)
    t.add("D jobs enqueue, one at a time", get("D.enqueue_single_per_s"), "/s")
    t.add(f"E bulk enqueue, enqueue_many in calls of {get('E.chunk')} ({get('E.workflows')} workflows)",
          get("E.enqueue_per_s"), "wf/s", target="≥ 30,000/s", met=_ge(get("E.enqueue_per_s"), 30_000))

    # Scaling.
    for key in sorted((k for k in ours if re.fullmatch(r"scale\.workers\.\d+\.wf_per_s", k)),
                      key=lambda k: int(k.split(".")[2])):
        w = key.split(".")[2]
        t.add(f"scale: {w} worker process{'es' if w != '1' else ''} (C={get(f'scale.workers.{w}.concurrency')} "
              f"each, {get(f'scale.workers.{w}.kind')}), 3-step workflows/s", ours[key], "wf/s")
    for key in sorted((k for k in ours if re.fullmatch(r"scale\.concurrency\.\d+\.wf_per_s", k)),
                      key=lambda k: int(k.split(".")[2])):
        c = key.split(".")[2]
        kind = get(f"scale.concurrency.{c}.kind")
        t.add(f"scale: 1 worker, C={c} ({kind} workflows), 3-step workflows/s", ours[key], "wf/s")
    history = get("scale.claim.history")
    for part, label in (("claim_ms", "claim statement time"), ("server_ms", "claim server time (EXPLAIN ANALYZE)"),
                        ("drain", "drain time of the jobs")):
        ratio = get(f"scale.claim_ratio.{part}")
        if ratio is not None:
            t.rows.append((f"claim cost, {history:,} finished rows vs empty table: {label}", f"{ratio:.2f}x",
                           "≤ 1.1x" + (" ✓" if ratio <= 1.1 else " ✗"), "—", "—"))

    # Bloat under steady churn (bench/bloat.py).
    if get("bloat.rounds") is not None:
        ratios = [get(f"bloat.{part}_ratio") for part in
                  ("executions_heap", "executions_indexes", "steps_heap", "steps_indexes")]
        bounded = all(r is not None and r <= 1.1 for r in ratios)
        t.rows.append((f"bloat: sizes under steady churn with retention, last third ÷ middle third of "
                       f"{get('bloat.rounds')} rounds ({get('bloat.mode')}): executions heap / indexes, "
                       "steps heap / indexes",
                       " / ".join(f"{r:.2f}x" for r in ratios if r is not None),
                       "≤ 1.1x" + (" ✓" if bounded else " ✗"), "—", "—"))
        t.rows.append(("bloat: workflow_executions bytes per execution kept (heap and indexes, last round)",
                       f"{get('bloat.bytes_per_execution'):,.0f} B", "—", "—", "—"))

    # Memory.
    if get("memory.n") is not None:
        t.rows.append((f"memory: worker VmRSS over {get('memory.n'):,} workflows (idle / after warm-up / last / max)",
                       f"{get('memory.rss_first_mb'):.1f} / {get('memory.rss_warm_mb'):.1f} / "
                       f"{get('memory.rss_last_mb'):.1f} / {get('memory.rss_max_mb'):.1f} MB",
                       "flat" + (" ✓" if abs(float(get("memory.growth_pct", 0.0))) <= 5 else " ✗"), "—", "—"))
        t.add("memory: growth after warm-up", get("memory.growth_pct"), "%")
    return t


def _le(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _ge(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, help="JSON written by the benchmarks' --results")
    parser.add_argument("--anchors", help="output of ../shared/anchors/run.sh")
    parser.add_argument("--pgbench-c1", help="output of pgbench -c 1 (one-row INSERT script)")
    parser.add_argument("--pgbench-c32", help="output of pgbench -c 32 (one-row INSERT script)")
    args = parser.parse_args()
    path = Path(args.results)
    ours = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
    anchors = None
    if args.anchors and Path(args.anchors).exists():
        anchors = Anchors.parse(Path(args.anchors).read_text())
    print(build(ours, anchors, pgbench(args.pgbench_c1), pgbench(args.pgbench_c32)).markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
