"""The shop's workflow: reserve stock, pack, ship. Reserving and shipping are ``@app.atomic()`` steps: their
ORM writes commit in Django's transaction together with the step's checkpoint, so each happens exactly once
whatever crashes."""

from __future__ import annotations

import os
import time

from django.db.models import F

from pgdurable.contrib.django import DjangoApp

from .models import Effect, Order, Product

# A short lease: an order a crashed worker was running resumes on another within seconds.
app = DjangoApp(lease_seconds=5.0, sweep_seconds=1.0)


@app.atomic()
def reserve(order_id: int) -> bool:
    order = Order.objects.select_for_update().get(pk=order_id)
    taken = Product.objects.filter(sku=order.sku, stock__gte=order.quantity).update(
        stock=F("stock") - order.quantity)
    order.status = "reserved" if taken else "out of stock"
    order.save(update_fields=["status"])
    Effect.objects.create(order=order, kind="reserved", pid=os.getpid())
    return bool(taken)


@app.step()
def pack(order_id: int) -> str:
    time.sleep(float(os.environ.get("SHOP_PACK_SECONDS", "1")))  # the warehouse takes its time
    return f"parcel-{order_id}"


@app.atomic()
def ship(order_id: int, parcel: str) -> str:
    tracking = f"TRACK-{parcel}"
    Order.objects.filter(pk=order_id).update(status="shipped", tracking=tracking)
    Effect.objects.create(order_id=order_id, kind="shipped", pid=os.getpid())
    return tracking


@app.workflow(queue="shop")
def fulfil(order_id: int) -> str:
    if not reserve(order_id):
        return "out of stock"
    return ship(order_id, pack(order_id))
