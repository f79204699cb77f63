"""``DurableAgent``: a Pydantic AI agent whose runs are pgdurable workflows."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic_ai import Agent
from pydantic_ai.models import Model, infer_model
from pydantic_ai.run import AgentRunResult

from ..errors import ConfigurationError
from . import records
from .model import DurableModel
from .tools import DurableTools, ToolStep, run_tool, run_tool_in_transaction

if TYPE_CHECKING:
    from ..app import App
    from ..workflows import Workflow

DepsT = TypeVar("DepsT")
OutputT = TypeVar("OutputT")


class DurableAgent(Generic[DepsT, OutputT]):
    """Runs ``agent`` durably on ``app``: each model request and each tool call of a run is a checkpointed
    step, so a run resumed by another worker repeats no recorded request and no recorded tool effect.

    ``transactional``: names of tools that write the database; each call runs in a transaction (the tool gets
    it from ``pgdurable.ai.connection()``) that commits together with the call's checkpoint.
    ``approval``: names of tools that wait, before each call, for a message on ``approval_topic``
    (``app.send(workflow_id, {"approved": True}, topic="approval")``); the pending call is published as the
    event ``"approval"``. ``model``: the model to use instead of the agent's own.
    ``workflow`` is the run as a workflow (``app.enqueue(durable.workflow, prompt)``, returning the output);
    ``await durable.run(...)`` runs the agent inside a workflow of yours.
    """

    def __init__(self, app: App, agent: Agent[DepsT, OutputT], *, name: str | None = None,
                 model: Model | str | None = None, transactional: Collection[str] = (),
                 approval: Collection[str] = (), approval_topic: str = "approval", queue: str = "default",
                 model_attempts: int = 3, tool_attempts: int = 1) -> None:
        name = name or agent.name
        if not name:
            raise ConfigurationError("a durable agent needs a name (Agent(name=...) or name=): its steps are "
                                     "recorded under it")
        wrapped = model if model is not None else agent.model
        if wrapped is None:
            raise ConfigurationError(f"durable agent {name!r}: the agent has no model; pass model=")
        self.app, self.agent, self.name = app, agent, name
        self.transactional = frozenset(transactional)
        self._tool_attempts = tool_attempts
        self._tool_steps: dict[str, ToolStep] = {}

        @app.step(name=f"{name}.model_request", max_attempts=model_attempts)
        async def model_request(send: Callable[[], Awaitable[Any]]) -> Any:
            return records.response_to_json(await send())

        self.model = DurableModel(infer_model(wrapped), model_request)
        self.tools = DurableTools(self._step_for, approval=frozenset(approval), approval_topic=approval_topic)

        async def run(prompt: str) -> Any:
            return (await self.run(prompt)).output

        self.workflow: Workflow[[str], Awaitable[Any]] = app.workflow(name=f"{name}.run", queue=queue)(run)

    async def run(self, prompt: str | None = None, **options: Any) -> AgentRunResult[OutputT]:
        """``agent.run(prompt, **options)`` with the durable model and tools. Tool calls run one at a time, so
        that their steps are recorded in the order a replay makes them."""
        capabilities = [*options.pop("capabilities", ()), self.tools]
        with Agent.parallel_tool_call_execution_mode("sequential"):
            # A wait for approval unwinds the run with the engine's Suspended (a BaseException, which Pydantic
            # AI lets through): the workflow resumes, replaying the run, once the answer arrives.
            return await self.agent.run(prompt, model=self.model, capabilities=capabilities, **options)

    def _step_for(self, tool_name: str) -> ToolStep:
        step = self._tool_steps.get(tool_name)
        if step is None:
            step_name = f"{self.name}.tool.{tool_name}"
            if tool_name in self.transactional:
                step = self.app.transaction(name=step_name, max_attempts=self._tool_attempts)(run_tool_in_transaction)
            else:
                step = self.app.step(name=step_name, max_attempts=self._tool_attempts)(run_tool)
            self._tool_steps[tool_name] = step
        return step

