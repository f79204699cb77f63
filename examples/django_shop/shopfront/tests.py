"""The shop under Django's test runner (``python manage.py test``), on a real test database, which
``migrate`` gave pgdurable's schema too. TransactionTestCase: the workflow runs on other connections, so the
test's writes must really commit."""

from __future__ import annotations

from django.db import connection, transaction
from django.test import TransactionTestCase

from .durable import app, fulfil
from .models import Effect, Order, Product


class ShopTests(TransactionTestCase):
    @classmethod
    def tearDownClass(cls) -> None:
        app.close()  # its connections to the test database, which the runner drops next
        super().tearDownClass()

    def test_an_order_and_its_workflow_commit_together(self) -> None:
        answer = self.client.post("/orders", {"sku": "book", "quantity": 1}, content_type="application/json")
        self.assertEqual(answer.status_code, 201)
        workflow_id = answer.json()["workflow_id"]
        self.assertEqual(Order.objects.count(), 1)
        self.assertEqual(app.handle(workflow_id).status(), "enqueued")

    def test_a_rolled_back_block_enqueues_nothing(self) -> None:
        with self.assertRaises(RuntimeError), transaction.atomic():
            order = Order.objects.create(sku="book", quantity=1)
            app.enqueue(fulfil, order.pk, workflow_id=f"order-{order.pk}", conn=connection)
            raise RuntimeError("the request fails")
        self.assertEqual(Order.objects.count(), 0)
        self.assertIsNone(app.get(f"order-{order.pk}"))

    def test_the_workflow_reserves_and_ships_once_with_the_orm(self) -> None:
        Product.objects.create(sku="lamp", stock=3)
        order = Order.objects.create(sku="lamp", quantity=2)
        # App.start: run it in this process now (a worker thread of the test process, on the test database).
        tracking = app.start(fulfil, order.pk, workflow_id=f"order-{order.pk}").result(timeout=60)
        self.assertEqual(tracking, f"TRACK-parcel-{order.pk}")
        order.refresh_from_db()
        self.assertEqual((order.status, order.tracking), ("shipped", tracking))
        self.assertEqual(Product.objects.get(sku="lamp").stock, 1)
        self.assertEqual(sorted(Effect.objects.values_list("kind", flat=True)), ["reserved", "shipped"])
        self.assertEqual([s.step_name for s in app.steps(f"order-{order.pk}")], ["reserve", "pack", "ship"])
