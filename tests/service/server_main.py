"""The service for the subprocess tests: `python -m tests.service.server_main --log PATH`.

It serves on a free 127.0.0.1 port with a deterministic model and prints one JSON line
`{"url", "token", "port"}` once it takes requests. The model reads its progress from the
history: with the `ask_human` tool it asks once (return of control: no handler here);
with `lookup` (handled in-process) it looks up `<prompt>-0`, `<prompt>-1`, then
answers with what came back; a prompt starting with `slow` makes every call take a while.
With `--model-url URL` the model is instead the OpenAI-compatible server there (the
streaming test server, say), through OpenAIChat with retries.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any

import anyio
import msgspec

from turnkeeper.core import AgentSpec, Chat, ToolSpec
from turnkeeper.providers import OpenAIChat, text_response, tool_response, with_retry
from turnkeeper.service import Limits, Listening, serve

LOOKUP = ToolSpec(
    "lookup",
    "Look a key up.",
    {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)
ASK_HUMAN = ToolSpec(
    "ask_human",
    "Ask the person running the session.",
    {"type": "object", "properties": {"question": {"type": "string"}}},
)
LOOKUP_SPEC = AgentSpec(system_prompt="Look things up.", tools=(LOOKUP,))
ASK_SPEC = AgentSpec(system_prompt="Ask, then look things up.", tools=(LOOKUP, ASK_HUMAN))

LIMITS = Limits(
    max_body_bytes=65_536,
    max_text_chars=2_000,
    max_tool_result_chars=1_000,
    max_history_messages=20,
    max_wait_seconds=30.0,
    body_timeout_seconds=2.0,
)
SLOW_SECONDS = 0.2


def answer_for(prompt: str, asked: str | None = None) -> str:
    """What the model answers to `prompt` once its lookups are in (after `asked` came
    back from ask_human, if the spec has that tool)."""
    found = [f"{prompt}-{n}".upper() for n in range(2)]
    return "answer: " + " | ".join([asked, *found] if asked is not None else found)


async def chat(request: dict[str, Any]) -> dict[str, Any]:
    """The deterministic model (see the module docstring)."""
    messages = request["messages"]
    names = {tool["function"]["name"] for tool in request.get("tools", [])}
    last = max(i for i, message in enumerate(messages) if message["role"] == "user")
    prompt = messages[last]["content"]
    results = [m["content"] for m in messages[last + 1 :] if m["role"] == "tool"]
    if prompt.startswith("slow"):
        await anyio.sleep(SLOW_SECONDS)
    call_id = f"call_{len(messages)}"
    if "ask_human" in names and not results:
        return tool_response(("ask_human", {"question": prompt}, call_id))
    asked = 1 if "ask_human" in names else 0
    if "lookup" in names and len(results) < 2 + asked:
        key = f"{prompt}-{len(results) - asked}"
        return tool_response(("lookup", {"key": key}, call_id))
    if not names:
        return text_response(f"echo: {prompt}", usage=(len(prompt), 2))
    return text_response("answer: " + " | ".join(results), usage=(10, 5))


async def lookup(key: str) -> str:
    return key.upper()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--ping", type=float, default=15.0)
    parser.add_argument("--header-timeout", type=float, default=LIMITS.header_timeout_seconds)
    parser.add_argument("--max-wait", type=float, default=LIMITS.max_wait_seconds)
    parser.add_argument("--model-url")
    args = parser.parse_args()
    model: Chat = chat
    if args.model_url is not None:
        model = with_retry(OpenAIChat(args.model_url), base_delay=0.05)
    limits = msgspec.structs.replace(
        LIMITS, header_timeout_seconds=args.header_timeout, max_wait_seconds=args.max_wait
    )

    def ready(listening: Listening) -> None:
        print(json.dumps({"url": listening.url, "token": listening.token, "port": listening.port}))
        sys.stdout.flush()

    anyio.run(
        partial(
            serve,
            chat=model,
            port=0,
            log_path=args.log,
            tools={"lookup": lookup},
            limits=limits,
            ping_seconds=args.ping,
            ready=ready,
        ),
        backend="trio",
    )


if __name__ == "__main__":
    main()
