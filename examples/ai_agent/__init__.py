"""A durable Pydantic AI agent (docs/ai.md). Run a worker, then ask for a refund and approve it:

    pgdurable worker examples.ai_agent:app &
    python -m examples.ai_agent 7
"""

from .support import agent, app, durable

__all__ = ["agent", "app", "durable"]
