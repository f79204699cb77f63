"""The dashboard's views against a real PostgreSQL: overview, filters, keyset paging, the workflow page,
escaping of hostile strings, login, CSRF, read-only mode and actions."""

from __future__ import annotations

import html
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

import pgdurable
from pgdurable import store
from pgdurable.cli import cli
from pgdurable.dashboard import create_app, views
from pgdurable.dashboard.serve import LOOPBACK_HOSTS, DashboardOptionsError, check_options
from pgdurable.sqlfiles import query

from .harness import wait_for

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


@pytest.fixture
def db(database_url: str, schema: str, app: pgdurable.App) -> Iterator[psycopg.Connection[Any]]:
    app.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


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
        app.enqueue(ok, n).result(timeout=10)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(broken).result(timeout=10)
    app.enqueue(ok, 9, delay=3600)

    page = client(app).get("/")
    assert page.status_code == 200
    text = page.text
    assert "<h1>Overview</h1>" in text
    assert runner.worker.id[:36] in text
    assert re.search(r'<a class="mono" href="/workflows\?queue=default">default</a>', text)
    cards = dict(re.findall(r'badge st-(\w+)">\w+</span></div>\s*<div class="card-value">([\d,]+)<', text))
    assert cards == {"enqueued": "1", "running": "0", "succeeded": "3", "failed": "1"}
    assert re.search(r"<title>\d\d:\d\d UTC: 3 succeeded, 1 failed</title>", text)
    assert "No live worker can run these" not in text

    fragment = client(app).get("/?fragment=1")
    assert fragment.status_code == 200
    assert "<html" not in fragment.text and "Finished per minute" in fragment.text


def test_overview_lists_work_no_live_worker_can_run(app: pgdurable.App) -> None:
    app.enqueue("nobody_knows_me", workflow_id="orphan-1", queue="lonely")
    text = client(app).get("/").text
    assert "No live worker can run these" in text
    assert "orphan-1" in text and "no live worker serves queue lonely" in text


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
    assert ids(status="waiting") == set()  # statuses are data: one the engine adds later can be asked for


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
            "until": "infinity", "limit": 51}
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
    app.enqueue(checkout, 42, workflow_id="order-42").result(timeout=10)
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
        app.enqueue(doomed, workflow_id="doomed-1").result(timeout=10)
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


def test_hostile_strings_are_escaped_on_every_page(app: pgdurable.App, start_worker: Callable[..., Any]) -> None:
    @app.step(name=XSS_IMG, max_attempts=1)
    def step(text: str) -> str:
        raise ValueError(f"bad input {text}")

    @app.workflow(name=XSS)
    def hostile(text: str) -> None:
        step(text)

    start_worker(app)
    with pytest.raises(pgdurable.WorkflowFailed):
        app.enqueue(hostile, XSS, workflow_id=f"id-{XSS_IMG}").result(timeout=10)
    # A worker whose queue list says <script> (queue names of executions are checked by the schema, the
    # workers table is not), and an unrunnable execution whose name is hostile.
    app.db.run(store.register_worker(id=XSS, hostname=XSS_IMG, pid=1, queues=[XSS], workflows=[XSS],
                                     concurrency=1))
    app.enqueue(XSS_IMG, workflow_id=XSS, queue="nobody")
    c = client(app, token=TOKEN)
    hostile_query = {"status": XSS, "name": XSS, "queue": XSS_IMG, "q": XSS, "from": XSS}
    pages = [
        c.get("/"), c.get("/?fragment=1"), c.get("/workflows"), c.get("/workflows", params=hostile_query),
        c.get("/workflows", params={**hostile_query, "fragment": "1"}),
        c.get("/workflow", params={"id": f"id-{XSS_IMG}"}), c.get("/workflow", params={"id": XSS}),
        c.get("/workflow", params={"id": f"id-{XSS_IMG}", "fragment": "1"}),
        c.get("/workflow", params={"id": "<b>missing</b>"}), c.get("/login?next=" + XSS),
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


# ---- access and actions -----------------------------------------------------------------------------------

def test_without_a_token_the_dashboard_is_read_only(app: pgdurable.App) -> None:
    app.enqueue("later", workflow_id="w-1", delay=3600)
    c = client(app)
    page = c.get("/workflow", params={"id": "w-1"}).text
    assert "cancel-button" not in page and ">read-only<" in page
    refused = c.post("/workflow/cancel", data={"id": "w-1", "csrf": "x"})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert app.get("w-1").status == "enqueued"  # type: ignore[union-attr]

    read_only = client(app, token=TOKEN, read_only=True)
    page = read_only.get("/workflow", params={"id": "w-1"}).text
    assert "cancel-button" not in page
    refused = read_only.post("/workflow/cancel", data={"id": "w-1", "csrf": csrf_of(page)})  # logout's token
    assert refused.status_code == 403 and "read-only" in refused.text
    assert app.get("w-1").status == "enqueued"  # type: ignore[union-attr]


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
    app.enqueue("later", workflow_id="c-1", delay=3600)
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
    assert app.get("c-1").status == "enqueued"  # type: ignore[union-attr]

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
        app.enqueue(job, workflow_id="r-1").result(timeout=10)
    c = client(app, token=TOKEN)
    page = c.get("/workflow", params={"id": "r-1"}).text
    assert 'id="resume-button"' in page and "cancel-button" not in page
    fixed.set()
    done = c.post("/workflow/resume", data={"id": "r-1", "csrf": csrf_of(page)})
    assert done.headers["location"] == "/workflow?id=r-1&notice=resumed"
    assert app.handle("r-1").result(timeout=10) == "fine"


class ForkingApp(pgdurable.App):
    """Stands in for the App.fork that the engine is adding: starts a real new execution."""

    forked: list[tuple[str, int]] = []

    def fork(self, workflow_id: str, from_step: int) -> pgdurable.WorkflowHandle[Any]:
        self.forked.append((workflow_id, from_step))
        return self.enqueue("forked", workflow_id=f"{workflow_id}-fork", delay=3600)


def test_fork_is_offered_only_when_the_app_can_fork(app: pgdurable.App, database_url: str, schema: str) -> None:
    app.enqueue("original", workflow_id="f-1", delay=3600)
    assert "fork-button" not in client(app, token=TOKEN).get("/workflow", params={"id": "f-1"}).text
    forking = ForkingApp(database_url, schema=schema)
    try:
        c = client(forking, token=TOKEN)
        page = c.get("/workflow", params={"id": "f-1"}).text
        assert 'id="fork-button"' in page and '<option value="0">the start</option>' in page
        assert c.post("/workflow/fork", data={"id": "f-1", "csrf": csrf_of(page), "from_step": "x"}
                      ).status_code == 400
        done = c.post("/workflow/fork", data={"id": "f-1", "csrf": csrf_of(page), "from_step": "0"})
        assert done.headers["location"] == "/workflow?id=f-1-fork&notice=forked"
        assert forking.forked == [("f-1", 0)] and forking.get("f-1-fork") is not None
        read_only = client(forking, token=TOKEN, read_only=True)
        assert "fork-button" not in read_only.get("/workflow", params={"id": "f-1"}).text
    finally:
        forking.close()


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
    assert check_options("0.0.0.0", None, True) is None  # read-only, explicitly
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
    assert "st-enqueued" in c.get("/workflow?id=live-1&fragment=1").text
    app.cancel("live-1")
    wait_for(lambda: "st-cancelled" in c.get("/workflow?id=live-1&fragment=1").text, 5, "the fragment to change")


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
