"""The Django integration, driven through the example project (examples/django_shop) against the real
database: ``manage.py test`` (Django's test runner, on a test database that ``migrate`` gave pgdurable's schema
too), ``manage.py migrate``, a real request through the view that enqueues inside ``transaction.atomic()``,
and ``manage.py pgdurable_worker`` processes, the first SIGKILLed mid-workflow and the second finishing it, with
the ORM's writes of each ``@app.atomic()`` step applied exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("django", reason="the django extra is not installed (pip install -e '.[test]')")

from pgdurable.contrib.django import database_settings
from tests.conftest import CHILD_PYTHONPATH, REPO
from tests.harness import WAIT, wait_for

PROJECT = REPO / "examples" / "django_shop"


class Shop:
    """Runs the example's manage.py on this test's schemas and reads both."""

    def __init__(self, database_url: str, schema: str, shop_schema: str, tmp_path: Path) -> None:
        self.database_url, self.schema, self.shop_schema, self.tmp_path = database_url, schema, shop_schema, tmp_path
        self.env = {**os.environ, "PGDURABLE_DATABASE_URL": database_url, "PGDURABLE_SCHEMA": schema,
                    "SHOP_SCHEMA": shop_schema, "PYTHONPATH": CHILD_PYTHONPATH, "SHOP_PACK_SECONDS": "0"}
        self.procs: list[subprocess.Popen[bytes]] = []

    def manage(self, *args: str, **env: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env={**self.env, **env},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def worker(self, **env: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "manage.py", "pgdurable_worker", "-c", "4"], cwd=PROJECT,
                                env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def rows(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            statement = sql.SQL(query).format(s=sql.Identifier(self.shop_schema), e=sql.Identifier(self.schema))
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []


@pytest.fixture
def shop(database_url: str, schema: str, tmp_path: Path) -> Iterator[Shop]:
    shop_schema = f"shop_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(shop_schema)))
    found = Shop(database_url, schema, shop_schema, tmp_path)
    yield found
    for proc in found.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(shop_schema)))


def test_the_example_passes_its_tests_under_djangos_test_runner(shop: Shop) -> None:
    test_database = f"test_shop_{uuid.uuid4().hex[:10]}"
    output = shop.manage("test", "--noinput", "-v", "2", SHOP_SCHEMA="", SHOP_TEST_DATABASE=test_database)
    assert "Ran 3 tests" in output and "\nOK" in output, output
    # The runner's migrate of the test database migrated pgdurable's schema too (before any App was used).
    assert f"pgdurable: schema {shop.schema} migrated" in output


def test_a_killed_worker_is_finished_by_another_and_each_orm_write_happens_once(shop: Shop) -> None:
    migrated = shop.manage("migrate")
    assert f"pgdurable: schema {shop.schema} migrated" in migrated
    assert shop.manage("migrate").count("pgdurable: schema") == 0  # already current: nothing to do
    shop.rows("INSERT INTO {s}.shopfront_product VALUES ('book', 5)")
    # The first worker packs slowly: it is killed while packing, after the reservation committed.
    first = shop.worker(SHOP_PACK_SECONDS="600")
    placed = shop.manage("shell", "-c", "from django.test import Client; "
                         "print(Client().post('/orders', {'sku': 'book', 'quantity': 2}, "
                         "content_type='application/json').content.decode())")
    order_id = int(placed.split('"id": ')[1].split(",")[0])
    workflow_id = f"order-{order_id}"

    def effects() -> list[tuple[str, int]]:
        return [(kind, pid) for kind, pid in shop.rows(
            "SELECT kind, pid FROM {s}.shopfront_effect WHERE order_id = %s ORDER BY kind", (order_id,))]

    wait_for(lambda: effects() == [("reserved", first.pid)] or first.poll() is not None, WAIT,
             "the first worker to reserve")
    assert first.poll() is None, (shop.tmp_path / "worker-0.log").read_text()
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = shop.worker()
    wait_for(lambda: shop.rows("SELECT status FROM {e}.workflow_executions WHERE id = %s",
                               (workflow_id,)) == [("succeeded",)], WAIT, "the second worker to finish")

    assert effects() == [("reserved", first.pid), ("shipped", second.pid)]  # each once
    assert shop.rows("SELECT stock FROM {s}.shopfront_product") == [(3,)]  # reserved once
    assert shop.rows("SELECT status, tracking FROM {s}.shopfront_order WHERE id = %s", (order_id,)) == [
        ("shipped", f"TRACK-parcel-{order_id}")]
    assert shop.rows("SELECT attempt FROM {e}.workflow_executions WHERE id = %s", (workflow_id,)) == [(2,)]
    assert shop.rows("SELECT step_name, recorded_by_attempt FROM {e}.operation_outputs WHERE execution_id = %s "
                     "ORDER BY step_id", (workflow_id,)) == [("reserve", 1), ("pack", 2), ("ship", 2)]
    print(f"crash and resume: {workflow_id} reserved by manage.py pgdurable_worker {first.pid} (then SIGKILLed "
          f"while packing), shipped by {second.pid} on attempt 2; effects {effects()}, stock 5 -> 3")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=WAIT) == 0


def test_database_settings_from_a_url() -> None:
    assert database_settings("postgresql://shop:pw@db.example:6543/shop?sslmode=require",
                             options="-c search_path=shop") == {
        "ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "shop", "PASSWORD": "pw",
        "HOST": "db.example", "PORT": "6543", "OPTIONS": {"sslmode": "require", "options": "-c search_path=shop"}}


def test_an_async_atomic_step_is_refused_when_declared(tmp_path: Path) -> None:
    script = ("import django; from django.conf import settings; "
              "settings.configure(DATABASES={'default': {'ENGINE': 'django.db.backends.postgresql', 'NAME': 'x'}}, "
              "INSTALLED_APPS=['pgdurable.contrib.django']); django.setup(); "
              "from pgdurable.contrib.django import DjangoApp; app = DjangoApp()\n"
              "@app.atomic()\nasync def step() -> None: ...")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "ConfigurationError: @app.atomic() step 'step' must be a plain `def`" in done.stderr


def test_a_database_that_is_not_postgresql_is_refused(tmp_path: Path) -> None:
    script = ("import django; from django.conf import settings; "
              "settings.configure(DATABASES={'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}, "
              "INSTALLED_APPS=['pgdurable.contrib.django']); django.setup(); "
              "from pgdurable.contrib.django import DjangoApp; DjangoApp().migrate()")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "pgdurable needs PostgreSQL: DATABASES['default'] uses sqlite" in done.stderr

