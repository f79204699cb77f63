"""An orders API on FastAPI with pgdurable (docs/integrations.md): ``python -m examples.fastapi_orders``."""
