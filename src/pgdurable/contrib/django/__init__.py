"""Django integration (``pip install 'pgdurable[django]'``): add ``"pgdurable.contrib.django"`` to
``INSTALLED_APPS`` and make the App with ``DjangoApp()``.

- The App connects to a database of ``settings.DATABASES`` (psycopg 3 backend), named by
  ``settings.PGDURABLE["DATABASE"]`` (default ``"default"``), in the schema ``settings.PGDURABLE["SCHEMA"]``
  (default ``PGDURABLE_SCHEMA``, else ``pgdurable``); the test runner's test database too.
- ``app.enqueue(..., conn=django.db.connection)`` inside ``transaction.atomic()`` writes the execution in
  that transaction: it exists if and only if the block commits.
- ``@app.atomic()`` declares a transactional step whose transaction is Django's own ``transaction.atomic()``:
  what the step writes with the ORM commits together with its checkpoint, or not at all.
- ``manage.py migrate`` also migrates pgdurable's schema (a ``post_migrate`` handler);
  ``manage.py pgdurable_worker`` runs a worker (``settings.PGDURABLE["APP"]``, or ``module:attribute``).

``database_settings(url)`` turns a ``postgresql://`` URL into a ``DATABASES`` entry, for settings files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg.conninfo import conninfo_to_dict

if TYPE_CHECKING:
    from .durable import DjangoApp, database_url

__all__ = ["DjangoApp", "database_settings", "database_url"]


def database_settings(url: str, **options: Any) -> dict[str, Any]:
    """A ``settings.DATABASES`` entry for ``url`` on Django's PostgreSQL backend; parameters other than the
    database, user, password, host and port, and ``options``, go to ``OPTIONS``."""
    params: dict[str, Any] = conninfo_to_dict(url)
    return {"ENGINE": "django.db.backends.postgresql", "NAME": params.pop("dbname", ""),
            "USER": params.pop("user", ""), "PASSWORD": params.pop("password", ""),
            "HOST": params.pop("host", ""), "PORT": params.pop("port", ""), "OPTIONS": {**params, **options}}


def __getattr__(name: str) -> Any:
    # What touches django.db is imported on first use: a settings file may import database_settings.
    if name in ("DjangoApp", "database_url"):
        from . import durable

        return getattr(durable, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
