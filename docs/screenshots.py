"""Make the dashboard screenshots of docs/operations.md from the real dashboard in headless Chromium.

    PGDURABLE_DATABASE_URL=postgresql://... python docs/screenshots.py [OUTPUT_DIR]

Runs a small shop workload (retries, a failure with its traceback, events, delayed, waiting and running
executions, a history over the last hour) in a throwaway schema, serves the dashboard and captures the overview and a
workflow page. Writes docs/img/ by default; the schema is dropped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import pgdurable  # noqa: E402
from pgdurable.dashboard import create_app  # noqa: E402
from tests.dashboard_harness import browser, running  # noqa: E402


def build(url: str, schema: str) -> tuple[pgdurable.App, list[str]]:
    app = pgdurable.App(url, schema=schema, lease_seconds=5, poll_seconds=0.2, sweep_seconds=1,
                        shutdown_grace_seconds=1)
    flaky: dict[str, int] = {}

    @app.step()
    def reserve_stock(order_id: int, items: list[str]) -> dict[str, object]:
        time.sleep(random.uniform(0.05, 0.15))
        return {"order_id": order_id, "reserved": items, "warehouse": "ams-2"}

    @app.step(max_attempts=3, interval=0.15)
    def charge_card(order_id: int, cents: int) -> str:
        time.sleep(random.uniform(0.1, 0.3))
        flaky[str(order_id)] = flaky.get(str(order_id), 0) + 1
        if order_id % 4 == 1 and flaky[str(order_id)] < 3:
            raise TimeoutError("payment provider did not answer in 2s")
        if order_id == 1042:
            raise PermissionError("card declined: insufficient funds (issuer code 51)")
        return f"ch_{uuid.uuid4().hex[:16]}"

    @app.step()
    def send_receipt(order_id: int, charge: str) -> None:
        time.sleep(random.uniform(0.03, 0.1))

    @app.step()
    def ship(order_id: int) -> str:
        time.sleep(random.uniform(0.1, 0.25))
        return f"1Z{order_id:08d}"

    @app.workflow(queue="orders")
    def checkout(order_id: int, items: list[str], cents: int) -> dict[str, object]:
        reserve_stock(order_id, items)
        charge = charge_card(order_id, cents)
        pgdurable.set_event("stage", "paid")
        send_receipt(order_id, charge)
        tracking = ship(order_id)
        pgdurable.set_event("stage", {"shipped": tracking})
        return {"order_id": order_id, "charge": charge, "tracking": tracking}

    @app.workflow(queue="orders")
    def refund_approval(order_id: int) -> bool:
        decision = pgdurable.recv("approval", timeout=2 * 86400)  # waits for a person
        return bool(decision and decision.get("ok"))

    @app.workflow(queue="emails")
    def follow_up(order_id: int) -> None:
        pgdurable.sleep(3 * 86400)

    @app.workflow(queue="reports")
    def nightly_report(day: str) -> int:
        for part in range(3):
            reserve_stock(part, ["report"])
        return 3

    @app.step()
    def load_batch(batch: int) -> int:
        time.sleep(0.4)
        return 500

    @app.workflow(queue="imports")
    def import_catalog(source: str) -> int:
        return sum(load_batch(b) for b in range(300))

    items = [["sku-1", "sku-7"], ["sku-3"], ["sku-2", "sku-2", "sku-9"]]
    ids = [app.enqueue(checkout, order_id=1040 + i, items=items[i % 3], cents=1999 + 250 * i,
                       workflow_id=f"order-{1040 + i}").workflow_id for i in range(8)]
    app.enqueue(import_catalog, source="s3://catalog/2026-11-30.csv", workflow_id="import-2026-11-30")
    app.enqueue(nightly_report, day="2026-11-29", workflow_id="report-2026-11-29", delay=3600)
    for n in range(3):
        app.enqueue(checkout, order_id=2000 + n, items=["sku-5"], cents=500, delay=900 + n)
    for n in range(4):
        app.enqueue(refund_approval, order_id=1040 + n, workflow_id=f"refund-{1040 + n}")
    for n in range(2):
        app.enqueue(follow_up, order_id=1044 + n)
    return app, ids


def history(url: str, schema: str) -> None:
    """Finished executions spread over the last hour, so the chart has a shape."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute("""
            INSERT INTO workflow_executions (id, name, queue, status, input, output, error, created_at,
                                             started_at, completed_at, updated_at, attempt)
            SELECT 'hist-' || g, 'checkout', 'orders', s.status, '{}', CASE WHEN s.status = 'succeeded'
                   THEN '{}'::jsonb END,
                   CASE WHEN s.status = 'failed' THEN '{"type": "TimeoutError", "message": "late"}'::jsonb END,
                   t - interval '2 seconds', t - interval '1 second', t, t, 1
            FROM generate_series(1, 2400) g,
                 LATERAL (SELECT now() - (random() ^ 1.3 + g * 0) * interval '58 minutes' AS t) AS times,
                 LATERAL (SELECT CASE WHEN random() + g * 0 < 0.04 THEN 'failed'
                                      WHEN random() < 0.02 THEN 'cancelled' ELSE 'succeeded' END AS status) AS s
        """)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("PGDURABLE_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"shots_{uuid.uuid4().hex[:8]}"
    app, ids = build(url, schema)
    worker = app.worker(concurrency=8)
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        for workflow_id in ids:
            with contextlib.suppress(pgdurable.WorkflowFailed):  # order-1042 fails on purpose
                app.handle(workflow_id).result(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(app.handle(f"refund-{1040 + n}").status() != "waiting"
                                                  for n in range(4)):
            time.sleep(0.2)
        history(url, schema)
        with running(create_app(app, token="screenshots")) as base, browser() as chromium:
            laptop = chromium.new_page(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
            laptop.goto(f"{base}/?token=screenshots")
            laptop.wait_for_selector(".chart")
            laptop.screenshot(path=str(out / "dashboard-overview.png"), full_page=False)
            laptop.goto(f"{base}/workflow?id=order-1041")
            laptop.wait_for_selector(".timeline")
            laptop.screenshot(path=str(out / "dashboard-workflow.png"), full_page=True)
    finally:
        app.cancel("import-2026-11-30")  # its thread stops at its next step, before the schema goes
        worker.stop_threadsafe()
        thread.join(timeout=20)
        time.sleep(1)
        app.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
