"""What an agent run checkpoints, as JSON: a model's response, and a tool call's outcome.

Both the first run and a replay hand Pydantic AI the value decoded from this JSON, so a run that resumes
sees exactly what the run before the crash saw (a tool's result is what its JSON says, on both paths).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.exceptions import ToolRetryError
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, RetryFeedbackPart, ToolReturnPart
from pydantic_core import to_jsonable_python

_RETRY_PART: TypeAdapter[RetryFeedbackPart | ToolReturnPart] = TypeAdapter(RetryFeedbackPart | ToolReturnPart)


def response_to_json(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def response_from_json(data: Any) -> ModelResponse:
    (message,) = ModelMessagesTypeAdapter.validate_python([data])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"a recorded model request holds a {type(message).__name__}, not a ModelResponse")
    return message


def tool_value(value: Any) -> dict[str, Any]:
    """A tool's result, recorded as the JSON the model will read."""
    return {"value": to_jsonable_python(value)}


def tool_retry(error: ToolRetryError) -> dict[str, Any]:
    """The tool asked the model to try again (``ModelRetry``): recorded, so a replay asks again the same way."""
    return {"retry": _RETRY_PART.dump_python(error.tool_retry, mode="json")}


def tool_outcome(recorded: dict[str, Any]) -> Any:
    """The recorded outcome as the tool call's result, or the retry it asked for, raised again."""
    if "retry" in recorded:
        raise ToolRetryError(_RETRY_PART.validate_python(recorded["retry"]))
    return recorded["value"]
