"""The task on LangGraph's prebuilt ReAct agent (`create_react_agent`), driven by a fake
chat model that supports tool calling the way provider chat models do (`bind_tools`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from typing import Any

from _task import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    SYSTEM_PROMPT,
    TOOL_NAME,
    Call,
    Ended,
    fetch,
    next_move,
    scripted_model,
)

# The `bench` extra installs these; without it, mypy sees them as Any (hence the ignores).
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun  # type: ignore[import-not-found, unused-ignore]
from langchain_core.language_models import BaseChatModel, LanguageModelInput  # type: ignore[import-not-found, unused-ignore]
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # type: ignore[import-not-found, unused-ignore]
from langchain_core.outputs import ChatGeneration, ChatResult  # type: ignore[import-not-found, unused-ignore]
from langchain_core.runnables import Runnable, RunnableConfig  # type: ignore[import-not-found, unused-ignore]
from langchain_core.tools import BaseTool, StructuredTool  # type: ignore[import-not-found, unused-ignore]
from langchain_core.utils.function_calling import convert_to_openai_tool  # type: ignore[import-not-found, unused-ignore]
from langgraph.prebuilt import create_react_agent  # type: ignore[import-not-found, unused-ignore]

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


class LangGraph:
    name = "langgraph"
    version = version("langgraph")

    def __init__(self) -> None:
        tool = StructuredTool.from_function(coroutine=fetch, name=TOOL_NAME)
        # create_react_agent is the prebuilt ReAct agent this benchmark compares; LangGraph
        # 1.x marks it as moved to `langchain.agents`, which is a separate package.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.graph = create_react_agent(ScriptedChatModel(), [tool], prompt=SYSTEM_PROMPT)

    async def session(self, prompt: str, max_turns: int | None) -> Ended:
        # A model call and its tool calls are two graph steps, the answer one more.
        config: RunnableConfig | None = None
        if max_turns is not None:
            config = {"recursion_limit": 2 * max_turns + 1}
        state = await self.graph.ainvoke({"messages": [("user", prompt)]}, config)
        return Ended(str(state["messages"][-1].content), "final output")


def adapter() -> LangGraph:
    return LangGraph()
