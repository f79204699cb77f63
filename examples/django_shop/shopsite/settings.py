"""Settings of the Django shop example. The database: ``PGDURABLE_DATABASE_URL``, else ``DATABASE_URL``, else
pgdurable's embedded PostgreSQL (started on first use: nothing to set up). ``SHOP_SCHEMA``, when set, is the
schema (which must exist) that the shop's tables live in."""

import os

from pgdurable.contrib.django import database_settings


def _database_url() -> str:
    url = os.environ.get("PGDURABLE_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if url:
        return url
    from pgdurable.embedded import embedded_database_url

    return embedded_database_url()


_schema = os.environ.get("SHOP_SCHEMA")
DATABASES = {"default": database_settings(_database_url(),
                                          **({"options": f"-c search_path={_schema}"} if _schema else {}))}
if os.environ.get("SHOP_TEST_DATABASE"):  # the name manage.py test gives its test database
    DATABASES["default"]["TEST"] = {"NAME": os.environ["SHOP_TEST_DATABASE"]}

INSTALLED_APPS = ["pgdurable.contrib.django", "shopfront"]
PGDURABLE = {"APP": "shopfront.durable:app"}  # what manage.py pgdurable_worker serves

ROOT_URLCONF = "shopsite.urls"
MIDDLEWARE: list[str] = []
SECRET_KEY = "example only: not secret"
DEBUG = os.environ.get("SHOP_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
