"""A support agent whose runs are durable workflows: it looks an order up, then refunds it, a refund being
written to the database exactly once and only after a human approved it.

The model is scripted (FunctionModel), so the example needs no API key. A real model is a one-line change:

    MODEL = "openai:gpt-5.2"    # pip install 'pydantic-ai-slim[openai]'; OPENAI_API_KEY in the environment
"""

from __future__ import annotations

import re

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

import pgdurable
from pgdurable.ai import DurableAgent, connection

app = pgdurable.App()

REFUNDS_TABLE = """
CREATE SCHEMA IF NOT EXISTS support;
CREATE TABLE IF NOT EXISTS support.refunds (order_id int PRIMARY KEY, cents int NOT NULL, reason text NOT NULL);
"""


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Plays the LLM: look the order up, refund it, then tell the customer what happened."""
    prompt = next(str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart))
    order_id = int(re.findall(r"\d+", prompt)[0])
    results = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not results:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": order_id})])
    if len(results) == 1:
        order = results[0]
        return ModelResponse(parts=[ToolCallPart("refund", {"order_id": order_id, "cents": order["cents"],
                                                            "reason": order["problem"]})])
    return ModelResponse(parts=[TextPart(f"Order {order_id}: {results[1]}")])


MODEL: Model | str = FunctionModel(scripted)

agent = Agent(MODEL, name="support", instructions="Help customers with their orders. Refund what arrived broken.")


@agent.tool_plain
async def lookup_order(order_id: int) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "cents": 1000 + order_id, "problem": "arrived broken"}  # your order service


@agent.tool_plain
async def refund(order_id: int, cents: int, reason: str) -> str:
    """Refund an order."""
    await connection().execute("INSERT INTO support.refunds VALUES (%s, %s, %s)", (order_id, cents, reason))
    return f"refunded {cents} cents"


# Each model request and tool call is a step; `refund` commits with its checkpoint and waits for approval.
durable = DurableAgent(app, agent, transactional={"refund"}, approval={"refund"})
