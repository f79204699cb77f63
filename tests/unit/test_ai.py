"""pgdurable.ai without a database: what a run records round-trips exactly, and outside workflows a durable
agent is the plain agent."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolRetryError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import pgdurable
from pgdurable.ai import DurableAgent, connection, records


def test_a_model_response_round_trips_through_its_json() -> None:
    response = ModelResponse(parts=[TextPart("hi"), ToolCallPart("lookup", {"id": 7}, tool_call_id="c1")],
                             model_name="m")
    assert records.response_from_json(records.response_to_json(response)) == response


def test_a_tool_retry_is_recorded_and_raised_again() -> None:
    error = ToolRetryError(ToolReturnPart("lookup", "try again", tool_call_id="c1", outcome="retried"))
    with pytest.raises(ToolRetryError) as raised:
        records.tool_outcome(records.tool_retry(error))
    assert raised.value.tool_retry == error.tool_retry
    assert records.tool_outcome(records.tool_value({"n": (1, 2)})) == {"n": [1, 2]}  # the JSON the model reads


async def test_outside_workflows_the_durable_agent_is_the_plain_agent() -> None:
    app = pgdurable.App("postgresql://unused@127.0.0.1:1/none")
    calls: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(len(messages))
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("double", {"n": 21})])
        return ModelResponse(parts=[TextPart("answer")])

    agent = Agent(FunctionModel(model), name="plain")

    @agent.tool_plain
    def double(n: int) -> int:
        return 2 * n

    durable = DurableAgent(app, agent)
    result = await durable.run("go")  # no workflow: nothing recorded, nothing connects
    assert result.output == "answer" and calls == [1, 3]
    assert durable.workflow.name == "plain.run"


def test_a_durable_agent_needs_a_name_and_a_model() -> None:
    app = pgdurable.App("postgresql://unused@127.0.0.1:1/none")
    with pytest.raises(pgdurable.ConfigurationError, match="needs a name"):
        DurableAgent(app, Agent(TestModel()))
    with pytest.raises(pgdurable.ConfigurationError, match="no model"):
        DurableAgent(app, Agent(name="nomodel"))
    with pytest.raises(RuntimeError, match="transactional"):
        connection()
