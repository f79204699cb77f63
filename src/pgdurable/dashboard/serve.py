"""Run the dashboard with uvicorn, after checking that the chosen address and options are safe."""

from __future__ import annotations

import ipaddress
import secrets
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


def check_options(host: str, token: str | None, read_only: bool) -> str | None:
    """The token to use: the given one; a fresh random one on loopback when neither a token nor read-only
    mode was asked for (actions need a token); None for read-only without a token. Any address other than
    loopback needs --token or --read-only."""
    if token is not None and not token.strip():
        raise DashboardOptionsError("--token must not be empty")
    if not is_loopback(host) and token is None and not read_only:
        raise DashboardOptionsError(
            f"listening on {host} (not loopback) needs --token (or --read-only, which disables actions)")
    if token is None and not read_only:
        return secrets.token_urlsafe(24)
    return token


def serve(app: App, *, host: str, port: int, token: str | None, read_only: bool, console: Console) -> None:
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        raise DashboardOptionsError(f"the dashboard needs its extra: pip install 'pgdurable[dashboard]' ({exc})"
                                    ) from None
    given = token
    token = check_options(host, token, read_only)
    allowed = LOOPBACK_HOSTS if is_loopback(host) else None
    dashboard = create_app(app, token=token, read_only=read_only, allowed_hosts=allowed)
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
