"""Who may see the dashboard and act through it.

- With a token, every page needs it: typed on /login, given once as ``?token=`` (the link the command
  prints), or sent as ``Authorization: Bearer``. The browser then holds a session cookie derived from the
  token (HMAC), so restarting with the same token keeps sessions and changing it ends them.
- Actions exist only with a token and without read-only mode. Each action form carries a CSRF token, an
  HMAC of a random per-browser cookie under a per-process secret: another site can neither read nor forge
  it. A cross-origin ``Origin`` header is refused as well, and cookies are SameSite=Strict.
- Bound to loopback, only loopback Host headers are accepted, so a DNS-rebinding page cannot read it.
- Every response forbids framing (clickjacking) and carries a CSP that allows only the dashboard's own
  scripts and styles.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
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


class Guard:
    def __init__(self, token: str | None, read_only: bool) -> None:
        if token is not None and not token.strip():
            raise ValueError("the dashboard token must not be empty")
        self.token = token
        self.read_only = read_only
        self._secret = secrets.token_bytes(32)

    @property
    def actions_enabled(self) -> bool:
        return self.token is not None and not self.read_only

    @property
    def login_required(self) -> bool:
        return self.token is not None

    def session_value(self) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), b"pgdurable dashboard session", hashlib.sha256).hexdigest()

    def token_matches(self, given: str | None) -> bool:
        return (self.token is not None and given is not None
                and hmac.compare_digest(given.encode(), self.token.encode()))

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie is not None and hmac.compare_digest(cookie.encode(), self.session_value().encode()):
            return True
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(credentials.strip())

    def csrf_token(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, request: Request, submitted: str | None) -> bool:
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce or not submitted:
            return False
        return hmac.compare_digest(submitted.encode(), self.csrf_token(nonce).encode())


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


def set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    response.set_cookie(name, value, httponly=True, samesite="strict", path="/",
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
            if not self.guard.token_matches(given):
                return PlainTextResponse("wrong token", status_code=401)
            # The token leaves the address bar (and history) at once; the cookie carries the session.
            clean = URL(str(request.url)).remove_query_params("token")
            target = clean.path + (f"?{clean.query}" if clean.query else "")
            response = RedirectResponse(target, status_code=303)
            set_cookie(response, request, SESSION_COOKIE, self.guard.session_value())
            return response
        if self.guard.authenticated(request):
            return None
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

