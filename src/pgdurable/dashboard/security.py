"""Who may see the dashboard and act through it.

- With a token, every page needs it: typed on /login, given once as ``?token=`` (the link the command
  prints), or sent as ``Authorization: Bearer``. A login makes a random server-side session (``Sessions``:
  kept in this process's memory with an expiry, deleted on logout); the browser holds only its random id in
  an HttpOnly, SameSite=Strict cookie (Secure over https). Logging out, the session's expiry or a restart
  ends it; a session id is worth nothing to another dashboard process.
- Wrong tokens are throttled per client address (``Throttle``): after a few failures within a window every
  further attempt, right or wrong, is answered 429 for a delay that doubles with each new failure.
- Actions exist only with a token and without read-only mode. Each action form carries a CSRF token, an
  HMAC of a random per-browser cookie under a per-process secret: another site can neither read nor forge
  it. A cross-origin ``Origin`` header is refused as well, and cookies are SameSite=Strict.
- Only the allowed Host headers are accepted (loopback names when bound to loopback, the ``--allowed-host``
  names otherwise), so a DNS-rebinding page cannot read it.
- Every response forbids framing (clickjacking) and carries a CSP that allows only the dashboard's own
  scripts and styles.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_COOKIE = "pgdurable_session"
CSRF_COOKIE = "pgdurable_csrf"

HEADERS = {
    "content-security-policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # same-origin, not no-referrer: with no-referrer, browsers send "Origin: null" on our own form posts.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

# Paths that need no session: the login page, the static files it uses, and the health check.
_PUBLIC = ("/login", "/static/", "/healthz")


class Sessions:
    """Random session ids with an expiry, in memory: revocable (logout), and gone with the process."""

    def __init__(self, lifetime_seconds: float = 12 * 3600, limit: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime_seconds = lifetime_seconds
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}  # session id -> when it expires (insertion order: oldest first)

    def create(self) -> str:
        session = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            for old in [k for k, expires in self._expiry.items() if expires <= now]:
                del self._expiry[old]
            while len(self._expiry) >= self.limit:  # full of live sessions: the oldest goes
                del self._expiry[next(iter(self._expiry))]
            self._expiry[session] = now + self.lifetime_seconds
        return session

    def valid(self, session: str | None) -> bool:
        if not session:
            return False
        with self._lock:
            expires = self._expiry.get(session)
            if expires is None:
                return False
            if expires <= self._clock():
                del self._expiry[session]
                return False
            return True

    def revoke(self, session: str | None) -> None:
        if session:
            with self._lock:
                self._expiry.pop(session, None)

    def __len__(self) -> int:
        return len(self._expiry)


class Throttle:
    """Backs off clients that send wrong tokens: after ``free`` failures (per client address; a quiet
    ``window_seconds`` forgives them), each further failure locks the address out for twice as long as the
    last (1 s, 2 s, 4 s... up to ``max_delay_seconds``); while locked out every attempt is refused (429)
    without being checked."""

    def __init__(self, free: int = 5, window_seconds: float = 300.0, max_delay_seconds: float = 300.0,
                 limit: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.free = free
        self.window_seconds = window_seconds
        self.max_delay_seconds = max_delay_seconds
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[int, float, float]] = {}  # address -> (failures, last failure, locked until)

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        with self._lock:
            state = self._state.get(address)
            return max(0.0, state[2] - self._clock()) if state else 0.0

    def failed(self, address: str) -> float:
        """Record a wrong token; returns the lock-out it earned (0 while within the free attempts)."""
        now = self._clock()
        with self._lock:
            failures, last, _ = self._state.get(address, (0, now, 0.0))
            if now - last > self.window_seconds:
                failures = 0  # a quiet window forgives
            failures += 1
            delay = 0.0
            if failures > self.free:
                delay = min(self.max_delay_seconds, 2.0 ** (failures - self.free - 1))
            if address not in self._state and len(self._state) >= self.limit:
                self._forget_oldest(now)
            self._state[address] = (failures, now, now + delay)
            return delay

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._state.pop(address, None)

    def _forget_oldest(self, now: float) -> None:
        idle = [a for a, (_, last, until) in self._state.items()
                if until <= now and now - last > self.window_seconds]
        for address in idle or list(self._state)[: max(1, len(self._state) // 10)]:
            del self._state[address]


class Guard:
    def __init__(self, token: str | None, read_only: bool, *, sessions: Sessions | None = None,
                 throttle: Throttle | None = None) -> None:
        if token is not None and not token.strip():
            raise ValueError("the dashboard token must not be empty")
        self.token = token
        self.read_only = read_only
        self.sessions = sessions if sessions is not None else Sessions()
        self.throttle = throttle if throttle is not None else Throttle()
        self._secret = secrets.token_bytes(32)

    @property
    def actions_enabled(self) -> bool:
        return self.token is not None and not self.read_only

    @property
    def login_required(self) -> bool:
        return self.token is not None

    def token_matches(self, given: str | None) -> bool:
        return (self.token is not None and given is not None
                and hmac.compare_digest(given.encode(), self.token.encode()))

    def check_token(self, request: Request, given: str | None) -> Response | None:
        """None if ``given`` is the token; else the response refusing it (401, or 429 while this client
        is backed off). Every wrong token counts against the client's address."""
        address = client_address(request)
        wait = self.throttle.retry_after(address)
        if wait > 0:
            return too_many(wait)
        if self.token_matches(given):
            self.throttle.succeeded(address)
            return None
        wait = self.throttle.failed(address)
        if wait > 0:
            return too_many(wait)
        return PlainTextResponse("wrong token", status_code=401)

    def authenticated(self, request: Request) -> bool:
        """A live session cookie (a bearer token is checked, and throttled, by the middleware)."""
        if self.token is None:
            return True
        return self.sessions.valid(request.cookies.get(SESSION_COOKIE))

    def csrf_token(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, request: Request, submitted: str | None) -> bool:
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce or not submitted:
            return False
        return hmac.compare_digest(submitted.encode(), self.csrf_token(nonce).encode())


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def too_many(wait: float) -> Response:
    seconds = max(1, math.ceil(wait))
    return PlainTextResponse(f"too many wrong tokens: try again in {seconds} s", status_code=429,
                             headers={"retry-after": str(seconds)})


def bearer(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def same_origin(request: Request) -> bool:
    """A browser's Origin (or Referer) must name this host; a request without either (curl) is judged by its
    token alone."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def host_allowed(host_header: str, allowed: Iterable[str]) -> bool:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8080
        name = host[: host.find("]") + 1]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in allowed


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(name, value, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https", max_age=max_age)


def start_session(response: Response, request: Request, guard: Guard) -> None:
    """A new server-side session for this browser (the old one, if any, is ended: no session fixation)."""
    guard.sessions.revoke(request.cookies.get(SESSION_COOKIE))
    set_cookie(response, request, SESSION_COOKIE, guard.sessions.create(),
               max_age=max(1, math.ceil(guard.sessions.lifetime_seconds)))


def end_session(response: Response, request: Request, guard: Guard) -> None:
    guard.sessions.revoke(request.cookies.get(SESSION_COOKIE))
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")


def safe_next(target: str | None) -> str:
    """Only paths of this site: never //other.host or a scheme (an open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


class GuardMiddleware:
    """Host check, login, the CSRF cookie, and security headers on every response."""

    def __init__(self, app: ASGIApp, guard: Guard, allowed_hosts: Iterable[str] | None) -> None:
        self.app = app
        self.guard = guard
        self.allowed_hosts = tuple(h.lower() for h in allowed_hosts) if allowed_hosts is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await self._check(request)
        if response is not None:
            await _with_headers(response)(scope, receive, send)
            return
        new_nonce = None
        if not request.cookies.get(CSRF_COOKIE):
            new_nonce = secrets.token_urlsafe(24)
        scope.setdefault("state", {})["csrf_nonce"] = request.cookies.get(CSRF_COOKIE) or new_nonce
        static = request.url.path.startswith("/static/")

        async def send_with_headers(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))  # type: ignore[call-overload]
                present = {k.lower() for k, _ in headers}
                for key, value in HEADERS.items():
                    if key == "cache-control" and static:
                        value = "no-cache"  # revalidate (ETag) rather than refetch
                    if key.encode() not in present:
                        headers.append((key.encode(), value.encode()))
                if new_nonce is not None:
                    cookie = Response()
                    set_cookie(cookie, request, CSRF_COOKIE, new_nonce)
                    headers += [(k, v) for k, v in cookie.raw_headers if k == b"set-cookie"]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)  # type: ignore[arg-type]

    async def _check(self, request: Request) -> Response | None:
        if self.allowed_hosts is not None and not host_allowed(request.headers.get("host", ""),
                                                               self.allowed_hosts):
            return PlainTextResponse("unexpected Host header", status_code=400)
        if not self.guard.login_required or request.url.path.startswith(_PUBLIC):
            return None
        given = request.query_params.get("token")
        if given is not None and request.method == "GET":
            refused = self.guard.check_token(request, given)
            if refused is not None:
                return refused
            # The token leaves the address bar (and history) at once; the cookie carries the session.
            clean = URL(str(request.url)).remove_query_params("token")
            target = clean.path + (f"?{clean.query}" if clean.query else "")
            response = RedirectResponse(target, status_code=303)
            start_session(response, request, self.guard)
            return response
        if self.guard.authenticated(request):
            return None
        token = bearer(request)
        if token is not None:
            return self.guard.check_token(request, token)
        wants_page = request.method == "GET" and "fragment" not in request.query_params \
            and not request.url.path.startswith("/api/")
        if wants_page:
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(URL("/login").include_query_params(next=here), status_code=303)
        return PlainTextResponse("login required", status_code=401)


def _with_headers(response: Response) -> Response:
    for key, value in HEADERS.items():
        response.headers.setdefault(key, value)
    return response

