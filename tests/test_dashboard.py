"""The dashboard's views against a real PostgreSQL: overview, filters, keyset paging, the workflow page (waits,
children, events, messages), schedules, escaping of hostile strings, login, CSRF, read-only mode and actions
(cancel, resume, fork)."""

from __future__ import annotations

import html
import re
import threading
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from markupsafe import escape
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable import store
from pgdurable.cli import cli
from pgdurable.dashboard import create_app, views
from pgdurable.dashboard.serve import LOOPBACK_HOSTS, DashboardOptionsError, check_options
from pgdurable.sqlfiles import query

from .harness import WAIT, execution, wait_for

with warnings.catch_warnings():  # starlette asks for the httpx2 fork; plain httpx works the same
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

XSS = '<script>alert("xss")</script>'
XSS_IMG = "<img src=x onerror=alert(1)>"
TOKEN = "s3cret-token"


def client(pg_app: pgdurable.App, token: str | None = None, **options: Any) -> TestClient:
    test_client = TestClient(create_app(pg_app, token=token, **options), follow_redirects=False)
    if token is not None:
        assert test_client.get(f"/?token={token}").status_code == 303  # sets the session cookie
    return test_client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def listed_ids(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<a class="mono" href="/workflow\?id=[^"]*" title="([^"]*)"', page)]


def link(page: str, rel: str) -> str | None:
    found = re.search(rf'<a class="button" href="([^"]+)" rel="{rel}">', page)
    return html.unescape(found.group(1)) if found else None




def finish(db: psycopg.Connection[Any], workflow_id: str, status: str, age: timedelta = timedelta(0)) -> None:
    """Mark an enqueued execution finished (and optionally move its times into the past)."""
    db.execute("UPDATE workflow_executions SET status = %s, completed_at = now() - %s, started_at = now() - %s,"
               " created_at = now() - %s, error = CASE WHEN %s = 'failed' THEN "
               "'{\"type\": \"ValueError\", \"message\": \"nope\"}'::jsonb END WHERE id = %s",
               (status, age, age, age, status, workflow_id))


# ---- overview ---------------------------------------------------------------------------------------------

def test_overview_shows_counts_queues_workers_and_chart(app: pgdurable.App,
                                                        start_worker: Callable[..., Any]) -> None:
    @app.step()
    def double(n: int) -> int:
        return n * 2

    @app.workflow()
    def ok(n: int) -> int:
        return double(n)

    @app.workflow()
    def broken() -> None:
        raise RuntimeError("broken on purpose")

    runner = start_worker(app)
    for n in range(3):
        app.enqueue(ok, n).result(timeout=WAIT)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(broken).result(timeout=WAIT)
    app.enqueue(ok, 9, delay=3600)  # a delayed start: waiting, not enqueued

    page = client(app).get("/")
    assert page.status_code == 200
    text = page.text
    assert "<h1>Overview</h1>" in text
    assert runner.worker.id[:36] in text
    assert re.search(r'<a class="mono" href="/workflows\?queue=default">default</a>', text)
    cards = dict(re.findall(r'badge st-(\w+)">\w+</span></div>\s*<div class="card-value">([\d,]+)<', text))
    assert cards == {"enqueued": "0", "waiting": "1", "running": "0", "succeeded": "3", "failed": "1"}
    queue_row = re.search(r'href="/workflows\?queue=default">default</a></td>(.*?)</tr>', text, re.S)
    assert queue_row is not None
    cells = re.findall(r'<td class="num[^"]*">(.*?)</td>', queue_row.group(1), re.S)
    assert cells[0] == "0"  # ready
    assert ">1</a>" in cells[1] and "1 delayed" in cells[1]  # waiting, and for what
    assert re.search(r"<title>\d\d:\d\d UTC: 3 succeeded, 1 failed</title>", text)
    assert "No live worker can run these" not in text

    fragment = client(app).get("/?fragment=1")
    assert fragment.status_code == 200
    assert "<html" not in fragment.text and "Finished per minute" in fragment.text


def test_overview_lists_work_no_live_worker_can_run(app: pgdurable.App) -> None:
    app.enqueue("nobody_knows_me", workflow_id="orphan-1", queue="lonely")  # enqueued: no worker serves it
    text = client(app).get("/").text
    assert "No live worker can run these" in text
    assert "orphan-1" in text and "no live worker serves queue lonely" in text
    cards = dict(re.findall(r'badge st-(\w+)">\w+</span></div>\s*<div class="card-value">([\d,]+)<', text))
    assert cards["enqueued"] == "1" and cards["waiting"] == "0"


# ---- the list ---------------------------------------------------------------------------------------------

def test_list_filters_by_status_name_queue_time_and_id(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    app.enqueue("alpha", workflow_id="a-1", queue="q1")
    app.enqueue("alpha", workflow_id="a-2", queue="q2")
    app.enqueue("beta", workflow_id="b-1", queue="q1")
    app.enqueue("beta", workflow_id="b-old", queue="q2")
    finish(db, "a-2", "failed")
    finish(db, "b-old", "succeeded", age=timedelta(days=2))
    c = client(app)

    def ids(**params: str) -> set[str]:
        response = c.get("/workflows", params=params)
        assert response.status_code == 200
        return set(listed_ids(response.text))

    assert ids() == {"a-1", "a-2", "b-1", "b-old"}
    assert ids(status="failed") == {"a-2"}
    assert ids(name="beta") == {"b-1", "b-old"}
    assert ids(queue="q1") == {"a-1", "b-1"}
    assert ids(name="alpha", queue="q2") == {"a-2"}
    assert ids(within="1h") == {"a-1", "a-2", "b-1"}
    day_ago = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert ids(to=day_ago) == {"b-old"}
    assert ids(**{"from": day_ago}) == {"a-1", "a-2", "b-1"}
    assert ids(q="a-") == {"a-1", "a-2"}  # a prefix filters
    exact = c.get("/workflows", params={"q": "b-1"})  # an exact id opens the execution
    assert exact.status_code == 303 and exact.headers["location"] == "/workflow?id=b-1"
    bad = c.get("/workflows", params={"from": "yesterday"})
    assert "is not a date and time" in bad.text
    app.enqueue("gamma", workflow_id="g-later", queue="q1", delay=3600)
    assert ids(status="waiting") == {"g-later"} and ids(status="enqueued") == {"a-1", "b-1"}
    assert '<option value="waiting" selected>' in c.get("/workflows", params={"status": "waiting"}).text
    assert ids(status="paused") == set()  # statuses are data: any can be asked for


def test_keyset_paging_visits_every_execution_once_in_both_directions(app: pgdurable.App) -> None:
    @app.workflow()
    def item(i: int) -> int:
        return i

    # 130 executions share one created_at (one transaction), so the id must break the ties.
    handles = app.enqueue_many(item, [(i,) for i in range(130)])
    handles += [app.enqueue(item, i) for i in range(25)]
    everything = sorted(((e.created_at, e.id) for e in app.list_workflows(limit=1000)), reverse=True)
    assert len(everything) == 155
    c = client(app)

    pages: list[list[str]] = []
    url: str | None = "/workflows?limit=40"
    while url:
        page = c.get(url).text
        pages.append(listed_ids(page))
        url = link(page, "next")
    assert [len(p) for p in pages] == [40, 40, 40, 35]
    assert [i for p in pages for i in p] == [i for _, i in everything]

    # and back up from the last page
    page = c.get("/workflows?limit=40").text
    for _ in range(3):
        page = c.get(link(page, "next") or "").text
    back: list[list[str]] = [listed_ids(page)]
    while (newer := link(page, "prev")) is not None:
        page = c.get(newer).text
        back.append(listed_ids(page))
    assert back[::-1] == pages  # the top page is reached exactly and has no "newer" link


def test_list_page_is_an_index_scan_on_a_large_table(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    db.execute("INSERT INTO workflow_executions (id, name, created_at) "
               "SELECT 'bulk-' || g, 'bulk', now() - g * interval '1 second' FROM generate_series(1, 30000) g")
    db.execute("ANALYZE workflow_executions")
    base = {"status": None, "name": None, "queue": None, "prefix": None, "since": "-infinity",
            "until": "infinity", "limit": 51, "parent": None, "tags": None}
    for cursor in [("infinity", ""), (datetime.now(UTC) - timedelta(hours=4), "bulk-14400")]:
        params = {**base, "at": cursor[0], "id": cursor[1]}
        plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + query("dash_list_older"), params).fetchall())
        assert "workflow_executions_created_idx" in plan, plan
        assert "Seq Scan" not in plan, plan
        rows = db.execute(query("dash_list_older"), params).fetchall()
        assert len(rows) == 51


# ---- one workflow -----------------------------------------------------------------------------------------

def test_workflow_page_shows_input_output_steps_and_timeline(app: pgdurable.App,
                                                             start_worker: Callable[..., Any]) -> None:
    tries: list[int] = []

    @app.step()
    def fetch(order: int) -> dict[str, Any]:
        return {"order": order, "items": ["book", "pen"]}

    @app.step(max_attempts=3, interval=0.01)
    def charge(order: int) -> str:
        tries.append(order)
        if len(tries) == 1:
            raise ConnectionError("flaky provider")
        return "ch_123"

    @app.workflow()
    def checkout(order: int) -> dict[str, Any]:
        basket = fetch(order)
        return {"charge": charge(order), "count": len(basket["items"])}

    start_worker(app)
    app.enqueue(checkout, 42, workflow_id="order-42").result(timeout=WAIT)
    response = client(app).get("/workflow", params={"id": "order-42"})
    assert response.status_code == 200
    text = response.text
    assert '<span class="wf-name">checkout</span>' in text and 'badge st-succeeded' in text
    assert '<span class="j-key">&#34;order&#34;</span>: <span class="j-num">42</span>' in text  # input
    assert '<span class="j-key">&#34;charge&#34;</span>: <span class="j-str">&#34;ch_123&#34;</span>' in text
    assert text.count('class="tl-row tl-step"') == 2 and 'class="tl-row tl-queue"' in text
    assert '<span class="chip chip-warn">2 attempts</span>' in text
    assert re.search(r'<span class="step-name">fetch</span>', text)
    assert "data-final" in text  # finished: the page stops polling

    live = client(app).get("/workflow", params={"id": "order-42", "fragment": "1"})
    assert "<html" not in live.text and 'id="input-panel" data-keep></section>' in live.text


def test_failed_workflow_shows_error_traceback_and_failed_step(app: pgdurable.App,
                                                               start_worker: Callable[..., Any]) -> None:
    @app.step(max_attempts=1)
    def explode() -> None:
        raise KeyError("missing-key")

    @app.workflow()
    def doomed() -> None:
        explode()

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(doomed, workflow_id="doomed-1").result(timeout=WAIT)
    text = client(app).get("/workflow", params={"id": "doomed-1"}).text
    assert '<h2>Error</h2>' in text
    assert '<span class="err-type">KeyError</span> &#39;missing-key&#39;' in text
    assert "Traceback (most recent call last)" in text and "in explode" in text
    assert 'class="step step-error"' in text and 'class="tl-row tl-error"' in text


def test_large_payloads_are_cut_and_the_raw_view_is_whole(app: pgdurable.App) -> None:
    big = "x" * 200_000
    app.enqueue("big", workflow_id="big-1", blob=big)
    c = client(app)
    text = c.get("/workflow", params={"id": "big-1"}).text
    assert "Showing the first 65536 characters." in text
    raw = c.get("/workflow/payload", params={"id": "big-1", "column": "input"})
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.json() == {"blob": big}
    assert c.get("/workflow/payload", params={"id": "big-1", "column": "secret"}).status_code == 400
    assert c.get("/workflow", params={"id": "no-such"}).status_code == 404


def test_workflow_page_shows_waits_children_events_and_messages(app: pgdurable.App,
                                                               start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def part(n: int) -> int:
        if n == 1:
            return int(pgdurable.recv("go")["n"])  # waits for a message
        return n

    @app.workflow()
    def fan_out(count: int) -> list[int]:
        pgdurable.set_event("stage", "fanning out")
        handles = [app.enqueue(part, n) for n in range(count)]
        pgdurable.set_event("stage", "gathering")
        pgdurable.set_event("parts", count)
        return pgdurable.gather(handles)

    start_worker(app)
    handle = app.enqueue(fan_out, 3, workflow_id="fan-1")

    def children() -> dict[str, str]:
        return {c[0]: c[2] for c in app.children("fan-1")}

    wait_for(lambda: sorted(children().values()) == ["succeeded", "succeeded", "waiting"]
             and handle.status() == "waiting", WAIT, "two parts to finish and one to wait for its message")
    waiting_child = next(i for i, status in children().items() if status == "waiting")
    app.send(waiting_child, {"note": "not what it waits for"}, topic="other")
    c = client(app)

    parent = c.get("/workflow", params={"id": "fan-1"}).text
    assert "<dt>waiting for</dt><dd>child workflows</dd>" in parent
    assert "<dt>wakes</dt><dd>when woken</dd>" in parent
    assert 'class="tl-row tl-wait"' in parent and "waiting for child workflows" in parent
    assert "<h2>Children</h2>" in parent and "list all" in parent
    for child in children():
        assert f'href="/workflow?id={child.replace(":", "%3A")}"' in parent
    assert re.search(r'status=succeeded"><span class="badge st-succeeded">succeeded</span> 2</a>', parent)
    assert re.search(r'status=waiting"><span class="badge st-waiting">waiting</span> 1</a>', parent)
    latest = dict(re.findall(r'<td class="mono">(\w+)</td>\s*<td class="value-cell"><pre class="json inline-json">'
                             r'(.*?)</pre>', parent.split('id="events-history"')[0]))
    assert latest == {"parts": '<span class="j-num">3</span>',
                      "stage": '<span class="j-str">&#34;gathering&#34;</span>'}
    history = parent.split('id="events-history"')[1]
    assert "&#34;fanning out&#34;" in history and history.index("gathering") < history.index("fanning out")

    child_page = c.get("/workflow", params={"id": waiting_child}).text
    assert "<dt>waiting for</dt><dd>a message on topic &#39;go&#39;</dd>" in child_page
    assert re.search(r'<dt>parent</dt><dd><a class="mono" href="/workflow\?id=fan-1" title="fan-1">fan-1</a> '
                     r'<span class="badge st-waiting">waiting</span>', child_page)
    assert "1 sent · 1 not yet received" in child_page
    assert '<td class="mono">other</td>' in child_page and 'class="chip chip-warn">not yet<' in child_page

    listed = c.get("/workflows", params={"parent": "fan-1"}).text
    assert set(listed_ids(listed)) == set(children()) and "Children of" in listed
    assert listed_ids(c.get("/workflows", params={"parent": "fan-1", "status": "waiting"}).text) == [waiting_child]
    assert 'waiting</span> <span class="muted small" title="waiting for a message on topic' in c.get(
        "/workflows", params={"status": "waiting", "q": waiting_child[:-1]}).text

    app.send(waiting_child, {"n": 7}, topic="go")
    assert handle.result(timeout=WAIT) == [0, 7, 2]
    child_page = c.get("/workflow", params={"id": waiting_child}).text
    assert "2 sent · 1 not yet received" in child_page
    assert re.search(r"by step <a href=\"#step-\d+\">\d+</a>", child_page)  # the receive that consumed it
    parent = c.get("/workflow", params={"id": "fan-1"}).text
    assert re.search(r'status=succeeded"><span class="badge st-succeeded">succeeded</span> 3</a>', parent)
    assert "tl-wait" not in parent and "waiting for" not in parent


def test_a_large_fan_out_lists_a_capped_page_of_children(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    app.enqueue("big_parent", workflow_id="big-p", delay=3600)
    db.execute("INSERT INTO workflow_executions (id, name, parent_id, status, created_at) SELECT 'big-p:' || g,"
               " 'part', 'big-p', CASE WHEN mod(g, 10) = 0 THEN 'failed' ELSE 'succeeded' END,"
               " now() - (300 - g) * interval '1 second' FROM generate_series(1, 250) g")
    page = client(app).get("/workflow", params={"id": "big-p"}).text
    assert ">250 · <a" in page
    assert re.search(r'status=failed"><span class="badge st-failed">failed</span> 25</a>', page)
    shown = re.findall(r'<a class="mono" href="/workflow\?id=big-p%3A(\d+)"', page)
    assert shown == [str(g) for g in range(1, 101)]  # the first 100 by creation
    assert "The first 100 by creation are shown" in page


def test_a_delayed_start_shows_when_it_starts(app: pgdurable.App) -> None:
    app.enqueue("later", workflow_id="d-1", delay=3600)
    page = client(app).get("/workflow", params={"id": "d-1"}).text
    assert "<dt>waiting for</dt><dd>its delayed start</dd>" in page and "<dt>starts</dt>" in page
    assert 'class="tl-row tl-delay"' in page and "tl-wait" not in page


def test_schedules_page_lists_next_ticks_paused_and_errors(app: pgdurable.App, db: psycopg.Connection[Any]) -> None:
    @app.workflow()
    def report(kind: str) -> None:
        return None

    app.schedule("daily-report", report, "0 7 * * *", timezone="Europe/Paris", args={"kind": "daily"})
    app.schedule("paused-one", report, "@hourly", args={"kind": "x"})
    app.pause_schedule("paused-one")
    db.execute("UPDATE schedules SET last_error = 'unknown time zone' WHERE name = 'paused-one'")
    c = client(app)
    page = c.get("/schedules").text
    assert '<a href="/schedules" aria-current="page">Schedules</a>' in page
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<tbody>")[1], re.S)
    assert len(rows) == 2
    assert "daily-report" in rows[0] and "Europe/Paris" in rows[0] and ">0 7 * * *<" in rows[0]
    assert re.search(r'<span title="[\d-]+ [\d:]+ UTC">in \d+', rows[0]) and ">active<" in rows[0]
    assert "/workflows?q=sched%3Adaily-report%3A" in rows[0]
    assert ">paused<" in rows[1] and "unknown time zone" in rows[1]
    assert "<html" not in c.get("/schedules?fragment=1").text


def test_hostile_strings_are_escaped_on_every_page(app: pgdurable.App, start_worker: Callable[..., Any],
                                                    database_url: str, schema: str) -> None:
    @app.step(name=XSS_IMG, max_attempts=1)
    def step(text: str) -> str:
        raise ValueError(f"bad input {text}")

    @app.workflow(name=XSS)
    def hostile(text: str) -> None:
        step(text)

    @app.workflow(name=XSS_IMG + "-child")
    def hostile_child(text: str) -> Any:
        return pgdurable.recv(XSS)

    @app.workflow(name=XSS + "-parent")
    def hostile_parent(text: str) -> None:
        pgdurable.set_event(XSS, {XSS_IMG: text})
        pgdurable.set_event(XSS, XSS_IMG)
        pgdurable.gather([app.enqueue(hostile_child, text)])

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(hostile, XSS, workflow_id=f"id-{XSS_IMG}").result(timeout=WAIT)
    # A worker whose queue list says <script> (queue names of executions are checked by the schema, the
    # workers table is not), and an unrunnable execution whose name is hostile.
    app.db.run(store.workers.register_worker(id=XSS, hostname=XSS_IMG, pid=1, queues=[XSS], workflows=[XSS],
                                             concurrency=1, version=XSS_IMG))
    app.enqueue(XSS_IMG, workflow_id=XSS, queue="nobody")
    # A parent waiting on a child that waits for a message on a hostile topic; hostile event keys and values,
    # messages, idempotency keys and ids; a schedule row written by hand.
    parent_id = f"p-{XSS}"
    app.enqueue(hostile_parent, XSS, workflow_id=parent_id)

    def both_wait() -> bool:
        children = [(c[2], execution(app, c[0]).wait_reason) for c in app.children(parent_id)]
        return children == [("waiting", f"recv:{XSS}")] and execution(app, parent_id).status == "waiting"

    wait_for(both_wait, WAIT, "the child to wait for its message and the parent for the child")
    child_id = app.children(parent_id)[0][0]
    app.send(child_id, {XSS: XSS_IMG}, topic=XSS_IMG, idempotency_key=XSS)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.schedules (name, workflow_name, cron, timezone, paused, last_error) "
                             "VALUES ('hostile', %s, %s, %s, true, %s)").format(sql.Identifier(schema)),
                     (XSS, XSS_IMG, XSS, XSS))
    c = client(app, token=TOKEN)
    hostile_query = {"status": XSS, "name": XSS, "queue": XSS_IMG, "q": XSS, "from": XSS, "parent": XSS}
    pages = [
        c.get("/"), c.get("/?fragment=1"), c.get("/workflows"), c.get("/workflows", params=hostile_query),
        c.get("/workflows", params={**hostile_query, "fragment": "1"}),
        c.get("/workflow", params={"id": f"id-{XSS_IMG}"}), c.get("/workflow", params={"id": XSS}),
        c.get("/workflow", params={"id": f"id-{XSS_IMG}", "fragment": "1"}),
        c.get("/workflow", params={"id": "<b>missing</b>"}), c.get("/login?next=" + XSS),
        c.get("/workflow", params={"id": parent_id}), c.get("/workflow", params={"id": child_id}),
        c.get("/workflow", params={"id": child_id, "fragment": "1"}),
        c.get("/workflows", params={"parent": parent_id}), c.get("/workflows", params={"status": "waiting"}),
        c.get("/schedules"), c.get("/schedules?fragment=1"),
    ]
    for response in pages:
        assert response.status_code in (200, 303, 404), response.url
        body = response.text
        assert "<script>alert" not in body and "<img src=x" not in body, response.url
    detail = pages[5].text
    assert "&lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;" in detail  # name, input, error all shown escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in detail  # the step's name
    assert "bad input &lt;script&gt;" in detail
    assert "&lt;script&gt;" in pages[0].text  # the worker's queue on the overview
    parent_page, child_page = pages[10].text, pages[11].text
    assert "<h2>Children</h2>" in parent_page and "<h2>Events</h2>" in parent_page
    assert str(escape(child_id)) in parent_page  # the child's (hostile) id, linked
    assert '<td class="mono">&lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;</td>' in parent_page  # event key
    assert "&lt;img src=x onerror=alert(1)&gt;" in parent_page  # event value
    assert "a message on topic &#39;&lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;&#39;" in child_page
    assert "<h2>Messages</h2>" in child_page and str(escape(parent_id)) in child_page
    assert '<td class="mono">&lt;img src=x onerror=alert(1)&gt;</td>' in child_page  # the message's topic
    assert '<span class="mono">&lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;</span>' in child_page  # its key
    assert "<span class=\"mono\">&lt;img src=x onerror=alert(1)&gt;</span>" in pages[15].text  # cron
    assert "&lt;script&gt;" in pages[15].text and 'class="chip chip-warn">paused<' in pages[15].text


# ---- access and actions -----------------------------------------------------------------------------------

def test_without_a_token_the_dashboard_is_read_only(app: pgdurable.App) -> None:
    app.enqueue("later", workflow_id="w-1", delay=3600)  # waiting for its delayed start: cancellable
    c = client(app)
    page = c.get("/workflow", params={"id": "w-1"}).text
    assert "cancel-button" not in page and ">read-only<" in page
    refused = c.post("/workflow/cancel", data={"id": "w-1", "csrf": "x"})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert app.get("w-1").status == "waiting"  # type: ignore[union-attr]

    read_only = client(app, token=TOKEN, read_only=True)
    page = read_only.get("/workflow", params={"id": "w-1"}).text
    assert "cancel-button" not in page
    refused = read_only.post("/workflow/cancel", data={"id": "w-1", "csrf": csrf_of(page)})  # logout's token
    assert refused.status_code == 403 and "read-only" in refused.text
    assert app.get("w-1").status == "waiting"  # type: ignore[union-attr]


def test_a_token_guards_every_page(app: pgdurable.App) -> None:
    c = TestClient(create_app(app, token=TOKEN), follow_redirects=False)
    first = c.get("/workflows?status=failed")
    assert first.status_code == 303 and first.headers["location"] == "/login?next=%2Fworkflows%3Fstatus%3Dfailed"
    assert c.get("/?fragment=1").status_code == 401
    assert c.get("/workflow/payload?id=x&column=input").status_code == 303  # to the login page
    assert c.get("/?token=wrong").status_code == 401
    assert c.get("/", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert c.get("/static/dashboard.css").status_code == 200  # the login page needs its style
    assert c.get("/healthz").text == "ok"  # for load balancers

    login = c.get("/login?next=/workflows")
    assert login.status_code == 200
    csrf = csrf_of(login.text)
    assert c.post("/login?next=/workflows", data={"token": "nope", "csrf": csrf}).status_code == 401
    assert c.post("/login?next=/workflows", data={"token": TOKEN}).status_code == 403  # no CSRF token
    ok = c.post("/login?next=//evil.example/", data={"token": TOKEN, "csrf": csrf})
    assert ok.status_code == 303 and ok.headers["location"] == "/"  # never an open redirect
    assert c.get("/workflows").status_code == 200

    via_link = TestClient(create_app(app, token=TOKEN), follow_redirects=False)
    redirected = via_link.get("/workflows?status=failed&token=" + TOKEN)
    assert redirected.status_code == 303 and redirected.headers["location"] == "/workflows?status=failed"
    assert "httponly" in redirected.headers["set-cookie"].lower()
    assert "samesite=strict" in redirected.headers["set-cookie"].lower()
    assert via_link.get("/workflows").status_code == 200

    other = TestClient(create_app(app, token="another-token"), follow_redirects=False)
    other.cookies.update(via_link.cookies)  # a session of another token is worth nothing
    assert other.get("/").status_code == 303


def test_cancel_needs_a_valid_csrf_token_and_the_same_origin(app: pgdurable.App) -> None:
    app.enqueue("later", workflow_id="c-1", delay=3600)  # waiting: cancelling works the same
    c = client(app, token=TOKEN)
    page = c.get("/workflow", params={"id": "c-1"}).text
    assert 'id="cancel-button"' in page and 'data-confirm="Cancel execution c-1?' in page
    csrf = csrf_of(page)
    assert c.post("/workflow/cancel", data={"id": "c-1"}).status_code == 403
    assert c.post("/workflow/cancel", data={"id": "c-1", "csrf": "0" * 64}).status_code == 403
    other_browser = client(app, token=TOKEN)  # its own CSRF cookie: this page's token is not valid there
    assert other_browser.post("/workflow/cancel", data={"id": "c-1", "csrf": csrf}).status_code == 403
    cross = c.post("/workflow/cancel", data={"id": "c-1", "csrf": csrf},
                   headers={"origin": "https://evil.example"})
    assert cross.status_code == 403
    assert app.get("c-1").status == "waiting"  # type: ignore[union-attr]

    done = c.post("/workflow/cancel", data={"id": "c-1", "csrf": csrf}, headers={"origin": "http://testserver"})
    assert done.status_code == 303 and done.headers["location"] == "/workflow?id=c-1&notice=cancelled"
    assert app.get("c-1").status == "cancelled"  # type: ignore[union-attr]
    after = c.get(done.headers["location"]).text
    assert "Cancelled. A running execution stops at its next step." in after and "cancel-button" not in after
    again = c.post("/workflow/cancel", data={"id": "c-1", "csrf": csrf})
    assert again.headers["location"].endswith("notice=unchanged")


def test_resume_from_the_dashboard_reruns_the_failed_step(app: pgdurable.App,
                                                          start_worker: Callable[..., Any]) -> None:
    fixed = threading.Event()

    @app.step(max_attempts=1)
    def fragile() -> str:
        if not fixed.is_set():
            raise RuntimeError("not yet")
        return "fine"

    @app.workflow()
    def job() -> str:
        return fragile()

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(job, workflow_id="r-1").result(timeout=WAIT)
    c = client(app, token=TOKEN)
    page = c.get("/workflow", params={"id": "r-1"}).text
    assert 'id="resume-button"' in page and "cancel-button" not in page
    fixed.set()
    done = c.post("/workflow/resume", data={"id": "r-1", "csrf": csrf_of(page)})
    assert done.headers["location"] == "/workflow?id=r-1&notice=resumed"
    assert app.handle("r-1").result(timeout=WAIT) == "fine"


def test_fork_from_the_dashboard_reuses_the_steps_before_the_chosen_one(app: pgdurable.App,
                                                                        start_worker: Callable[..., Any]) -> None:
    calls: list[str] = []

    @app.step()
    def fetch(n: int) -> int:
        calls.append("fetch")
        return n + 1

    @app.step()
    def compute(n: int) -> int:
        calls.append("compute")
        return n * 10

    @app.workflow()
    def pipeline(n: int) -> int:
        return compute(fetch(n))

    start_worker(app)
    assert app.enqueue(pipeline, 4, workflow_id="f-1").result(timeout=WAIT) == 50
    c = client(app, token=TOKEN)
    page = c.get("/workflow", params={"id": "f-1"}).text
    assert 'id="fork-button"' in page and '<option value="0">the start</option>' in page
    assert re.search(r'<option value="1"\s*>1 · compute</option>', page)
    csrf = csrf_of(page)

    def executions() -> int:
        return len(app.list_workflows(limit=100))

    assert c.post("/workflow/fork", data={"id": "f-1", "from_step": "1"}).status_code == 403  # no CSRF token
    assert c.post("/workflow/fork", data={"id": "f-1", "from_step": "1", "csrf": csrf},
                  headers={"origin": "https://evil.example"}).status_code == 403
    assert c.post("/workflow/fork", data={"id": "f-1", "csrf": csrf, "from_step": "x"}).status_code == 400
    assert c.post("/workflow/fork", data={"id": "nope", "csrf": csrf, "from_step": "1"}).status_code == 404
    assert executions() == 1

    done = c.post("/workflow/fork", data={"id": "f-1", "csrf": csrf, "from_step": "1"})
    assert done.status_code == 303
    forked_id = re.fullmatch(r"/workflow\?id=([^&]+)&notice=forked", done.headers["location"])
    assert forked_id is not None and forked_id.group(1) != "f-1"
    new_id = forked_id.group(1)
    assert app.handle(new_id).result(timeout=WAIT) == 50
    assert calls == ["fetch", "compute", "compute"]  # step 0 was reused, step 1 ran again
    forked = app.get(new_id)
    assert forked is not None and forked.forked_from == "f-1" and forked.name == "pipeline"
    assert [(s.step_name, s.recorded_by_attempt > 0) for s in app.steps(new_id)] == [("fetch", False),
                                                                                    ("compute", True)]
    shown = c.get(done.headers["location"]).text
    assert "Forked: this new execution reuses the steps before the chosen one" in shown
    assert re.search(r'<dt>forked from</dt><dd><a class="mono" href="/workflow\?id=f-1"', shown)
    assert "copied from" in shown and shown.count("recorded by attempt") == 1

    read_only = client(app, token=TOKEN, read_only=True)
    page = read_only.get("/workflow", params={"id": "f-1"}).text
    assert "fork-button" not in page
    refused = read_only.post("/workflow/fork", data={"id": "f-1", "csrf": csrf_of(page), "from_step": "1"})
    assert refused.status_code == 403 and executions() == 2


def test_security_headers_and_loopback_host_check(app: pgdurable.App) -> None:
    response = client(app).get("/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert "pgdurable_csrf" in response.headers["set-cookie"]
    loopback = TestClient(create_app(app, allowed_hosts=LOOPBACK_HOSTS))
    assert loopback.get("/", headers={"host": "rebound.evil.example"}).status_code == 400
    assert loopback.get("/", headers={"host": "localhost:8080"}).status_code == 200
    assert loopback.get("/", headers={"host": "127.0.0.1:8080"}).status_code == 200
    assert loopback.get("/", headers={"host": "[::1]:8080"}).status_code == 200


def test_a_database_without_the_schema_gets_a_clear_page(make_app: Callable[..., pgdurable.App]) -> None:
    bare = make_app(auto_migrate=False)
    response = client(bare).get("/")
    assert response.status_code == 503
    assert "tables are not in schema" in response.text and "pgdurable migrate" in response.text


def test_dashboard_command_refuses_unsafe_options() -> None:
    with pytest.raises(DashboardOptionsError, match="needs --token"):
        check_options("0.0.0.0", None, False)
    assert check_options("0.0.0.0", None, True, ["dash.internal"]) is None  # read-only, with its Host names
    assert check_options("0.0.0.0", "t", False) == "t"
    generated = check_options("127.0.0.1", None, False)
    assert generated and len(generated) >= 24  # loopback: a fresh token, printed as a login link
    assert check_options("::1", None, True) is None
    result = CliRunner().invoke(cli, ["dashboard", "--host", "0.0.0.0", "--database-url", "postgresql://unused"])
    assert result.exit_code == 2 and "needs --token" in result.output


# ---- view helpers -----------------------------------------------------------------------------------------

def test_json_is_colored_and_escaped() -> None:
    rendered = str(views.json_html('{"a<b": "<script>", "n": -1.5e3, "ok": true, "none": null}'))
    assert '<span class="j-key">&#34;a&lt;b&#34;</span>' in rendered
    assert '<span class="j-str">&#34;&lt;script&gt;&#34;</span>' in rendered
    assert '<span class="j-num">-1500.0</span>' in rendered and '<span class="j-lit">true</span>' in rendered
    assert str(views.json_html('{"cut": "<b')) == '{&#34;cut&#34;: &#34;&lt;b'  # a cut preview stays text


def test_cursors_round_trip_any_id() -> None:
    when = datetime(2026, 11, 30, 4, 58, 26, 123456, tzinfo=UTC)
    for workflow_id in ["plain", "with/slash & ?query=1", "ünïcødé", XSS]:
        assert views.decode_cursor(views.encode_cursor(when, workflow_id)) == (when, workflow_id)
    assert views.decode_cursor("not-a-cursor") is None


def test_live_status_change_reaches_the_fragment(app: pgdurable.App) -> None:
    app.enqueue("later", workflow_id="live-1", delay=3600)
    c = client(app)
    assert "st-waiting" in c.get("/workflow?id=live-1&fragment=1").text
    app.cancel("live-1")
    wait_for(lambda: "st-cancelled" in c.get("/workflow?id=live-1&fragment=1").text, WAIT, "the fragment to change")


def test_timeline_places_each_phase_on_one_axis() -> None:
    from pgdurable.monitoring import ExecutionDetail, StepDetail

    t0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)

    def at(seconds: float) -> str:
        return (t0 + timedelta(seconds=seconds)).isoformat()

    detail = ExecutionDetail({"id": "t", "status": "running", "created_at": at(0), "available_at": at(2),
                              "started_at": at(3)}, None, None)
    steps = [StepDetail({"step_id": 0, "step_name": "a", "attempts": 1, "started_at": at(3),
                         "completed_at": at(4)}, None, None),
             StepDetail({"step_id": 1, "step_name": "b", "attempts": 3, "recorded_by_attempt": 2,
                         "started_at": at(4), "completed_at": at(8)}, None, {"type": "E", "message": "m"})]
    drawn = views.timeline(detail, steps, now=t0 + timedelta(seconds=10))
    assert [(b.kind, b.label, round(b.x), round(b.width), b.seconds) for b in drawn.bars] == [
        ("delay", "delayed start", 0, 200, 2.0), ("queue", "in queue", 200, 100, 1.0),
        ("step", "a", 300, 100, 1.0), ("error", "b", 400, 400, 4.0), ("current", "running", 800, 200, 2.0)]
    assert drawn.bars[3].note == "3 attempts, recorded by attempt 2"
    assert drawn.total_seconds == 10 and drawn.ticks[-1] == (1000.0, "10.0 s")

    # Waiting after a step: available_at is the wake-up time now, not a delayed start.
    sleeping = ExecutionDetail({"id": "s", "status": "waiting", "created_at": at(0), "available_at": at(30),
                                "started_at": at(1), "wait_reason": "sleep"}, None, None)
    drawn = views.timeline(sleeping, steps[:1], now=t0 + timedelta(seconds=10))
    assert [(b.kind, b.label, round(b.x), round(b.width), b.note) for b in drawn.bars] == [
        ("queue", "in queue", 0, 100, ""), ("step", "a", 300, 100, ""),
        ("wait", "waiting for a durable sleep", 400, 600, "wakes in 20.0 s")]
    woken = ExecutionDetail({"id": "m", "status": "waiting", "created_at": at(0), "available_at": None,
                             "started_at": at(1), "wait_reason": "recv:go"}, None, None)
    assert views.timeline(woken, [], now=t0 + timedelta(seconds=10)).bars[-1].note == "until woken"
    assert views.wait_text("recv:") == "a message" and views.wait_text("later") == "later"


def test_metrics_endpoint_exposes_queue_gauges_behind_the_token(app: pgdurable.App) -> None:
    @app.workflow(queue="parked")
    def parked() -> None:
        return None

    app.enqueue(parked)
    app.enqueue(parked, delay=3600)
    open_client = client(app)
    body = open_client.get("/metrics").text
    assert 'pgdurable_queue_depth{queue="parked",status="enqueued"} 1.0' in body
    assert 'pgdurable_queue_depth{queue="parked",status="waiting"} 1.0' in body
    assert "pgdurable_queue_oldest_enqueued_seconds" in body
    guarded = TestClient(create_app(app, token="s3cret"), follow_redirects=False)  # not logged in
    assert guarded.get("/metrics").status_code in (302, 303, 401, 403)
    scraped = guarded.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert scraped.status_code == 200 and "pgdurable_queue_depth" in scraped.text
