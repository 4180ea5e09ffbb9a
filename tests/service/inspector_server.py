"""The service the inspector's browser tests drive: `python -m tests.service.inspector_server
--log PATH` serves on a free 127.0.0.1 port, printing one JSON line `{"url", "token",
"port"}` once it takes requests (as tests/service/server_main.py does), on a scripted
model whose behaviour the prompt's first word picks:

- `loop` (as the session's first message): calls `lookup` with the same key every time,
  whatever a guard's directive tells it, until a guard stops it;
- `markup`: answers with HTML that would run script if a page made markup of it;
- `steps N`: makes N slow `lookup` calls (a few tenths of a second each), then answers;
- `ask`: asks the person running the session (`ask_human`, run by the orchestrator);
- `down`: the model is unreachable (every call fails as a transient error);
- `long N`: makes N `lookup` calls, counting those done from the results it is sent and
  from the summary of older turns (asked for one, a request without tools, it says how
  many lookups the transcript shows done);
- anything else: answers at once.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import partial
from typing import Any

import anyio

from turnkeeper.core import AgentSpec, ChatError, ToolSpec
from turnkeeper.providers import text_response, tool_response
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
SPEC = AgentSpec(system_prompt="Look things up; ask when unsure.", tools=(LOOKUP, ASK_HUMAN))
MARKUP = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'
STEP_SECONDS = 0.4
_DONE = re.compile(r"(\d+) lookups done")


async def chat(request: dict[str, Any]) -> dict[str, Any]:
    """The scripted model (see the module docstring)."""
    messages = request["messages"]
    if not request["tools"]:
        transcript = messages[-1]["content"]
        earlier = _DONE.search(transcript)
        done_before = int(earlier.group(1)) if earlier else 0
        count = done_before + transcript.count("Result of lookup:")
        return text_response(f"The user asked for lookups; {count} lookups done.", usage=(60, 12))
    last = max(i for i, message in enumerate(messages) if message["role"] == "user")
    prompt = messages[last]["content"]
    done = [m for m in messages[last + 1 :] if m["role"] == "tool"]
    word, _, rest = prompt.partition(" ")
    call_id = f"call_{len(messages)}"
    first = next(m["content"] for m in messages if m["role"] == "user")
    if first.startswith("loop"):
        return tool_response(("lookup", {"key": "same"}, call_id), usage=(40, 6))
    if word == "markup":
        return text_response(f"Here it is: {MARKUP}", usage=(12, 30))
    if word == "steps" and len(done) < int(rest or "3"):
        await anyio.sleep(STEP_SECONDS)
        return tool_response(("lookup", {"key": f"step-{len(done)}"}, call_id), usage=(30, 5))
    if word == "ask" and not done:
        return tool_response(("ask_human", {"question": rest or "which one?"}, call_id))
    if word == "long":
        summarised = [_DONE.search(m["content"]) for m in messages if m["role"] == "user"]
        count = sum(int(found.group(1)) for found in summarised if found) + len(done)
        if count < int(rest):
            return tool_response(("lookup", {"key": f"part-{count}"}, call_id), usage=(30, 5))
        return text_response(f"looked up {count} parts", usage=(30, 4))
    if word == "down":
        raise ChatError("connection refused", transient=True)
    results = ", ".join(str(m["content"]) for m in done)
    return text_response(f"answer to {prompt!r}" + (f" from {results}" if results else ""))


async def lookup(key: str) -> str:
    return key.upper()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--ping", type=float, default=15.0)
    args = parser.parse_args()

    def ready(listening: Listening) -> None:
        print(json.dumps({"url": listening.url, "token": listening.token, "port": listening.port}))
        sys.stdout.flush()

    anyio.run(
        partial(
            serve,
            chat=chat,
            port=0,
            log_path=args.log,
            tools={"lookup": lookup},
            limits=Limits(),
            ping_seconds=args.ping,
            ready=ready,
        ),
        backend="trio",
    )


if __name__ == "__main__":
    main()
