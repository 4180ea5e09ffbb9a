"""Host.fork: a new session whose log begins as the first events of another's, cut at
every kind of point (at rest, in an open episode, in the middle of a tool call, at a call
waiting for its result from outside, after a result came back), and the errors it names.

The model is host_worker's stepper, which reads its progress from the history: a fork
that goes on from a point gives the answer the origin gave from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.sessions.host_worker import (
    SPEC,
    answer_for,
    check_log,
    prompt_for,
    settle,
    step_text,
    stepper,
)
from turnkeeper.core import AgentSpec, InputError, ToolResult, ToolSpec, Usage
from turnkeeper.events import (
    Envelope,
    Forked,
    MessageReceived,
    ModelResponded,
    ToolCalled,
    ToolMayHaveRun,
)
from turnkeeper.logs import MemoryLog, SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import (
    Host,
    HostStopped,
    UnknownSession,
    fork_events,
    open_session,
    opened_event,
    recheck,
)
from turnkeeper.state import replay
from turnkeeper.tools import ToolContext

pytestmark = pytest.mark.anyio

ASK = ToolSpec("ask", "Ask a person.", {"type": "object", "properties": {"q": {"type": "string"}}})


class Steps:
    """The `step` handler, remembering which session each call ran in."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []

    async def __call__(self, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        self.ran.append((ctx.session_id, ctx.tool_call_id))
        return step_text(int(args["n"]))


def types(events: list[Envelope]) -> list[str]:
    return [envelope.type for envelope in events]


async def check_fork(
    host: Host, log: MemoryLog | SqliteLog, origin: str, fork: str, at: int
) -> list[Envelope]:
    """The fork's log begins as the origin's first `at` events under its id, then
    `local.forked`; it checks out, and replays to exactly the host's live state."""
    origin_events = await log.read(origin)
    events = await log.read(fork)
    assert [e.event for e in events[:at]] == [e.event for e in origin_events[:at]]
    assert [e.at for e in events[:at]] == [e.at for e in origin_events[:at]]
    assert {e.session_id for e in events} == {fork}
    assert events[at].event == Forked(origin=origin, at_seq=at)
    state = check_log(events)
    assert state == host._sessions[fork].state
    assert recheck(events) is None
    return events


async def test_a_fork_at_rest_takes_a_message_and_leaves_the_origin_alone() -> None:
    log = MemoryLog()
    async with Host(chat=stepper(), log=log, tools=Steps()) as host:
        origin = await host.start(SPEC, prompt_for(2), session_id="origin")
        done = await settle(host, origin)
        before = await log.read(origin)
        info = await host.fork(origin, done.seq, "fork")
        assert (info.session_id, info.status, info.seq) == ("fork", "idle", done.seq + 1)
        assert (info.text, info.usage, info.polls) == (done.text, done.usage, done.polls)
        await host.send("fork", prompt_for(1, "more"))
        assert (await settle(host, "fork")).text == answer_for(1)
        events = await check_fork(host, log, origin, "fork", done.seq)
        assert types(events[done.seq + 1 :])[:2] == ["local.user_message", "local.model_response"]
        assert await log.read(origin) == before
        assert await host.status(origin) == done


async def test_a_fork_of_an_open_episode_makes_its_model_call() -> None:
    log = MemoryLog()
    calls: list[str] = []
    step = stepper()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        calls.append(request["messages"][-1]["content"] or "")
        return await step(request)

    async with Host(chat=chat, log=log, tools=Steps()) as host:
        origin = await host.start(SPEC, prompt_for(2), session_id="origin")
        await settle(host, origin)
        made = len(calls)
        info = await host.fork(origin, 2, "fork")  # the request, before its first reply
        assert info.status == "running"
        assert (await settle(host, "fork")).text == answer_for(2)
        assert len(calls) == 2 * made
        await check_fork(host, log, origin, "fork", 2)


async def test_a_fork_in_the_middle_of_a_tool_call_runs_the_call_again_marked() -> None:
    log = MemoryLog()
    steps = Steps()
    async with Host(chat=stepper(), log=log, tools=steps) as host:
        origin = await host.start(SPEC, prompt_for(2), session_id="origin")
        await settle(host, origin)
        events = await log.read(origin)
        called = next(e for e in events if isinstance(e.event, ToolCalled))
        assert events[called.seq].type == "local.tool_result"
        await host.fork(origin, called.seq, "fork")  # logged as about to run, no result
        assert (await settle(host, "fork")).text == answer_for(2)
        forked = await check_fork(host, log, origin, "fork", called.seq)
        # It ran again, in the fork (under the fork's idempotency key), marked as one that
        # may have run: in the origin.
        call_id = called.event.tool_call_id  # type: ignore[union-attr]
        assert ("fork", call_id) in steps.ran
        assert types(forked[called.seq + 1 :])[:4] == [
            "local.tool_may_have_run",
            "local.tool_call",
            "local.tool_result",
            "local.tool_results",
        ]


async def test_a_fork_after_a_result_came_back_keeps_it() -> None:
    log = MemoryLog()
    steps = Steps()
    async with Host(chat=stepper(), log=log, tools=steps) as host:
        origin = await host.start(SPEC, prompt_for(2), session_id="origin")
        await settle(host, origin)
        events = await log.read(origin)
        returned = next(e for e in events if e.type == "local.tool_result")
        ran = len(steps.ran)
        await host.fork(origin, returned.seq, "fork")
        assert (await settle(host, "fork")).text == answer_for(2)
        # The first call's result is the origin's; only the second call ran in the fork.
        assert len(steps.ran) == ran + 1
        forked = await check_fork(host, log, origin, "fork", returned.seq)
        assert forked[returned.seq + 1].type == "local.tool_results"


async def test_a_fork_at_a_call_waiting_for_its_result_waits_for_its_own() -> None:
    spec = AgentSpec(system_prompt="Ask first.", tools=(ASK,))

    async def asks(request: dict[str, Any]) -> dict[str, Any]:
        results = [m for m in request["messages"] if m["role"] == "tool"]
        if not results:
            return tool_response(("ask", {"q": "which?"}, "call_ask"))
        return text_response(f"you said {results[-1]['content']}")

    log = MemoryLog()
    async with Host(chat=asks, log=log) as host:
        origin = await host.start(spec, "go", session_id="origin")
        waiting = await settle(host, origin)
        assert waiting.status == "requires_action"
        info = await host.fork(origin, waiting.seq, "fork")
        assert info.status == "requires_action"
        assert [use.id for use in info.pending] == ["call_ask"]
        await host.submit_tool_results("fork", [ToolResult("call_ask", "the red one")])
        assert (await settle(host, "fork")).text == "you said the red one"
        assert (await host.status(origin)).status == "requires_action"
        await check_fork(host, log, origin, "fork", waiting.seq)


async def test_the_fork_is_recovered_by_a_host_started_later(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    async with SqliteLog(path) as log:
        async with Host(chat=stepper(), log=log, tools=Steps()) as host:
            origin = await host.start(SPEC, prompt_for(2), session_id="origin")
            await settle(host, origin)
            await host.fork(origin, 3, "fork")
            forked = await settle(host, "fork")
        async with Host(chat=stepper(), log=log, tools=Steps()) as again:
            assert await again.status("fork") == forked
            assert replay(await log.read("fork")) == again._sessions["fork"].state


async def test_bad_forks_are_refused_naming_what_is_wrong() -> None:
    log = MemoryLog()
    async with Host(chat=stepper(), log=log, tools=Steps()) as host:
        origin = await host.start(SPEC, prompt_for(2), session_id="origin", max_turns=2)
        done = await settle(host, origin)
        with pytest.raises(UnknownSession, match="no session nowhere"):
            await host.fork("nowhere", 1)
        for at_seq in (0, done.seq + 1, True, "3"):
            with pytest.raises(
                InputError, match=f"at_seq: expected an integer from 1 to {done.seq}"
            ):
                await host.fork(origin, at_seq)  # type: ignore[arg-type]
        for taken in (origin, "other"):
            if taken == "other":
                await host.start(SPEC, None, session_id="other")
            with pytest.raises(InputError, match="new_id: "):
                await host.fork(origin, 2, taken)
        # max_turns turns the last poll into an answer after the stop, logged with the tool
        # results it follows (and a halt, with the reply): a fork between would lose it.
        events = await log.read(origin)
        assert types(events)[5:] == [
            "local.tool_results",
            "local.answer_requested",
            "local.model_response",
            "local.halted",
        ]
        for step in (6, 8):
            with pytest.raises(InputError, match=f"cuts short the step at seq {step}: .* to seq"):
                await host.fork(origin, step)
        await host.cancel(origin)
        cancelled = (await host.status(origin)).seq
        with pytest.raises(InputError, match="is cancelled at seq"):
            await host.fork(origin, cancelled)
        assert (await host.fork(origin, cancelled - 1, "before")).status == "halted"
        assert await host.sessions() == [origin, "other", "before"]
    with pytest.raises(HostStopped):
        await host.fork(origin, 2)


def test_fork_events_is_pure_and_numbers_the_fork_after_the_prefix() -> None:
    opened = Envelope("s", 1, 1.0, opened_event(open_session(SPEC)))
    events, state = fork_events([opened], 1, "t", at=5.0)
    assert [(e.session_id, e.seq, e.at) for e in events] == [("t", 1, 1.0), ("t", 2, 5.0)]
    assert state == replay(events)
    assert state.session_id == "t"
    generated, _ = fork_events([opened], 1, at=5.0)
    assert generated[0].session_id.startswith("local_")


def test_a_fork_point_between_a_mark_and_its_call_is_refused() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "step", "arguments": "{}"}}
        ],
    }
    events: list[Any] = [
        opened_event(open_session(SPEC)),
        MessageReceived("go"),
        ModelResponded(msgspec.Raw(b"{}"), message, "tool_calls", Usage(1, 1)),
        ToolCalled("c1", "step", {}),
        ToolMayHaveRun("c1", "step"),
        ToolCalled("c1", "step", {}),
    ]
    log = [Envelope("s", seq, 0.0, event) for seq, event in enumerate(events, 1)]
    with pytest.raises(InputError, match="seq 5 of session s marks a call about to run again"):
        fork_events(log, 5, "t", at=1.0)
    forked, state = fork_events(log, 6, "t", at=1.0)
    assert state.called == frozenset({"c1"})
    assert [e.seq for e in forked] == [1, 2, 3, 4, 5, 6, 7]
