"""The web dashboard (``pgdurable dashboard``; needs the ``dashboard`` extra: starlette, jinja2, uvicorn)."""

from .app import create_app

__all__ = ["create_app"]
