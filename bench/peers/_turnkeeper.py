"""The task on turnkeeper: `run` with a chat backend that plays the scripted model."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import anyio.to_thread
from _task import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    SYSTEM_PROMPT,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_SCHEMA,
    Call,
    Ended,
    arguments_json,
    fetch,
    fetch_sync,
    next_move,
    scripted_model,
)

from turnkeeper import AgentSpec, ToolSpec, run

SPEC = AgentSpec(
    system_prompt=SYSTEM_PROMPT, tools=(ToolSpec(TOOL_NAME, TOOL_DESCRIPTION, TOOL_SCHEMA),)
)
TOOLS = {TOOL_NAME: fetch}


async def fetch_in_thread(i: int) -> str:
    """`fetch_sync` in a worker thread, as each peer runs a plain-function tool: run()
    takes async tools only, so this is how its user hands it a function that may block."""
    return await anyio.to_thread.run_sync(fetch_sync, i)


SYNC_TOOLS = {TOOL_NAME: fetch_in_thread}
USAGE = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS}


@scripted_model
async def scripted_chat(request: dict[str, Any]) -> dict[str, Any]:
    """The scripted model as a chat-completions backend."""
    messages: list[dict[str, Any]] = request["messages"]
    last = messages[-1]
    move = next_move(
        last["content"] if last["role"] == "tool" else None,
        lambda: (message["content"] for message in messages if message["role"] == "tool"),
    )
    if isinstance(move, Call):
        call = {
            "id": move.call_id,
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": arguments_json(move.index)},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish_reason = "tool_calls"
    else:
        message = {"role": "assistant", "content": move}
        finish_reason = "stop"
    return {"choices": [{"message": message, "finish_reason": finish_reason}], "usage": USAGE}


class Turnkeeper:
    name = "turnkeeper"
    version = version("turnkeeper")

    async def session(
        self, prompt: str, max_turns: int | None, *, sync_tool: bool = False
    ) -> Ended:
        tools = SYNC_TOOLS if sync_tool else TOOLS
        if max_turns is None:
            result = await run(SPEC, prompt, scripted_chat, tools=tools)
        else:
            result = await run(SPEC, prompt, scripted_chat, tools=tools, max_turns=max_turns)
        return Ended(result.text or "", f"stop_reason={result.stop_reason}")


def adapter() -> Turnkeeper:
    return Turnkeeper()
