"""Durable Pydantic AI agents (``pip install 'pgdurable[ai]'``): a run is a workflow, each model request and
each tool call a checkpointed step (docs/ai.md)."""

from .agent import DurableAgent
from .model import DurableModel
from .tools import DurableTools, connection

__all__ = ["DurableAgent", "DurableModel", "DurableTools", "connection"]
