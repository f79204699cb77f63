"""Dashboard sessions, token backoff and Host checks: a login is a random server-side session that logout
ends (the old cookie, and a cookie derived from the token, are worthless), sessions expire, repeated wrong
tokens are answered 429 with a doubling delay per client address, and a read-only dashboard off loopback
needs --allowed-host (or a token) and refuses other Host headers."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import warnings
from typing import Any

import pytest
from typer.testing import CliRunner

import pgdurable
from pgdurable.cli import cli
from pgdurable.dashboard import create_app
from pgdurable.dashboard.security import SESSION_COOKIE, Sessions, Throttle
from pgdurable.dashboard.serve import LOOPBACK_HOSTS, DashboardOptionsError, allowed_host_names, check_options

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "s3cret-token"


def _login(dashboard: Any, address: str = "testclient", *, check: bool = True) -> TestClient:
    """Log in with the token; ``check``: and see that the session cookie opens a page (not for a session so
    short that a busy machine may outlive it before the next request)."""
    c = TestClient(dashboard, follow_redirects=False, client=(address, 50000))
    response = c.get(f"/workflows?token={TOKEN}")
    assert response.status_code == 303, response.text
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "max-age=" in cookie
    if check:
        assert c.get("/workflows").status_code == 200
    return c


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found
    return found.group(1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_logout_ends_the_session_on_the_server(app: pgdurable.App) -> None:
    dashboard = create_app(app, token=TOKEN)
    c = _login(dashboard)
    session = c.cookies[SESSION_COOKIE]
    assert len(session) >= 40 and TOKEN not in session
    out = c.post("/logout", data={"csrf": _csrf(c.get("/").text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert c.get("/workflows").status_code == 303  # to the login page

    stolen = TestClient(dashboard, follow_redirects=False)  # the old cookie, replayed after logout
    stolen.cookies.set(SESSION_COOKIE, session)
    assert stolen.get("/workflows").status_code == 303
    assert stolen.get("/?fragment=1").status_code == 401


def test_sessions_are_random_per_login_and_not_derived_from_the_token(app: pgdurable.App) -> None:
    dashboard = create_app(app, token=TOKEN)
    first, second = _login(dashboard), _login(dashboard)
    assert first.cookies[SESSION_COOKIE] != second.cookies[SESSION_COOKIE]
    # the old scheme's cookie (an HMAC of the token) opens nothing
    forged = hmac.new(TOKEN.encode(), b"pgdurable dashboard session", hashlib.sha256).hexdigest()
    c = TestClient(dashboard, follow_redirects=False)
    c.cookies.set(SESSION_COOKIE, forged)
    assert c.get("/workflows").status_code == 303
    # a session of one dashboard process is worth nothing to another with the same token
    other = TestClient(create_app(app, token=TOKEN), follow_redirects=False)
    other.cookies.set(SESSION_COOKIE, first.cookies[SESSION_COOKIE])
    assert other.get("/workflows").status_code == 303


def test_an_old_session_cookie_expires(app: pgdurable.App) -> None:
    c = _login(create_app(app, token=TOKEN, session_seconds=0.5), check=False)  # valid, then not: Sessions below
    deadline = time.monotonic() + 30
    while c.get("/?fragment=1").status_code == 200:  # expires after 0.5 s, however slow the machine
        assert time.monotonic() < deadline, "the session never expired"
        time.sleep(0.2)
    assert c.get("/workflows").status_code == 303

    clock = Clock()
    sessions = Sessions(lifetime_seconds=60, limit=3, clock=clock)
    kept = sessions.create()
    clock.now += 59
    assert sessions.valid(kept)
    clock.now += 2
    assert not sessions.valid(kept) and len(sessions) == 0
    many = [sessions.create() for _ in range(4)]  # over the limit: the oldest goes
    assert not sessions.valid(many[0]) and all(sessions.valid(s) for s in many[1:])
    sessions.revoke(many[1])
    assert not sessions.valid(many[1]) and not sessions.valid(None) and not sessions.valid("")


def test_wrong_tokens_are_backed_off_per_client_address(app: pgdurable.App) -> None:
    dashboard = create_app(app, token=TOKEN)
    attacker = TestClient(dashboard, follow_redirects=False, client=("203.0.113.7", 1234))
    csrf = _csrf(attacker.get("/login").text)
    codes = [attacker.post("/login", data={"token": f"guess-{i}", "csrf": csrf}).status_code for i in range(5)]
    assert codes == [401] * 5
    refused = attacker.post("/login", data={"token": "guess-6", "csrf": csrf})
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    # while backed off even the right token is refused, by every way of giving it
    assert attacker.post("/login", data={"token": TOKEN, "csrf": csrf}).status_code == 429
    assert attacker.get(f"/?token={TOKEN}").status_code == 429
    assert attacker.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 429
    # another address is not affected
    assert _login(dashboard, address="198.51.100.2").get("/").status_code == 200
    # wrong bearer tokens count too
    scraper = TestClient(dashboard, follow_redirects=False, client=("192.0.2.9", 1))
    codes = [scraper.get("/metrics", headers={"authorization": "Bearer nope"}).status_code for _ in range(6)]
    assert codes == [401] * 5 + [429]


def test_the_backoff_doubles_and_a_quiet_window_forgives() -> None:
    clock = Clock()
    throttle = Throttle(free=2, window_seconds=60, max_delay_seconds=8, clock=clock)
    assert [throttle.failed("a"), throttle.failed("a")] == [0, 0]
    assert throttle.failed("a") == 1 and throttle.retry_after("a") == 1
    clock.now += 1
    assert throttle.retry_after("a") == 0
    assert [throttle.failed("a") for _ in range(4)] == [2, 4, 8, 8]  # doubling, capped
    assert throttle.retry_after("b") == 0
    clock.now += 61
    assert throttle.failed("a") == 0  # after a quiet window the count starts again
    throttle.succeeded("a")
    assert throttle.retry_after("a") == 0


def test_a_read_only_dashboard_off_loopback_needs_allowed_hosts_or_a_token() -> None:
    with pytest.raises(DashboardOptionsError, match="--allowed-host"):
        check_options("0.0.0.0", None, True)
    with pytest.raises(DashboardOptionsError, match="needs --token"):
        check_options("192.0.2.1", None, False, ["dash.internal"])
    with pytest.raises(DashboardOptionsError, match="not a host name"):
        check_options("0.0.0.0", None, True, ["http://x/"])
    assert check_options("0.0.0.0", None, True, ["dash.internal"]) is None
    assert check_options("0.0.0.0", "t", True) == "t"  # a token guards it under any name
    assert check_options("127.0.0.1", None, True) is None
    result = CliRunner().invoke(cli, ["dashboard", "--host", "0.0.0.0", "--read-only",
                                      "--database-url", "postgresql://unused"])
    assert result.exit_code == 2 and "--allowed-host" in result.output
    assert allowed_host_names("0.0.0.0", []) is None
    assert allowed_host_names("0.0.0.0", ["Dash.Internal", "other.example:8080", "::1"]) == (
        "dash.internal", "other.example", "::1")
    assert allowed_host_names("127.0.0.1", ["dash.internal"]) == (*LOOPBACK_HOSTS, "dash.internal")


def test_only_allowed_host_headers_are_answered(app: pgdurable.App) -> None:
    c = TestClient(create_app(app, read_only=True, allowed_hosts=allowed_host_names("0.0.0.0", ["dash.internal"])))
    assert c.get("/", headers={"host": "dash.internal"}).status_code == 200
    assert c.get("/", headers={"host": "dash.internal:8080"}).status_code == 200
    assert c.get("/", headers={"host": "DASH.internal:8080"}).status_code == 200
    for rebound in ("rebound.evil.example", "dash.internal.evil.example", "127.0.0.1:8080", ""):
        response = c.get("/", headers={"host": rebound})
        assert response.status_code == 400 and "Host" in response.text, rebound
