"""The task on pydantic-ai: an `Agent` driven by a `FunctionModel`."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version

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
from pydantic_ai import Agent, Tool  # type: ignore[import-not-found, unused-ignore]
from pydantic_ai.messages import (  # type: ignore[import-not-found, unused-ignore]
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # type: ignore[import-not-found, unused-ignore]
from pydantic_ai.usage import RequestUsage, UsageLimits  # type: ignore[import-not-found, unused-ignore]


def _returned(message: ModelMessage) -> Iterator[str]:
    """The texts of the tool results in a message."""
    if isinstance(message, ModelRequest):
        for part in message.parts:
            if isinstance(part, ToolReturnPart) and isinstance(part.content, str):
                yield part.content


@scripted_model
async def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model as a FunctionModel function."""
    last = next(_returned(messages[-1]), None)
    move = next_move(last, lambda: (text for message in messages for text in _returned(message)))
    usage = RequestUsage(input_tokens=PROMPT_TOKENS, output_tokens=COMPLETION_TOKENS)
    if isinstance(move, Call):
        call = ToolCallPart(TOOL_NAME, arguments_json(move.index), tool_call_id=move.call_id)
        return ModelResponse(parts=[call], usage=usage)
    return ModelResponse(parts=[TextPart(move)], usage=usage)


class PydanticAI:
    name = "pydantic-ai"
    version = version("pydantic-ai-slim")

    def __init__(self) -> None:
        model = FunctionModel(scripted)
        self.agents = {
            sync_tool: Agent(model, system_prompt=SYSTEM_PROMPT, tools=[Tool(tool, name=TOOL_NAME)])
            for sync_tool, tool in ((False, fetch), (True, fetch_sync))
        }

    async def session(
        self, prompt: str, max_turns: int | None, *, sync_tool: bool = False
    ) -> Ended:
        agent = self.agents[sync_tool]
        limits = None if max_turns is None else UsageLimits(request_limit=max_turns)
        result = await agent.run(prompt, usage_limits=limits)
        return Ended(result.output, "final output")


def adapter() -> PydanticAI:
    return PydanticAI()
