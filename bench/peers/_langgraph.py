"""The task on LangGraph's prebuilt ReAct agent (`create_react_agent`), driven by the
scripted LangChain chat model of _langchain_model.py."""

from __future__ import annotations

import warnings
from importlib.metadata import version
from typing import Any

from _langchain_model import ScriptedChatModel
from _task import SYSTEM_PROMPT, TOOL_NAME, Ended, fetch, fetch_sync

# The `bench` extra installs these; without it, mypy sees them as Any (hence the ignores).
from langchain_core.runnables import RunnableConfig  # type: ignore[import-not-found, unused-ignore]
from langchain_core.tools import StructuredTool  # type: ignore[import-not-found, unused-ignore]
from langgraph.prebuilt import create_react_agent  # type: ignore[import-not-found, unused-ignore]


def recursion_config(max_turns: int | None) -> RunnableConfig | None:
    """The graph-step limit that allows `max_turns` model calls (None: the default): a
    model call and its tool calls are two graph steps, the answer one more."""
    return None if max_turns is None else {"recursion_limit": 2 * max_turns + 1}


def tools(sync_tool: bool) -> list[StructuredTool]:
    """The `fetch` tool as a LangChain tool: the async function, or the plain one."""
    if sync_tool:
        return [StructuredTool.from_function(func=fetch_sync, name=TOOL_NAME)]
    return [StructuredTool.from_function(coroutine=fetch, name=TOOL_NAME)]


class LangGraph:
    name = "langgraph"
    version = version("langgraph")

    def __init__(self) -> None:
        # create_react_agent is the prebuilt ReAct agent this benchmark compares; LangGraph
        # 1.x marks it as moved to `langchain.agents` (the langchain adapter runs that).
        def build(sync_tool: bool) -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return create_react_agent(
                    ScriptedChatModel(), tools(sync_tool), prompt=SYSTEM_PROMPT
                )

        self.graphs: dict[bool, Any] = {False: build(False), True: build(True)}

    async def session(
        self, prompt: str, max_turns: int | None, *, sync_tool: bool = False
    ) -> Ended:
        graph = self.graphs[sync_tool]
        state = await graph.ainvoke({"messages": [("user", prompt)]}, recursion_config(max_turns))
        return Ended(str(state["messages"][-1].content), "final output")


def adapter() -> LangGraph:
    return LangGraph()
