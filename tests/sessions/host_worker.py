"""A worker process hosting many sessions on one SQLite log, and the deterministic model,
tool and log checks that the Host tests share.

    python tests/sessions/host_worker.py DBPATH N

starts sessions s0 .. s{N-1} that the log does not hold yet (a worker started again on
the same file resumes the others), prints `started`, and exits once every session is
idle, printing `finished`. Session s{i} is asked for `steps_for(i)` steps; its model
sleeps MODEL_DELAY per call and its tool TOOL_DELAY per call.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from turnkeeper.core import AgentSpec, ToolSpec
from turnkeeper.events import Envelope, ModelResponded, ToolCalled, ToolMayHaveRun, ToolReturned
from turnkeeper.logs import SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import Host, SessionInfo
from turnkeeper.state import SessionState, replay
from turnkeeper.tools import ToolContext

STEP = ToolSpec(
    "step",
    "Take step n.",
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)
SPEC = AgentSpec(system_prompt="Take the steps you are asked for, one call each.", tools=(STEP,))
MODEL_DELAY = 0.02
TOOL_DELAY = 0.01

Chat = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
_ASKED = re.compile(r"take (\d+) steps")


def prompt_for(steps: int, tag: str = "") -> str:
    """A prompt asking for `steps` steps; `tag` tells sessions apart for a test's model."""
    return f"take {steps} steps {tag}".strip()


def steps_for(index: int) -> int:
    return 4 + index % 5


def answer_for(steps: int) -> str:
    return f"done after {steps} steps"


def progress(messages: Sequence[dict[str, Any]]) -> tuple[int, int, str]:
    """Steps asked for by the last user message, tool answers since it, and its text."""
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    text = str(messages[last_user].get("content"))
    asked = _ASKED.search(text)
    wanted = int(asked.group(1)) if asked else 0
    answered = sum(1 for m in messages[last_user:] if m.get("role") == "tool")
    return wanted, answered, text


def stepper(delay: float = 0.0) -> Chat:
    """A model that calls step(n=1), step(n=2), ... (call id `step-n`) until the last user
    message's "take K steps" have been answered, then answers `answer_for(K)`. It reads
    only the request, so it gives the same reply to the same history, across restarts."""

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        if delay:
            await anyio.sleep(delay)
        wanted, answered, _ = progress(request["messages"])
        if answered < wanted:
            n = answered + 1
            return tool_response(("step", {"n": n}, f"step-{n}"), usage=(10, 2))
        return text_response(answer_for(wanted), usage=(10, 3))

    return chat


def step_text(n: int) -> str:
    return f"step {n} ok"


def step_tool(delay: float = 0.0) -> Callable[[str, dict[str, Any], ToolContext], Awaitable[str]]:
    """A handler for `step` answering `step_text(n)`."""

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        if delay:
            await anyio.sleep(delay)
        return step_text(int(args["n"]))

    return handler


async def settle(host: Host, session_id: str, timeout: float = 10.0) -> SessionInfo:
    """The session once it is at rest. Waits with no timeout of its own, so a lost wakeup
    fails the test instead of passing once a timeout runs out."""
    with anyio.fail_after(timeout):
        return await host.result(session_id)


def check_answered(history: Sequence[dict[str, Any]], pending: Sequence[str] = ()) -> None:
    """Every tool call in `history` is answered by exactly one tool message, before the
    next assistant message, and every tool message answers a call; only the `pending`
    calls of the last assistant message may still be unanswered."""
    open_calls: set[str] = set()
    answered: set[str] = set()
    for index, message in enumerate(history):
        role = message.get("role")
        if role == "assistant":
            assert not open_calls - answered, f"message {index}: unanswered {open_calls - answered}"
            open_calls = {call["id"] for call in message.get("tool_calls") or ()}
            answered = set()
        elif role == "tool":
            call_id = message["tool_call_id"]
            assert call_id in open_calls, f"message {index}: answers no open call {call_id}"
            assert call_id not in answered, f"message {index}: {call_id} answered twice"
            answered.add(call_id)
    assert open_calls - answered == set(pending), f"unanswered at the end: {open_calls - answered}"


_once_only = {
    "local.tool_call",
    "local.tool_may_have_run",
    "local.chat_error",
    "local.chat_retry",
    "local.directive",
}


def check_log(events: Sequence[Envelope]) -> SessionState:
    """Check one session's log and return its replayed state: seqs 1, 2, 3... with no gap,
    no event logged twice within a request episode (a re-run tool call excepted), every
    tool call in the replayed history answered exactly once, every logged tool call with
    one result in history (or still pending, in a session that is parked or failed), and
    every call logged again with no result since it was logged marked just before as one
    that may have run (see `check_marks`)."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    check_marks(events)
    seen: set[bytes] = set()
    for envelope in events:
        if envelope.type == "local.user_message":
            seen = set()
        if envelope.type in _once_only:
            continue
        key = envelope.type.encode() + msgspec.json.encode(envelope.event)
        assert key not in seen, f"seq {envelope.seq}: {envelope.type} logged twice"
        seen.add(key)
    state = replay(events)
    pending = [use.id for use in state.pending]
    check_answered(state.history, pending)
    tool_messages = [m["tool_call_id"] for m in state.history if m.get("role") == "tool"]
    for envelope in events:
        if isinstance(envelope.event, ToolCalled):
            call_id = envelope.event.tool_call_id
            assert call_id in tool_messages + pending, f"logged tool call {call_id} has no answer"
    return state


def check_marks(events: Sequence[Envelope]) -> None:
    """A `local.tool_call` of a call already logged since the model's reply, with no result
    yet, comes just after its `local.tool_may_have_run`; every mark comes just before its
    call, which was logged before: a call runs again only marked, and marked only then."""
    called: set[str] = set()
    for index, envelope in enumerate(events):
        event = envelope.event
        if isinstance(event, ModelResponded):
            called = set()
        elif isinstance(event, ToolReturned):
            called.discard(event.tool_call_id)
        elif isinstance(event, ToolMayHaveRun):
            after = events[index + 1].event if index + 1 < len(events) else None
            assert isinstance(after, ToolCalled), f"seq {envelope.seq}: a mark with no call"
            assert after.tool_call_id == event.tool_call_id, f"seq {envelope.seq}"
            assert event.tool_call_id in called, f"seq {envelope.seq}: a call not logged marked"
        elif isinstance(event, ToolCalled):
            before = events[index - 1].event if index else None
            marked = (
                isinstance(before, ToolMayHaveRun) and before.tool_call_id == event.tool_call_id
            )
            if event.tool_call_id in called:
                assert marked, f"seq {envelope.seq}: {event.tool_call_id} run again unmarked"
            called.add(event.tool_call_id)


async def host_sessions(path: Path, count: int) -> None:
    async with (
        SqliteLog(path) as log,
        Host(chat=stepper(MODEL_DELAY), log=log, tools=step_tool(TOOL_DELAY)) as host,
    ):
        known = set(await host.sessions())
        ids = [f"s{index}" for index in range(count)]
        for index, session_id in enumerate(ids):
            if session_id not in known:
                await host.start(SPEC, prompt_for(steps_for(index)), session_id=session_id)
        print("started", flush=True)
        for session_id in ids:
            info = await host.result(session_id)
            assert info.status == "idle", info
        print("finished", flush=True)


def main(argv: Sequence[str]) -> None:
    path, count = Path(argv[1]), int(argv[2])
    anyio.run(host_sessions, path, count)


if __name__ == "__main__":
    main(sys.argv)
