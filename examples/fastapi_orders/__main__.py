"""``python -m examples.fastapi_orders``: serve the orders API on http://127.0.0.1:8000 (``ORDERS_PORT``), with
a pgdurable worker in the same process, on ``PGDURABLE_DATABASE_URL`` or the embedded PostgreSQL."""

import os

import uvicorn

uvicorn.run("examples.fastapi_orders.api:api", host="127.0.0.1", port=int(os.environ.get("ORDERS_PORT", "8000")))
