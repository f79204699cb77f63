"""Searchable tags: given at enqueue (every creation path), added to by pgdurable.set_tags inside a workflow
(a step: written once), found by containment along a GIN index, refused with a clear error when invalid."""

from __future__ import annotations

import html
import json
import re
import warnings
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.dashboard import create_app
from pgdurable.sqlfiles import query
from tests.harness import WAIT, execution

with warnings.catch_warnings():  # starlette asks for the httpx2 fork; plain httpx works the same
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def test_enqueue_paths_store_tags_and_list_finds_them_by_containment(app: pgdurable.App,
                                                                   start_worker: Callable[..., Any]) -> None:
    @app.workflow()
    def kid(n: int) -> int:
        return n

    @app.workflow()
    def order(n: int) -> int:
        app.enqueue(kid, n, tags={"role": "child", "customer": str(n)})
        return n

    a = app.enqueue(order, 1, tags={"customer": "42", "region": "eu"})
    b = app.enqueue(order, 2, tags={"customer": "7"})
    many = app.enqueue_many(order, [(3,), (4,)], tags={"customer": "42", "batch": "b1"})
    app.enqueue(order, 5)
    assert execution(app, a.workflow_id).tags == {"customer": "42", "region": "eu"}
    assert execution(app, b.workflow_id).tags == {"customer": "7"}
    found = {e.id for e in app.list_workflows(tags={"customer": "42"})}
    assert found == {a.workflow_id, *(h.workflow_id for h in many)}
    assert {e.id for e in app.list_workflows(tags={"customer": "42", "region": "eu"})} == {a.workflow_id}
    assert {e.id for e in app.list_workflows(tags={"batch": "b1"}, limit=1)} <= {h.workflow_id for h in many}
    assert app.list_workflows(tags={"customer": "nobody"}) == []
    assert len(app.list_workflows(tags={})) == 5  # no tags: no filter

    start_worker(app)
    assert a.result(timeout=WAIT) == 1
    [(child_id, *_)] = app.children(a.workflow_id)
    assert execution(app, child_id).tags == {"role": "child", "customer": "1"}
    assert child_id in {c.id for c in app.list_workflows(tags={"role": "child", "customer": "1"})}

    started = app.start(kid, 9, tags={"via": "start"})
    assert started.result(timeout=WAIT) == 9
    assert [e.id for e in app.list_workflows(tags={"via": "start"})] == [started.workflow_id]


def test_set_tags_in_a_workflow_merges_once_and_replays(app: pgdurable.App,
                                                        start_worker: Callable[..., Any]) -> None:
    attempts: list[int] = []

    @app.step()
    def flaky() -> None:
        attempts.append(1)

    @app.workflow()
    def tagger() -> str:
        pgdurable.set_tags({"stage": "one", "keep": "yes"})
        flaky()
        pgdurable.set_tags({"stage": "two"})
        return "ok"

    @app.workflow()
    async def tagger_async() -> str:
        await pgdurable.set_tags_async({"async": "yes"})
        return "ok"

    start_worker(app)
    handle = app.enqueue(tagger, tags={"from": "enqueue"})
    assert handle.result(timeout=WAIT) == "ok"
    assert execution(app, handle.workflow_id).tags == {"from": "enqueue", "stage": "two", "keep": "yes"}
    steps = [s.step_name for s in app.steps(handle.workflow_id)]
    assert steps.count("pgdurable.set_tags") == 2
    assert app.enqueue(tagger_async).result(timeout=WAIT) == "ok"
    assert len(app.list_workflows(tags={"async": "yes"})) == 1

    # A fork replays the recorded steps before step 2: the first set_tags is not written again, the second is.
    fork = app.fork(handle.workflow_id, 2)
    assert fork.result(timeout=WAIT) == "ok"
    assert execution(app, fork.workflow_id).tags == {"from": "enqueue", "stage": "two", "keep": "yes"}


@pytest.mark.parametrize(("tags", "error", "match"), [
    ({"n": 42}, TypeError, "must be strings"),
    ({1: "x"}, TypeError, "must be strings"),
    (["customer", "42"], TypeError, "must be a dict"),
    ({"": "x"}, ValueError, "1 to 100 characters"),
    ({"k" * 101: "x"}, ValueError, "1 to 100 characters"),
    ({"k": "v" * 201}, ValueError, "at most 200 characters"),
    ({f"k{i}": "v" for i in range(33)}, ValueError, "at most 32 tags"),
    ({"k": "a\x00b"}, ValueError, "NUL"),
])
def test_invalid_tags_are_refused_before_anything_is_written(app: pgdurable.App, tags: Any, error: type,
                                                             match: str) -> None:
    @app.workflow()
    def job() -> None:
        return None

    with pytest.raises(error, match=match):
        app.enqueue(job, tags=tags)
    with pytest.raises(error, match=match):
        app.enqueue_many(job, [()], tags=tags)
    with pytest.raises(error, match=match):
        app.list_workflows(tags=tags)
    assert app.list_workflows() == []


def test_sql_api_takes_tags_and_old_calls_still_work(db: psycopg.Connection[Any]) -> None:
    [(new_id,)] = db.execute("SELECT enqueue_workflow('w', '{}', tags => '{\"customer\": \"42\"}')").fetchall()
    row = db.execute("SELECT tags::text FROM workflow_executions WHERE id = %s", (new_id,)).fetchone()
    assert row is not None and json.loads(row[0]) == {"customer": "42"}
    # a call written for the previous signature (11 arguments, positional) means what it meant
    [(old_id,)] = db.execute("SELECT enqueue_workflow('w', '{}', 'default', 'old-1', 0, NULL, NULL, 5, NULL, NULL, "
                             "NULL)").fetchall()
    assert old_id == "old-1"
    # and the previous release's insert function still inserts
    db.execute("SELECT * FROM insert_executions_v1('[{\"id\": \"v1\", \"name\": \"w\"}]')")
    assert db.execute("SELECT status FROM workflow_executions WHERE id = 'v1'").fetchone() == ("enqueued",)
    for bad in ('[1]', '{"n": 1}', '{"": "x"}', json.dumps({f"k{i}": "v" for i in range(33)})):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="tags must be"):
            db.execute("SELECT enqueue_workflow('w', '{}', tags => %s::jsonb)", (bad,))


def test_tag_search_uses_the_index_at_100k_executions(db: psycopg.Connection[Any]) -> None:
    db.execute("""
        SELECT count(*) FROM insert_executions_v2((
            SELECT jsonb_agg(jsonb_build_object(
                'id', 'e' || i, 'name', 'w', 'queue', 'q' || (i % 10),
                'tags', jsonb_build_object('customer', (i % 20000)::text, 'kind', 'k' || (i % 3))))
            FROM generate_series(1, 100000) AS i))""")
    db.execute("ANALYZE workflow_executions")
    params = {"tags": json.dumps({"customer": "123"}), "status": None, "name": None, "queue": None, "limit": 50}
    plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + query("list_executions_by_tags"), params).fetchall())
    assert "workflow_executions_tags_idx" in plan, plan
    rows = db.execute(query("list_executions_by_tags"), params).fetchall()
    assert len(rows) == 5
    # the dashboard's list, filtered by tags, finds them along the same index
    page = {"status": None, "name": None, "queue": None, "prefix": None, "since": "-infinity", "until": "infinity",
            "limit": 51, "parent": None, "tags": params["tags"]}
    plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + query("dash_list_first"), page).fetchall())
    assert "workflow_executions_tags_idx" in plan, plan


def test_cli_lists_by_tag(app: pgdurable.App, database_url: str, schema: str) -> None:
    @app.workflow()
    def job() -> None:
        return None

    app.enqueue(job, workflow_id="t-1", tags={"customer": "42", "tier": "gold"})
    app.enqueue(job, workflow_id="t-2", tags={"customer": "42"})
    app.enqueue(job, workflow_id="t-3", tags={"customer": "7"})

    def cli_list(*args: str) -> Any:
        return CliRunner().invoke(cli, ["workflows", "list", *args, "--database-url", database_url,
                                        "--schema", schema])

    listed = cli_list("--tag", "customer=42", "--json")
    assert listed.exit_code == 0, listed.output
    assert sorted(row["id"] for row in json.loads(listed.output)) == ["t-1", "t-2"]
    assert json.loads(listed.output)[0]["tags"]["customer"] == "42"
    both = cli_list("--tag", "customer=42", "--tag", "tier=gold", "--json")
    assert [row["id"] for row in json.loads(both.output)] == ["t-1"]
    bad = cli_list("--tag", "customer")
    assert bad.exit_code != 0 and "KEY=VALUE" in bad.output


def test_dashboard_filters_by_tags(app: pgdurable.App) -> None:
    app.enqueue("job", workflow_id="t-1", tags={"customer": "42", "tier": "gold"})
    app.enqueue("job", workflow_id="t-2", tags={"customer": "42"})
    app.enqueue("job", workflow_id="t-3")
    c = TestClient(create_app(app))

    def ids(tag: str) -> set[str]:
        page = c.get("/workflows", params={"tag": tag}).text
        return {html.unescape(m) for m in re.findall(r'<a class="mono" href="/workflow\?id=[^"]*" title="([^"]*)"',
                                                     page)}

    assert ids("customer=42") == {"t-1", "t-2"}
    assert ids(" customer = 42 , tier=gold ") == {"t-1"}
    assert ids("") == {"t-1", "t-2", "t-3"}
    bad = c.get("/workflows", params={"tag": "customer"}).text
    assert "is not key=value" in bad
    assert 'name="tag" value="customer=42"' in c.get("/workflows", params={"tag": "customer=42"}).text
    page = c.get("/workflow", params={"id": "t-1"}).text
    assert "<dt>tags</dt>" in page and "tier" in page and "gold" in page
