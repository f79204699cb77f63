"""``POST /orders`` ({"sku", "quantity"}) writes the order and enqueues its fulfilment in one
``transaction.atomic()`` block, on Django's connection; ``GET /orders/<id>`` reads it."""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .durable import app, fulfil
from .models import Order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(sku=str(body["sku"]), quantity=int(body["quantity"]))
        # Joins this transaction: the order and its workflow commit together, or neither exists.
        app.enqueue(fulfil, order.pk, workflow_id=f"order-{order.pk}", conn=connection)
    return JsonResponse({"id": order.pk, "workflow_id": f"order-{order.pk}"}, status=201)


@require_GET
def order_detail(request: HttpRequest, order_id: int) -> HttpResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": f"no order {order_id}"}, status=404)
    execution = app.get(f"order-{order_id}")
    return JsonResponse({"id": order.pk, "sku": order.sku, "quantity": order.quantity, "status": order.status,
                         "tracking": order.tracking, "workflow": execution.status if execution else None})
