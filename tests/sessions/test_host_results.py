"""Tool results in a Host and in `run()`: each one's text is logged once (the
`local.tool_results` event refers to the `local.tool_result` that holds it), the log
replays and re-checks exactly, and a handler's result past `max_tool_result_chars` is
cut with a note the model reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.sessions.host_worker import SPEC, answer_for, prompt_for, settle, stepper
from turnkeeper.core import ToolResult
from turnkeeper.events import Envelope, ToolResultsReceived, ToolReturned
from turnkeeper.logs import SqliteLog
from turnkeeper.sessions import Host, recheck, run
from turnkeeper.state import replay, results_of
from turnkeeper.tools import ToolContext

pytestmark = pytest.mark.anyio

BIG = 1_000_000
STEPS = 3


async def big_step(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
    return str(args["n"]) * BIG


class Seen:
    """The stepper model, noting the longest tool message any request held."""

    def __init__(self) -> None:
        self.model = stepper()
        self.longest = 0

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        for message in request["messages"]:
            if message["role"] == "tool":
                self.longest = max(self.longest, len(message["content"]))
        return await self.model(request)


def log_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def check_stored_once(events: list[Envelope]) -> None:
    """Every result's text is in its local.tool_result only, and reads back whole."""
    returned: list[ToolReturned] = []
    resumed = 0
    for envelope in events:
        event = envelope.event
        if isinstance(event, ToolReturned):
            returned.append(event)
        elif isinstance(event, ToolResultsReceived) and event.results:
            resumed += 1
            assert event.logged == tuple(range(len(event.results)))
            assert all(result.text == "" for result in event.results)
            whole = results_of(returned, event)
            assert whole is not None
            assert [r.text for r in whole] == [returned[-1].text]
    assert resumed == STEPS


async def test_a_host_logs_each_result_text_once(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    model = Seen()
    async with (
        SqliteLog(path) as log,
        Host(chat=model, log=log, tools=big_step, max_tool_result_chars=2 * BIG) as host,
    ):
        session_id = await host.start(SPEC, prompt_for(STEPS))
        assert (await settle(host, session_id, timeout=60)).text == answer_for(STEPS)
        events = await log.read(session_id)
        state = host._sessions[session_id].state
    size = log_bytes(path)
    print(f"log of {STEPS} results of {BIG:,} characters: {size:,} bytes")
    # Held twice, it was over 2 * STEPS * BIG bytes.
    assert size < 1.3 * STEPS * BIG
    assert model.longest == BIG
    check_stored_once(events)
    assert replay(events) == state
    assert recheck(events) is None


async def test_run_logs_each_result_text_once() -> None:
    model = Seen()
    result = await run(
        SPEC, prompt_for(STEPS), model, tools=big_step, max_tool_result_chars=2 * BIG
    )
    assert result.text == answer_for(STEPS)
    assert model.longest == BIG
    check_stored_once(list(result.events))
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_results_from_outside_are_logged_once_too() -> None:
    async with Host(chat=stepper()) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        info = await settle(host, session_id)
        (use,) = info.pending
        await host.submit_tool_results(session_id, [ToolResult(use.id, "x" * 5_000)])
        assert (await settle(host, session_id)).text == answer_for(1)
        events = await host.events(session_id)
    (resumed,) = [e.event for e in events if isinstance(e.event, ToolResultsReceived)]
    assert resumed.logged == (0,)
    assert replay(events) == host._sessions[session_id].state


async def test_a_host_cuts_a_handler_result_past_the_limit() -> None:
    model = Seen()
    async with Host(chat=model, tools=big_step) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        await settle(host, session_id)
        events = await host.events(session_id)
    (returned,) = [e.event for e in events if isinstance(e.event, ToolReturned)]
    assert returned.text.startswith("1" * 100_000 + "\n[turnkeeper: result cut: 900000 of")
    assert model.longest == len(returned.text) < 100_200
