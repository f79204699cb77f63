"""A Pydantic AI model whose requests are checkpointed steps of the running workflow."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from ..context import current
from . import records

# A step (``App.step``) that awaits the request it is given and returns the response's JSON.
RequestStep = Callable[[Callable[[], Awaitable[ModelResponse]]], Awaitable[Any]]


class DurableModel(WrapperModel):
    """Inside a workflow, each request is one step: sent once, its response recorded, and replayed from the
    record when the workflow resumes. Outside workflows it is the wrapped model, unchanged."""

    def __init__(self, wrapped: Model, request_step: RequestStep) -> None:
        super().__init__(wrapped)
        self._request_step = request_step

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        send = super().request
        if current() is None:
            return await send(messages, model_settings, model_request_parameters)
        recorded = await self._request_step(lambda: send(messages, model_settings, model_request_parameters))
        return records.response_from_json(recorded)

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: RunContext[Any] | None = None) -> AsyncIterator[StreamedResponse]:
        if current() is not None:
            raise UserError("pgdurable.ai checkpoints whole model responses: run the agent with `run()` (no "
                            "streaming, no event_stream_handler) inside a workflow")
        async with super().request_stream(messages, model_settings, model_request_parameters,
                                          run_context) as streamed:
            yield streamed
