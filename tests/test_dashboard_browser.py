"""End to end in a real headless Chromium: the dashboard served by uvicorn, driven by Playwright. Screenshots
go to build/screenshots/ (CI keeps them as artifacts).

Skipped only when Chromium (or Playwright) is missing AND PGDURABLE_REQUIRE_BROWSER is unset; CI sets it,
so there these tests run or fail, never silently skip.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pgdurable
from pgdurable.dashboard import create_app

from .dashboard_harness import browser, chromium_available, running
from .harness import WAIT, wait_for

REQUIRED = bool(os.environ.get("PGDURABLE_REQUIRE_BROWSER"))
MISSING = [what for what, present in [("chromium", chromium_available()),
                                      ("playwright", importlib.util.find_spec("playwright") is not None)]
           if not present]
if MISSING and not REQUIRED:
    pytest.skip(f"{' and '.join(MISSING)} not installed (set PGDURABLE_REQUIRE_BROWSER=1 to fail instead)",
                allow_module_level=True)

SHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
TOKEN = "browser-token"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if MISSING:
        pytest.fail(f"PGDURABLE_REQUIRE_BROWSER is set but {' and '.join(MISSING)} is missing: "
                    "apt-get install chromium; pip install playwright")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as instance:
        yield instance


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(WAIT * 1000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield tab
    context.close()
    assert errors == [], f"errors in the page: {errors}"


def test_list_open_a_workflow_see_its_steps_and_cancel_another(app: pgdurable.App, page: Any,
                                                               start_worker: Callable[..., Any]) -> None:
    @app.step()
    def pick(order: int) -> list[str]:
        return ["book", "lamp"]

    @app.step()
    def pack(items: list[str]) -> int:
        return len(items)

    @app.step()
    def post(count: int) -> str:
        return f"parcel of {count}"

    @app.workflow()
    def fulfil(order: int) -> str:
        return post(pack(pick(order)))

    start_worker(app)
    app.enqueue(fulfil, 7, workflow_id="order-7").result(timeout=WAIT)
    app.enqueue(fulfil, 8, workflow_id="order-8", delay=3600)  # waiting for its delayed start: to cancel
    # Hostile strings must stay text in a real browser too (the CSP would also stop them).
    app.enqueue("<img src=x onerror=\"window.__xss=1\">", workflow_id="<script>window.__xss=2</script>",
                queue="nobody")

    with running(create_app(app, token=TOKEN)) as base:
        page.goto(f"{base}/?token={TOKEN}")
        page.wait_for_selector("text=Finished per minute")
        assert page.url == f"{base}/"  # the token left the address bar
        page.screenshot(path=str(SHOTS / "overview.png"), full_page=True)

        page.click("nav >> text=Workflows")
        page.wait_for_selector("table.list >> text=order-7")
        assert page.locator("table.list tbody tr").count() == 3
        page.screenshot(path=str(SHOTS / "workflows.png"), full_page=True)
        assert page.evaluate("window.__xss") is None

        page.click("table.list >> text=order-7")
        page.wait_for_selector(".wf-head >> text=fulfil")
        assert page.locator(".wf-head .badge").inner_text() == "succeeded"
        assert page.locator(".step .step-name").all_inner_texts() == ["pick", "pack", "post"]
        assert page.locator(".tl-row.tl-step").count() == 3
        page.click("#step-2 summary")
        assert "parcel of 2" in page.locator("#step-2 .step-body").inner_text()
        page.screenshot(path=str(SHOTS / "workflow.png"), full_page=True)

        # Fork from step 1 (pack): a new execution that reuses pick's output.
        page.select_option("select[name=from_step]", "1")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#fork-button")
        page.wait_for_selector(".notice >> text=Forked")
        forked_id = page.locator(".wf-id").inner_text()
        assert forked_id != "order-7"
        assert app.handle(forked_id).result(timeout=WAIT) == "parcel of 2"
        page.wait_for_selector(".wf-head .badge.st-succeeded")  # the page follows it live
        assert page.locator("dt:text-is('forked from') + dd a").inner_text() == "order-7"
        page.click("#step-0 summary")
        assert "copied from order-7" in page.locator("#step-0 .step-body").inner_text()

        page.goto(f"{base}/workflow?id=order-8")
        assert page.locator(".wf-head .badge").inner_text() == "waiting"
        assert page.locator("dt:text-is('waiting for') + dd").inner_text() == "its delayed start"
        # Dismissing the confirmation changes nothing; accepting it cancels. (Every cancel request the page
        # makes is counted: after the accepted one, exactly one shows that the dismissed one sent nothing.)
        cancels: list[str] = []
        page.on("request", lambda r: cancels.append(r.url) if r.url.endswith("/workflow/cancel") else None)
        page.once("dialog", lambda dialog: dialog.dismiss())
        page.click("#cancel-button")
        assert app.get("order-8").status == "waiting"  # type: ignore[union-attr]
        questions: list[str] = []

        def accept(dialog: Any) -> None:
            questions.append(dialog.message)
            dialog.accept()

        page.once("dialog", accept)
        page.click("#cancel-button")
        page.wait_for_selector(".notice >> text=Cancelled.")
        assert questions and questions[0].startswith("Cancel execution order-8?")
        assert len(cancels) == 1, cancels  # only the accepted confirmation sent a request
        assert page.locator(".wf-head .badge").inner_text() == "cancelled"
        assert app.get("order-8").status == "cancelled"  # type: ignore[union-attr]
        assert page.locator("#cancel-button").count() == 0
        page.screenshot(path=str(SHOTS / "cancelled.png"), full_page=True)

        page.goto(f"{base}/workflow?id=%3Cscript%3Ewindow.__xss%3D2%3C%2Fscript%3E")
        page.wait_for_selector(".wf-head")
        assert "<script>window.__xss=2</script>" in page.locator(".wf-id").inner_text()
        assert page.evaluate("window.__xss") is None


def test_pages_update_live_without_reloading(app: pgdurable.App, page: Any,
                                             start_worker: Callable[..., Any]) -> None:
    release = threading.Event()

    @app.step()
    def slow() -> str:
        release.wait(WAIT)
        return "done"

    @app.workflow()
    def waits() -> str:
        return slow()

    start_worker(app)
    handle = app.enqueue(waits, workflow_id="live-1")
    wait_for(lambda: handle.status() == "running", WAIT, "the workflow to start")
    with running(create_app(app)) as base:
        page.goto(f"{base}/workflow?id=live-1")
        assert page.locator(".wf-head .badge").inner_text() == "running"
        page.evaluate("window.__same_document = true")
        release.set()
        handle.result(timeout=WAIT)
        page.wait_for_selector(".wf-head .badge.st-succeeded", timeout=WAIT * 1000)
        assert page.evaluate("window.__same_document") is True  # updated in place, not reloaded
        assert page.locator(".step .step-name").all_inner_texts() == ["slow"]
        assert page.locator("#live .live-text").inner_text() == "finished"

        page.goto(f"{base}/")
        app.enqueue(waits, workflow_id="live-2", delay=3600)  # a delayed start: counted as waiting
        waiting = page.locator(".card", has=page.locator(".badge.st-waiting")).locator(".card-value")
        # (polled from Python: the CSP forbids the eval that page.wait_for_function would need)
        wait_for(lambda: waiting.inner_text().strip() == "1", WAIT, "the overview to count the new execution")


def test_a_phone_sized_screen(app: pgdurable.App, chromium: Any) -> None:
    for n in range(3):
        app.enqueue("report", workflow_id=f"report-2026-11-{n + 10}", day=n, delay=60)
    context = chromium.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                                   has_touch=True)
    try:
        phone = context.new_page()
        with running(create_app(app)) as base:
            phone.goto(f"{base}/workflows")
            phone.wait_for_selector("table.list >> text=report-2026-11-10")
            # nothing wider than the screen but the table's own scroller
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, width
            assert not phone.locator("th.opt").first.is_visible()
            phone.screenshot(path=str(SHOTS / "phone-workflows.png"), full_page=True)
            phone.goto(f"{base}/")
            assert phone.evaluate("document.documentElement.scrollWidth") <= 390
            phone.screenshot(path=str(SHOTS / "phone-overview.png"), full_page=True)
    finally:
        context.close()
