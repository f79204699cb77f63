"""Run the dashboard with uvicorn, after checking that the chosen address and options are safe."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from ..app import App


# The Host header names accepted when listening on loopback (anything else may be a DNS-rebinding page).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class DashboardOptionsError(ValueError):
    """The options would expose the dashboard unsafely, or a dependency is missing."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_options(host: str, token: str | None, read_only: bool,
                  allowed_hosts: Sequence[str] = ()) -> str | None:
    """The token to use: the given one; a fresh random one on loopback when neither a token nor read-only
    mode was asked for (actions need a token); None for read-only without a token. Any address other than
    loopback needs --token, or --read-only with at least one --allowed-host (the Host names it answers to:
    without a token, a DNS-rebinding page could read it under any name)."""
    if token is not None and not token.strip():
        raise DashboardOptionsError("--token must not be empty")
    for name in allowed_hosts:
        if not name.strip() or any(c in name for c in "/ @?#"):
            raise DashboardOptionsError(f"--allowed-host {name!r} is not a host name")
    if not is_loopback(host) and token is None:
        if not read_only:
            raise DashboardOptionsError(
                f"listening on {host} (not loopback) needs --token (or --read-only with --allowed-host NAME, "
                "which disables actions)")
        if not allowed_hosts:
            raise DashboardOptionsError(
                f"a read-only dashboard without a token on {host} (not loopback) needs --allowed-host NAME "
                "(repeatable: the names browsers use to reach it), or --token")
    if token is None and not read_only:
        return secrets.token_urlsafe(24)
    return token


def allowed_host_names(host: str, allowed_hosts: Sequence[str]) -> tuple[str, ...] | None:
    """The Host header names accepted: the loopback names on loopback, plus the --allowed-host names; None
    (any) only off loopback with no --allowed-host (then a token guards every page)."""
    names = tuple(_without_port(n.strip().lower()) for n in allowed_hosts)
    if is_loopback(host):
        return LOOPBACK_HOSTS + names
    return names or None


def _without_port(name: str) -> str:
    """``dash.internal:8080`` -> ``dash.internal`` (the Host check compares names; ``::1`` stays)."""
    head, colon, port = name.rpartition(":")
    return head if colon and port.isdigit() and head.count(":") == 0 else name


def serve(app: App, *, host: str, port: int, token: str | None, read_only: bool, console: Console,
          allowed_hosts: Sequence[str] = ()) -> None:
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        raise DashboardOptionsError(f"the dashboard needs its extra: pip install 'pgdurable[dashboard]' ({exc})"
                                    ) from None
    given = token
    token = check_options(host, token, read_only, allowed_hosts)
    _ = app.db.conninfo  # a malformed database URL is refused now (ConfigurationError), not on the first page
    dashboard = create_app(app, token=token, read_only=read_only,
                           allowed_hosts=allowed_host_names(host, allowed_hosts))
    shown_host = f"[{host}]" if ":" in host else host
    base = f"http://{shown_host}:{port}/"
    if token is not None and given is None:
        console.print(f"dashboard on {escape(base)} · open [bold]{escape(base)}?token={escape(token)}[/bold] "
                      "(a fresh token; pass --token to choose one)", highlight=False, soft_wrap=True)
    else:
        mode = "read-only" if read_only or token is None else "token required"
        console.print(f"dashboard on {escape(base)} ({mode}) · schema {escape(app.schema)}", highlight=False,
                      soft_wrap=True)
    if not is_loopback(host) and token is None:
        console.print("[yellow]warning: read-only and without a token, anyone who can reach this address sees "
                      "every workflow's inputs and outputs[/yellow]")
    uvicorn.run(dashboard, host=host, port=port, log_level="warning", proxy_headers=False,
                server_header=False)
