"""The task on LangChain's agent (`langchain.agents.create_agent`, LangChain 1.x's
successor to LangGraph's prebuilt ReAct agent), with no middleware, driven by the
scripted LangChain chat model of _langchain_model.py."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from _langchain_model import ScriptedChatModel
from _langgraph import recursion_config, tools
from _task import SYSTEM_PROMPT, Ended

# The `bench` extra installs this; without it, mypy sees it as Any (hence the ignore).
from langchain.agents import create_agent  # type: ignore[import-not-found, unused-ignore]


class LangChain:
    name = "langchain"
    version = version("langchain")

    def __init__(self) -> None:
        self.agents: dict[bool, Any] = {
            sync_tool: create_agent(
                ScriptedChatModel(), tools(sync_tool), system_prompt=SYSTEM_PROMPT
            )
            for sync_tool in (False, True)
        }

    async def session(
        self, prompt: str, max_turns: int | None, *, sync_tool: bool = False
    ) -> Ended:
        agent = self.agents[sync_tool]
        state = await agent.ainvoke({"messages": [("user", prompt)]}, recursion_config(max_turns))
        return Ended(str(state["messages"][-1].content), "final output")


def adapter() -> LangChain:
    return LangChain()
