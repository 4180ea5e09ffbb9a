"""A worker process for the fault suite: a Host on a SQLite file or a JsonlLog directory,
driven over stdin and stdout, meant to be killed with SIGKILL at any moment.

    python -m tests.faults.worker sqlite|jsonl LOG RUNS

It recovers whatever the log holds, prints `{"ready": true}`, then reads commands, one
JSON object a line, and runs each concurrently:

    {"n": 7, "op": "create", "id": "s3", "prompt": "take 2 steps ask"}
    {"n": 8, "op": "message", "id": "s3", "text": "take 1 steps round 3"}
    {"n": 9, "op": "results", "id": "s3", "call": "ask-1", "text": "answer 3"}
    {"op": "wait"}

printing `{"ack": n}` once the Host has logged what command n asked for (a command sent
again after a kill, which the log already holds, is acknowledged without doing it
twice). A command the session cannot take yet (results before the session waits for
them, a message while it waits for results) is tried again until it can. After "wait",
once every command is acknowledged and every session is at rest, it prints
`{"done": true}` and exits.

The model asks for the outside tool `ask` first when the prompt says "ask" (call id
`ask-<user messages so far>`), then calls `step` n = 1..K for "take K steps" (ids
`step-<user messages>-<n>`, and the argument `call`: `<session> <call id>`, the session
being the prompt's last word but "ask"), then answers; `step` runs in-process and
appends its `call` to the file RUNS for each real execution.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from turnkeeper.core import AgentSpec, InputError, ToolResult, ToolSpec
from turnkeeper.events import MessageQueued, MessageReceived, ToolReturned
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import Busy, Host, UnknownSession

STEP = ToolSpec(
    "step",
    "Take step n.",
    {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "call": {"type": "string"}},
        "required": ["n", "call"],
    },
)
ASK = ToolSpec("ask", "Ask a person.", {"type": "object", "properties": {"q": {"type": "string"}}})
SPEC = AgentSpec(system_prompt="Take the steps you are asked for.", tools=(STEP, ASK))
MODEL_DELAY = 0.1
TOOL_DELAY = 0.01
RETRY_SECONDS = 0.02
_ASKED = re.compile(r"take (\d+) steps")


def answer_for(prompt: str) -> str:
    asked = _ASKED.search(prompt)
    return f"done after {asked.group(1) if asked else 0} steps"


async def model(request: dict[str, Any]) -> dict[str, Any]:
    """The reply follows from the history alone, so it is the same after a restart."""
    await anyio.sleep(random.uniform(0, MODEL_DELAY))
    messages = request["messages"]
    users = [i for i, message in enumerate(messages) if message["role"] == "user"]
    text = str(messages[users[-1]]["content"])
    answered = sum(1 for message in messages[users[-1] :] if message["role"] == "tool")
    asks = "ask" in text.split()
    if asks and answered == 0:
        return tool_response(("ask", {"q": text}, f"ask-{len(users)}"))
    done = answered - asks
    asked = _ASKED.search(text)
    if asked and done < int(asked.group(1)):
        n = done + 1
        call_id = f"step-{len(users)}-{n}"
        session_id = str(messages[users[0]]["content"]).removesuffix(" ask").split()[-1]
        return tool_response(("step", {"n": n, "call": f"{session_id} {call_id}"}, call_id))
    return text_response(answer_for(text))


def step_tool(runs: Path) -> Any:
    fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def step(n: int, call: str) -> str:
        await anyio.sleep(random.uniform(0, TOOL_DELAY))
        # One write of one line: O_APPEND keeps lines whole across processes and kills.
        os.write(fd, f"{call}\n".encode())
        return f"step {n} ok"

    return step


def say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def logged(host: Host, session_id: str, command: dict[str, Any]) -> bool:
    """Whether the log already holds what `command` asks for (sent before a kill)."""
    try:
        events = await host.events(session_id)
    except UnknownSession:
        return False
    if command["op"] == "message":
        texts = [
            e.event.text for e in events if isinstance(e.event, MessageQueued | MessageReceived)
        ]
        return command["text"] in texts
    calls = [e.event.tool_call_id for e in events if isinstance(e.event, ToolReturned)]
    return command["call"] in calls


async def run_command(host: Host, command: dict[str, Any]) -> None:
    session_id = command["id"]
    while True:
        try:
            if command["op"] == "create":
                await host.start(SPEC, command["prompt"], session_id=session_id)
            elif await logged(host, session_id, command):
                pass
            elif command["op"] == "message":
                await host.send(session_id, command["text"])
            else:
                result = ToolResult(command["call"], command["text"])
                await host.submit_tool_results(session_id, [result])
        except InputError as exc:
            if command["op"] == "create" and "already exists" in str(exc):
                break
            await anyio.sleep(RETRY_SECONDS)
        except (UnknownSession, Busy):
            await anyio.sleep(RETRY_SECONDS)
        else:
            break
    say({"ack": command["n"]})


async def work(backend: str, path: Path, runs: Path) -> None:
    log: EventLog = SqliteLog(path) if backend == "sqlite" else JsonlLog(path)
    async with log, Host(chat=model, log=log, tools={"step": step_tool(runs)}) as host:
        say({"ready": True})
        lines = anyio.wrap_file(sys.stdin)
        async with anyio.create_task_group() as commands:
            async for line in lines:
                command = json.loads(line)
                if command["op"] == "wait":
                    break
                commands.start_soon(run_command, host, command)
        for session_id in await host.sessions():
            info = await host.result(session_id)
            assert info.status == "idle", info
        say({"done": True})


def main() -> None:
    backend, path, runs = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    anyio.run(work, backend, path, runs)


if __name__ == "__main__":
    main()
