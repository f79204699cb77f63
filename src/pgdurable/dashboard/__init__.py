"""The web dashboard (``pgdurable dashboard``; needs the ``dashboard`` extra: starlette, jinja2, uvicorn).

``create_app`` is imported on first use, so that ``pgdurable`` without the extra still runs every other
command, and ``pgdurable dashboard`` can say which extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
