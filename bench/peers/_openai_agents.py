"""The task on the OpenAI Agents SDK: an `Agent` whose model is a custom `Model` subclass.

Tracing is disabled, as the SDK's docs advise for models not served by OpenAI (with it
on, and no API key, each run still builds its spans and then drops them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import Any

from _task import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    SYSTEM_PROMPT,
    TOOL_NAME,
    Call,
    Ended,
    arguments_json,
    fetch,
    fetch_sync,
    next_move,
    scripted_model,
)

# The `bench` extra installs these; without it, mypy sees them as Any (hence the ignores).
from agents import (  # type: ignore[import-not-found, unused-ignore]
    Agent,
    AgentOutputSchemaBase,
    Handoff,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    Runner,
    Tool,
    TResponseInputItem,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.items import TResponseStreamEvent  # type: ignore[import-not-found, unused-ignore]
from openai.types.responses import (  # type: ignore[import-not-found, unused-ignore]
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam  # type: ignore[import-not-found, unused-ignore]


def _output_text(item: TResponseInputItem) -> str | None:
    """The output of a function call output item, else None."""
    if not isinstance(item, dict) or item.get("type") != "function_call_output":
        return None
    output = item.get("output")
    return output if isinstance(output, str) else None


class ScriptedModel(Model):  # type: ignore[misc, unused-ignore]
    """The scripted model behind the SDK's `Model` interface."""

    @scripted_model
    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else input
        move = next_move(
            _output_text(items[-1]) if items else None,
            lambda: (text for text in map(_output_text, items) if text is not None),
        )
        usage = Usage(
            requests=1,
            input_tokens=PROMPT_TOKENS,
            output_tokens=COMPLETION_TOKENS,
            total_tokens=PROMPT_TOKENS + COMPLETION_TOKENS,
        )
        if isinstance(move, Call):
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=move.call_id,
                name=TOOL_NAME,
                arguments=arguments_json(move.index),
            )
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", text=move, annotations=[])
        message = ResponseOutputMessage(
            id="msg_final", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the benchmark runs the agent without streaming")


def _agent(tool: Callable[[int], Any]) -> Agent[Any]:
    return Agent(
        name="adder",
        instructions=SYSTEM_PROMPT,
        tools=[function_tool(tool, name_override=TOOL_NAME)],
        model=ScriptedModel(),
    )


class OpenAIAgents:
    name = "openai-agents"
    version = version("openai-agents")

    def __init__(self) -> None:
        set_tracing_disabled(True)
        self.agent = _agent(fetch)
        self.sync_agent = _agent(fetch_sync)

    async def session(
        self, prompt: str, max_turns: int | None, *, sync_tool: bool = False
    ) -> Ended:
        agent = self.sync_agent if sync_tool else self.agent
        if max_turns is None:
            result = await Runner.run(agent, prompt)
        else:
            result = await Runner.run(agent, prompt, max_turns=max_turns)
        return Ended(str(result.final_output), "final output")


def adapter() -> OpenAIAgents:
    return OpenAIAgents()
