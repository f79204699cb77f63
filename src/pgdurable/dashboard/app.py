"""The dashboard as a Starlette application: server-rendered pages, partial fragments for live updates, and
the cancel / resume / fork actions. ``create_app`` is the factory; ``serve.py`` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .. import limits, monitoring, store
from ..errors import ConfigurationError, SchemaNotInstalled, WorkflowNotFound, migrate_command
from ..redaction import redact
from . import views
from .security import Guard, GuardMiddleware, Sessions, end_session, safe_next, same_origin, start_session

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("pgdurable.dashboard")
T = TypeVar("T")

PAGE_SIZE, MAX_PAGE_SIZE = 50, 200
# Live regions refresh this often (milliseconds).
OVERVIEW_REFRESH, LIST_REFRESH, WORKFLOW_REFRESH, SCHEDULES_REFRESH = 5000, 5000, 2000, 10000
OVERVIEW_CACHE_SECONDS = 2.0
_WITHIN = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
_NOTICES = {
    "cancelled": "Cancelled. A running execution stops at its next step.",
    "resumed": "Resumed: enqueued again; completed steps are kept.",
    "forked": "Forked: this new execution reuses the steps before the chosen one and runs from there.",
    "unchanged": "Nothing changed: the execution is no longer in a state that allows this.",
}
_FORM_LIMIT = 16 * 1024
# Below this many executions the overview counts them exactly; above, it shows the planner's estimate.
EXACT_COUNT_BELOW = 100_000
SCHEDULE_LIMIT = 500


class _Recent:
    """The last result of a computation, reused for a few seconds: every open overview polls, and they all
    show the same numbers, so many viewers cost the database what one does."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._value: tuple[float, Any] | None = None

    def get(self, compute: Callable[[], T]) -> T:
        with self._lock:  # one computation at a time; the others wait and reuse it
            if self._value is None or time.monotonic() - self._value[0] > self.seconds:
                self._value = (time.monotonic(), compute())
            value: T = self._value[1]
            return value


class _Reader:
    """Runs calls on one connection inside a read-only transaction with a statement timeout: a dashboard
    query can never write, nor keep the database busy for long."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def __call__(self, call: store.Call[T]) -> T:
        return store.run(self.conn, call)


def create_app(pgdurable_app: App, token: str | None = None, read_only: bool = False, *,
               allowed_hosts: Iterable[str] | None = None, statement_timeout_ms: int = 10_000,
               session_seconds: float = 12 * 3600) -> Starlette:
    """The dashboard for ``pgdurable_app``'s database and schema.

    Without ``token`` the dashboard is read-only (actions need a token); with one, every page needs it
    too, and a login lasts ``session_seconds`` (or until logout). ``allowed_hosts`` restricts the Host
    header (``serve`` passes the loopback names when bound to loopback, else the ``--allowed-host`` names).
    """
    guard = Guard(token, read_only, sessions=Sessions(session_seconds))
    app = pgdurable_app
    environment = jinja2.Environment(loader=jinja2.PackageLoader("pgdurable.dashboard", "templates"),
                                     autoescape=True, undefined=jinja2.StrictUndefined)
    environment.filters.update(duration=views.duration, utc=views.utc, iso=views.iso, size=views.size,
                               status_class=views.status_class, json_html=views.json_html,
                               as_text=views.as_text, wait_text=views.wait_text)
    environment.globals.update(url=views.url, ago=views.ago, between=views.between, wait_kinds=monitoring.WAIT_KINDS)
    templates = Jinja2Templates(env=environment)

    @contextlib.contextmanager
    def reading() -> Iterator[_Reader]:
        with app.db.pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(statement_timeout_ms),))
            yield _Reader(conn)

    def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
        nonce = request.state.csrf_nonce
        base = {
            "schema": app.schema, "guard": guard,
            "csrf": guard.csrf_token(nonce) if nonce else "", "path": request.url.path,
            "logged_in": guard.login_required and guard.authenticated(request),
        }
        return templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)

    def fragment(request: Request) -> bool:
        return request.query_params.get("fragment") == "1"

    # ---- pages ----------------------------------------------------------------------------------------

    cache = _Recent(OVERVIEW_CACHE_SECONDS)

    def overview(request: Request) -> Response:
        context = cache.get(overview_data)
        return render(request, "_overview.html" if fragment(request) else "overview.html", context)

    def overview_data() -> dict[str, Any]:
        with reading() as read:
            now = read(monitoring.now())
            queues = read(monitoring.queues())
            workers = read(monitoring.workers())
            outcomes = read(monitoring.outcomes())
            unrunnable = read(monitoring.unrunnable(20))
            unrunnable_count = read(monitoring.unrunnable_count()) if len(unrunnable) == 20 else len(unrunnable)
            stored = read(monitoring.estimated_rows(app.schema))
            exact = stored < EXACT_COUNT_BELOW
            if exact:  # small (or never analyzed): count, but never past the cap
                stored = read(monitoring.count_capped(EXACT_COUNT_BELOW))
                exact = stored < EXACT_COUNT_BELOW
        chart = views.outcome_chart(outcomes, now)
        active = {"enqueued": sum(q.enqueued for q in queues), "waiting": sum(q.waiting for q in queues),
                  "running": sum(q.running for q in queues)}
        return {
            "now": now, "queues": queues, "workers": workers, "chart": chart, "active": active,
            "unrunnable": unrunnable, "unrunnable_count": unrunnable_count,
            "stored": stored, "stored_exact": exact, "refresh": OVERVIEW_REFRESH,
            "live_url": views.url("/", fragment=1),
        }

    def workflows(request: Request) -> Response:
        params = request.query_params
        search = (params.get("q") or "").strip()
        limit = _int(params.get("limit"), PAGE_SIZE, 1, MAX_PAGE_SIZE)
        problems: list[str] = []
        with reading() as read:
            now = read(monitoring.now())
            if search and not fragment(request) and read(monitoring.exists(search)):
                return RedirectResponse(views.url("/workflow", id=search), status_code=303)
            since, until = _time_range(params, now, problems)
            where = monitoring.ListFilter(status=params.get("status") or None, name=params.get("name") or None,
                                          queue=params.get("queue") or None, id_prefix=search or None,
                                          since=since, until=until, parent=params.get("parent") or None,
                                          tags=_tags(params.get("tag"), problems))
            before, after = views.decode_cursor(params.get("before")), views.decode_cursor(params.get("after"))
            rows: list[monitoring.ListedExecution] = []
            has_newer = has_older = False
            if after is not None:
                rows = read(monitoring.list_page(where, newer_than=after, limit=limit + 1))
                has_newer = len(rows) > limit
                rows = rows[-limit:]
                has_older = True
                if not has_newer:  # back at the top: show the first page as it is now
                    after, rows = None, []
            if after is None:
                rows = read(monitoring.list_page(where, older_than=before, limit=limit + 1))
                has_older = len(rows) > limit
                rows = rows[:limit]
                has_newer = before is not None
            queues = read(monitoring.queues())
            names = read(monitoring.known_names())
        filters = {k: params.get(k) for k in ("status", "name", "queue", "q", "within", "from", "to", "parent",
                                              "tag")}
        if limit != PAGE_SIZE:
            filters["limit"] = str(limit)
        cursor = {"before": params.get("before"), "after": params.get("after") if after is not None else None}
        context = {
            "now": now, "rows": rows, "filters": filters, "problems": problems,
            "older_url": views.url("/workflows", **filters, before=views.encode_cursor(
                rows[-1].created_at, rows[-1].id)) if has_older and rows else None,
            "newer_url": views.url("/workflows", **filters, after=views.encode_cursor(
                rows[0].created_at, rows[0].id)) if has_newer and rows else None,
            "first_url": views.url("/workflows", **filters) if has_newer else None,
            "statuses": _statuses(), "queue_names": [q.queue for q in queues], "names": names,
            "refresh": LIST_REFRESH, "live_url": views.url("/workflows", **filters, **cursor, fragment=1),
            "within_options": list(_WITHIN),
            "without_parent_url": views.url("/workflows", **{**filters, "parent": None}),
        }
        return render(request, "_workflows.html" if fragment(request) else "workflows.html", context)

    def workflow(request: Request) -> Response:
        workflow_id = request.query_params.get("id", "")
        with reading() as read:
            now = read(monitoring.now())
            detail = read(monitoring.execution(workflow_id)) if workflow_id else None
            if detail is None:
                return render(request, "missing.html", {"workflow_id": workflow_id}, status_code=404)
            steps = read(monitoring.steps(workflow_id))
            given = None if fragment(request) else read(monitoring.execution_input(workflow_id))
            children = monitoring.Children([], read(monitoring.children_counts(workflow_id)))
            if children.total:
                children = monitoring.Children(read(monitoring.children(workflow_id)), children.by_status)
            total, pending = read(monitoring.message_counts(workflow_id))
            messages = monitoring.Messages(read(monitoring.messages(workflow_id)) if total else [], total, pending)
            latest = read(monitoring.events_latest(workflow_id))
            events = monitoring.Events(latest, read(monitoring.events_history(workflow_id)) if latest else [])
            keys = read(monitoring.stream_keys(workflow_id))
            streams = [read(monitoring.stream_values(workflow_id, key)) for key in keys]
        finished = detail.status in store.executions.TERMINAL
        context = {
            "now": now, "e": detail, "steps": steps, "input": given, "finished": finished,
            "children": children, "messages": messages, "events": events, "streams": streams,
            "first_failed": next((s.step_id for s in steps if s.error), None),
            "timeline": views.timeline(detail, steps, now), "extras": views.detail_extras(detail),
            "notice": _NOTICES.get(request.query_params.get("notice", "")),
            "refresh": WORKFLOW_REFRESH, "live_url": views.url("/workflow", id=workflow_id, fragment=1),
            "step_limit": monitoring.MAX_STEPS, "count_cap": monitoring.COUNT_CAP,
        }
        return render(request, "_workflow.html" if fragment(request) else "workflow.html", context)

    def schedules(request: Request) -> Response:
        with reading() as read:
            now = read(monitoring.now())
            rows = read(monitoring.schedules(SCHEDULE_LIMIT + 1))
        context = {"now": now, "rows": rows[:SCHEDULE_LIMIT], "more": len(rows) > SCHEDULE_LIMIT,
                   "refresh": SCHEDULES_REFRESH, "live_url": views.url("/schedules", fragment=1)}
        return render(request, "_schedules.html" if fragment(request) else "schedules.html", context)

    def payload(request: Request) -> Response:
        workflow_id, column = request.query_params.get("id", ""), request.query_params.get("column", "")
        if column not in ("input", "output", "error"):
            return PlainTextResponse("column must be input, output or error", status_code=400)
        with reading() as read:
            text = read(monitoring.payload(workflow_id, column))
        if text is None:
            return PlainTextResponse("no such execution or value", status_code=404)
        return Response(text, media_type="application/json")

    def health(request: Request) -> Response:
        with reading() as read:
            read(monitoring.now())
        return PlainTextResponse("ok")

    # ---- login ----------------------------------------------------------------------------------------

    async def login(request: Request) -> Response:
        target = safe_next(request.query_params.get("next"))
        if not guard.login_required:
            return RedirectResponse(target, status_code=303)
        if request.method == "GET":
            return render(request, "login.html", {"next": target, "failed": False})
        form = await _form(request)
        if form is None or not same_origin(request) or not guard.csrf_valid(request, form.get("csrf")):
            return PlainTextResponse("stale or forged form: reload the page", status_code=403)
        refused = guard.check_token(request, form.get("token"))
        if refused is not None:
            if refused.status_code == 429:
                return refused
            return render(request, "login.html", {"next": target, "failed": True}, status_code=401)
        response = RedirectResponse(target, status_code=303)
        start_session(response, request, guard)
        return response

    async def logout(request: Request) -> Response:
        form = await _form(request)
        if form is None or not guard.csrf_valid(request, form.get("csrf")):
            return PlainTextResponse("stale or forged form: reload the page", status_code=403)
        response = RedirectResponse("/login", status_code=303)
        end_session(response, request, guard)  # the session is gone on the server: an old cookie is worthless
        return response

    # ---- actions --------------------------------------------------------------------------------------

    async def act(request: Request) -> Response:
        verb = request.path_params["verb"]
        if not guard.actions_enabled:
            return PlainTextResponse("actions are disabled: the dashboard is read-only", status_code=403)
        if not same_origin(request):
            return PlainTextResponse("cross-origin request refused", status_code=403)
        form = await _form(request)
        if form is None or not guard.csrf_valid(request, form.get("csrf")):
            return PlainTextResponse("missing or stale CSRF token: reload the page and try again", status_code=403)
        workflow_id = form.get("id", "")
        if not workflow_id:
            return PlainTextResponse("which execution?", status_code=400)
        target = workflow_id
        if verb == "cancel":
            done = await run_in_threadpool(app.cancel, workflow_id)
        elif verb == "resume":
            done = await run_in_threadpool(app.resume, workflow_id)
        elif verb == "fork":
            step = _int(form.get("from_step"), -1, 0, 2**31 - 1)
            if step < 0:
                return PlainTextResponse("from_step must be a step number", status_code=400)
            try:
                forked = await run_in_threadpool(app.fork, workflow_id, step)
            except WorkflowNotFound:
                return PlainTextResponse("no such execution", status_code=404)
            except ValueError as exc:  # a step past the recorded ones
                return PlainTextResponse(str(exc), status_code=400)
            target, done = forked.workflow_id, True
        else:
            return PlainTextResponse("unknown action", status_code=404)
        log.info("dashboard: %s %s -> %s", verb, workflow_id, "done" if done else "unchanged")
        notice = {"cancel": "cancelled", "resume": "resumed", "fork": "forked"}[verb] if done else "unchanged"
        return RedirectResponse(views.url("/workflow", id=target, notice=notice), status_code=303)

    # ---- errors ---------------------------------------------------------------------------------------

    def database_error(request: Request, exc: Exception) -> Response:
        status_code = 503
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction | SchemaNotInstalled):
            message = (f"pgdurable's tables are not in schema {app.schema!r} of this database. "
                       f"Check --schema, or run `{migrate_command(app.schema)}`.")
        elif isinstance(exc, psycopg.errors.QueryCanceled):
            message = "The query took too long and was stopped. Narrow the filters (a time range helps)."
        elif isinstance(exc, psycopg.OperationalError):
            message = "The database cannot be reached right now; this page retries on its own."
        elif isinstance(exc, ConfigurationError):
            message = f"The dashboard cannot use this database: {redact(str(exc))}"
        else:  # not the database's state: a bug, or a schema this dashboard does not understand
            status_code, message = 500, f"The database refused a dashboard query ({type(exc).__name__})."
            log.error("dashboard: %s", request.url.path, exc_info=exc)
        if status_code == 503:
            log.warning("dashboard: %s: %s", request.url.path, exc)
        if fragment(request):
            return PlainTextResponse(message, status_code=status_code)
        return render(request, "error.html", {"message": message}, status_code=status_code)

    # Prometheus exposition of the database-wide gauges (queue depth by status, oldest enqueued age), when
    # the metrics extra is installed. Behind the token like every page (scrape with a bearer token).
    metrics_registry = _metrics_registry(app)

    async def metrics(request: Request) -> Response:
        if metrics_registry is None:
            return PlainTextResponse("metrics need the metrics extra: pip install 'pgdurable[metrics]'",
                                     status_code=404)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = await asyncio.to_thread(generate_latest, metrics_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/", overview),
        Route("/metrics", metrics),
        Route("/workflows", workflows),
        Route("/workflow", workflow),
        Route("/workflow/payload", payload),
        Route("/schedules", schedules),
        Route("/workflow/{verb}", act, methods=["POST"]),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", health),
        Mount("/static", StaticFiles(packages=[("pgdurable.dashboard", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(GuardMiddleware, guard=guard, allowed_hosts=allowed_hosts)],
        exception_handlers={psycopg.Error: database_error, ConfigurationError: database_error},
    )


def _metrics_registry(app: App) -> Any:
    try:
        from ..metrics import PrometheusMetrics
    except ImportError:
        return None
    return PrometheusMetrics(app).registry


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(text or ""), low), high)
    except ValueError:
        return default


async def _form(request: Request) -> dict[str, str] | None:
    """A small urlencoded form (no multipart parser needed); None if it is not one or is too big."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_LIMIT:
            return None
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}


def _statuses() -> list[str]:
    # The statuses the engine writes; any other can still be typed into the URL.
    return ["enqueued", "waiting", "running", "succeeded", "failed", "cancelled"]


def _tags(text: str | None, problems: list[str]) -> str | None:
    """The tag filter "customer=42, tier=gold" as the JSON object the list query takes; a problem if invalid."""
    if not text or not text.strip():
        return None
    tags: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip():
            problems.append(f"tags: {item.strip()!r} is not key=value; the tag filter was ignored")
            return None
        tags[key.strip()] = value.strip()
    try:
        limits.tags(tags)
    except (TypeError, ValueError) as exc:
        problems.append(f"tags: {exc}; the tag filter was ignored")
        return None
    return json.dumps(tags)


def _time_range(params: Any, now: datetime, problems: list[str]) -> tuple[datetime | None, datetime | None]:
    since = until = None
    within = params.get("within")
    if within in _WITHIN:
        since = now - timedelta(seconds=_WITHIN[within])
    for key in ("from", "to"):
        text = (params.get(key) or "").strip()
        if not text:
            continue
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            problems.append(f"{key!r} is not a date and time (YYYY-MM-DDTHH:MM, UTC)")
            continue
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
        if key == "from":
            since = max(since, when) if since else when
        else:
            until = when
    return since, until

