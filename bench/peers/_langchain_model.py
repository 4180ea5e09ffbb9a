"""The scripted model as a LangChain chat model, shared by the LangGraph and LangChain
adapters: a fake chat model that supports tool calling the way provider chat models do
(`bind_tools`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from _task import COMPLETION_TOKENS, PROMPT_TOKENS, TOOL_NAME, Call, next_move, scripted_model

# The `bench` extra installs these; without it, mypy sees them as Any (hence the ignores).
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun  # type: ignore[import-not-found, unused-ignore]
from langchain_core.language_models import BaseChatModel, LanguageModelInput  # type: ignore[import-not-found, unused-ignore]
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # type: ignore[import-not-found, unused-ignore]
from langchain_core.outputs import ChatGeneration, ChatResult  # type: ignore[import-not-found, unused-ignore]
from langchain_core.runnables import Runnable  # type: ignore[import-not-found, unused-ignore]
from langchain_core.tools import BaseTool  # type: ignore[import-not-found, unused-ignore]
from langchain_core.utils.function_calling import convert_to_openai_tool  # type: ignore[import-not-found, unused-ignore]

USAGE = {
    "input_tokens": PROMPT_TOKENS,
    "output_tokens": COMPLETION_TOKENS,
    "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
}


def _returned(messages: Sequence[BaseMessage]) -> Iterator[str]:
    for message in messages:
        if isinstance(message, ToolMessage) and isinstance(message.content, str):
            yield message.content


def _reply(messages: list[BaseMessage]) -> ChatResult:
    last = messages[-1]
    move = next_move(
        last.content if isinstance(last, ToolMessage) and isinstance(last.content, str) else None,
        lambda: _returned(messages),
    )
    if isinstance(move, Call):
        call = {"name": TOOL_NAME, "args": {"i": move.index}, "id": move.call_id}
        message = AIMessage(content="", tool_calls=[call], usage_metadata=USAGE)
    else:
        message = AIMessage(content=move, usage_metadata=USAGE)
    return ChatResult(generations=[ChatGeneration(message=message)])


class ScriptedChatModel(BaseChatModel):  # type: ignore[misc, unused-ignore]
    """The scripted model as a LangChain chat model."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return _reply(messages)

    @scripted_model
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return _reply(messages)

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)
