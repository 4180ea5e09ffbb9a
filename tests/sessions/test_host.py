"""Host: the API of the actor runtime, on both anyio backends.

Sessions run on deterministic models (a script, or the stepper of host_worker that
reads its progress from the history), so each test knows every event to expect.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.sessions.host_worker import (
    SPEC,
    answer_for,
    check_log,
    prompt_for,
    settle,
    step_text,
    step_tool,
    stepper,
)
from turnkeeper.core import (
    AgentSpec,
    ChatError,
    InputError,
    LogError,
    ToolResult,
    ToolSpec,
    ToolUse,
)
from turnkeeper.events import (
    Cancelled,
    ChatFailed,
    Envelope,
    MessageReceived,
    ModelResponded,
    ToolReturned,
    encode_envelope,
)
from turnkeeper.logs import EventLog, JsonlLog, MemoryLog, SqliteLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response, with_retry
from turnkeeper.sessions import Busy, Host, HostStopped, UnknownSession
from turnkeeper.tools import ToolContext

pytestmark = pytest.mark.anyio

NAN = math.nan
ASK = ToolSpec("ask", "Ask a person.", {"type": "object", "properties": {"q": {"type": "string"}}})
REMOTE_SPEC = AgentSpec(system_prompt="Ask when unsure.", tools=(*SPEC.tools, ASK))


def types(events: list[Envelope]) -> list[str]:
    return [envelope.type for envelope in events]


async def check_consistent(host: Host, log: MemoryLog, session_id: str) -> None:
    """The log checks out and replays to exactly the host's live state."""
    state = check_log(await log.read(session_id))
    assert state == host._sessions[session_id].state
    assert state.seq == (await host.status(session_id)).seq


class Gate:
    """A model call that blocks until the test opens the gate."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.entered = anyio.Event()
        self.opened = anyio.Event()
        self.calls = 0
        self.cancelled = False

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        self.entered.set()
        try:
            await self.opened.wait()
        except BaseException:
            self.cancelled = True
            raise
        return self.reply


async def test_start_runs_to_idle_with_the_answer() -> None:
    log = MemoryLog()
    chat = ScriptedChat([text_response("hello there", usage=(5, 2))])
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(SPEC, "say hello", session_id="greeter")
        info = await settle(host, session_id)
        assert (info.session_id, info.status, info.text) == ("greeter", "idle", "hello there")
        assert (info.stop_reason, info.polls, info.pending, info.error) == ("stop", 1, (), None)
        assert (info.usage.prompt_tokens, info.usage.completion_tokens) == (5, 2)
        assert types(await host.events(session_id)) == [
            "local.session_opened",
            "local.user_message",
            "local.model_response",
        ]
        assert await host.sessions() == ["greeter"]
        assert host.counters["model_calls"] == 1
        await check_consistent(host, log, session_id)
    assert chat.requests[0]["messages"][-1] == {"role": "user", "content": "say hello"}


async def test_tools_given_as_a_mapping_run_in_process() -> None:
    log = MemoryLog()
    ran: list[int] = []

    async def step(n: int) -> str:
        ran.append(n)
        return step_text(n)

    async with Host(chat=stepper(), log=log, tools={"step": step}) as host:
        session_id = await host.start(SPEC, prompt_for(3))
        info = await settle(host, session_id)
        assert (info.status, info.text, info.polls) == ("idle", answer_for(3), 4)
        await check_consistent(host, log, session_id)
    assert ran == [1, 2, 3]
    events = await log.read(session_id)
    assert types(events).count("local.tool_call") == 3
    assert types(events).count("local.tool_result") == 3


async def test_a_single_handler_gets_the_session_and_the_call_id() -> None:
    log = MemoryLog()
    seen: list[tuple[str, str, str, dict[str, Any]]] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((ctx.session_id, ctx.tool_call_id, name, args))
        return step_text(args["n"])

    async with Host(chat=stepper(), log=log, tools=handler) as host:
        session_id = await host.start(SPEC, prompt_for(2), session_id="one")
        assert (await settle(host, session_id)).text == answer_for(2)
        await check_consistent(host, log, session_id)
    assert seen == [
        ("one", "step-1", "step", {"n": 1}),
        ("one", "step-2", "step", {"n": 2}),
    ]


async def test_a_call_without_a_handler_parks_the_session_until_results_come() -> None:
    log = MemoryLog()
    chat = ScriptedChat(
        [
            tool_response(("step", {"n": 1}, "s1"), ("ask", {"q": "which?"}, "a1")),
            text_response("thanks"),
        ]
    )

    async def step(n: int) -> str:
        return step_text(n)

    async with Host(chat=chat, log=log, tools={"step": step}) as host:
        session_id = await host.start(REMOTE_SPEC, "go")
        info = await settle(host, session_id)
        # The step runs here; only the ask waits for the outside.
        assert info.status == "requires_action"
        assert info.pending == (ToolUse("a1", "ask", {"q": "which?"}),)
        events = await host.events(session_id)
        responses = [e for e in events if e.type == "local.model_response"]
        reply = responses[0].event
        assert isinstance(reply, ModelResponded)
        calls = reply.message["tool_calls"]
        assert [call["id"] for call in calls] == ["s1", "a1"]
        await check_consistent(host, log, session_id)

        await host.submit_tool_results(session_id, [ToolResult("a1", "the blue one")])
        info = await settle(host, session_id)
        assert (info.status, info.text, info.pending) == ("idle", "thanks", ())
        await check_consistent(host, log, session_id)
    last_request = chat.requests[-1]["messages"]
    assert last_request[-2:] == [
        {"role": "tool", "tool_call_id": "s1", "content": step_text(1)},
        {"role": "tool", "tool_call_id": "a1", "content": "the blue one"},
    ]


async def test_bad_tool_results_are_rejected_naming_them_and_change_nothing() -> None:
    log = MemoryLog()
    chat = ScriptedChat(
        [tool_response(("ask", {"q": "x"}, "a1"), ("ask", {"q": "y"}, "a2")), text_response("ok")]
    )
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(REMOTE_SPEC, "go")
        assert (await settle(host, session_id)).status == "requires_action"
        before = await log.read(session_id)
        bad = {
            "unknown tool call ids ['zz']": [
                ToolResult("a1", "1"),
                ToolResult("a2", "2"),
                ToolResult("zz", "3"),
            ],
            "no result for ['a2']": [ToolResult("a1", "1")],
            "more than one result for ['a1']": [
                ToolResult("a1", "1"),
                ToolResult("a1", "again"),
                ToolResult("a2", "2"),
            ],
        }
        for named, results in bad.items():
            with pytest.raises(InputError, match=named.replace("[", r"\[").replace("]", r"\]")):
                await host.submit_tool_results(session_id, results)
        with pytest.raises(InputError, match="expected ToolResult"):
            await host.submit_tool_results(session_id, ["a1"])  # type: ignore[list-item]
        with pytest.raises(InputError, match="a1, a2; submit them first"):
            await host.send(session_id, "never mind")
        assert await log.read(session_id) == before
        info = await host.status(session_id)
        assert (info.status, [use.id for use in info.pending]) == ("requires_action", ["a1", "a2"])

        await host.submit_tool_results(session_id, [ToolResult("a2", "2"), ToolResult("a1", "1")])
        assert (await settle(host, session_id)).text == "ok"
        with pytest.raises(InputError, match="not waiting for tool results"):
            await host.submit_tool_results(session_id, [ToolResult("a1", "1")])
        await check_consistent(host, log, session_id)


async def test_a_full_mailbox_is_busy_and_queued_messages_are_kept() -> None:
    log = MemoryLog()
    gate = Gate(text_response("first answer"))
    later = ScriptedChat([text_response("second answer")])

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return await (gate if gate.calls == 0 else later)(request)

    async with Host(chat=chat, log=log, mailbox_size=1) as host:
        session_id = await host.start(SPEC, "first")
        await gate.entered.wait()
        await host.send(session_id, "second")
        with pytest.raises(Busy, match=f"session {session_id}: mailbox full"):
            await host.send(session_id, "third")
        info = await host.status(session_id)
        assert (info.status, info.queued) == ("running", 1)
        gate.opened.set()
        info = await settle(host, session_id)
        assert (info.status, info.text, info.queued) == ("idle", "second answer", 0)
        events = await log.read(session_id)
        texts = [e.event.text for e in events if isinstance(e.event, MessageReceived)]
        assert texts == ["first", "second"]
        await check_consistent(host, log, session_id)


async def test_a_message_queued_while_busy_is_logged_and_survives_the_host() -> None:
    log = MemoryLog()
    gate = Gate(text_response("never sent"))
    async with Host(chat=gate, log=log, stop_grace=0.01) as host:
        session_id = await host.start(SPEC, "first")
        await gate.entered.wait()
        await host.send(session_id, "second")
        assert (await host.status(session_id)).queued == 1
    # The host stopped (its model call cut short) before the message was delivered.
    assert gate.cancelled
    logged = await log.read(session_id)
    assert types(logged)[-2:] == ["local.user_message", "local.message_queued"]

    chat = ScriptedChat([text_response("first answer"), text_response("second answer")])
    async with Host(chat=chat, log=log) as host:
        info = await settle(host, session_id)
        assert (info.status, info.text, info.queued) == ("idle", "second answer", 0)
        events = await log.read(session_id)
        texts = [e.event.text for e in events if isinstance(e.event, MessageReceived)]
        assert texts == ["first", "second"]
        await check_consistent(host, log, session_id)


async def test_unknown_sessions_are_named() -> None:
    async with Host(chat=ScriptedChat([])) as host:
        for call in (
            host.status("nope"),
            host.send("nope", "hi"),
            host.events("nope"),
            host.result("nope"),
            host.cancel("nope"),
            host.retry("nope"),
            host.submit_tool_results("nope", []),
        ):
            with pytest.raises(UnknownSession, match="nope"):
                await call
        with pytest.raises(UnknownSession):
            await host.status("")


async def test_a_session_id_is_taken_once() -> None:
    async with Host(chat=ScriptedChat([text_response("hi")])) as host:
        await host.start(SPEC, "hello", session_id="taken")
        with pytest.raises(InputError, match="session_id: taken already exists"):
            await host.start(SPEC, "again", session_id="taken")


async def test_a_stopped_host_takes_no_work() -> None:
    log = MemoryLog()
    host = Host(chat=ScriptedChat([text_response("hi")]), log=log)
    with pytest.raises(HostStopped):
        await host.start(SPEC, "too early")
    async with host:
        session_id = await host.start(SPEC, "hello")
        await settle(host, session_id)
    with pytest.raises(HostStopped, match="not running"):
        await host.start(SPEC, "too late")
    with pytest.raises(HostStopped):
        await host.send(session_id, "too late")
    with pytest.raises(HostStopped):
        await host.submit_tool_results(session_id, [])
    with pytest.raises(HostStopped):
        await host.cancel(session_id)
    assert len(await log.read(session_id)) == 3
    with pytest.raises(RuntimeError, match="has run already; make a new Host"):
        async with host:
            pass


async def test_result_of_a_session_a_stopped_host_left_mid_turn_raises() -> None:
    log = MemoryLog()
    gate = Gate(text_response("never sent"))
    outcomes: list[BaseException] = []

    async def wait_for(session_id: str) -> None:
        try:
            await host.result(session_id)
        except HostStopped as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as waiters:
        async with Host(chat=gate, log=log, stop_grace=0.01) as host:
            session_id = await host.start(SPEC, "think")
            await gate.entered.wait()
            waiters.start_soon(wait_for, session_id)
            await anyio.sleep(0.01)
        # The waiter from before the stop hears of it, as does one after.
        waiters.start_soon(wait_for, session_id)
    assert len(outcomes) == 2
    for exc in outcomes:
        assert f"stopped before session {session_id} came to rest" in str(exc)
    assert (await host.status(session_id)).status == "running"
    async with Host(chat=ScriptedChat([text_response("done now")]), log=log) as again:
        assert (await settle(again, session_id)).text == "done now"


async def test_bad_arguments_are_input_errors() -> None:
    with pytest.raises(InputError, match="mailbox_size"):
        Host(chat=ScriptedChat([]), mailbox_size=0)
    async with Host(chat=ScriptedChat([text_response("hi")])) as host:
        session_id = await host.start(SPEC, "hello")
        await settle(host, session_id)
        with pytest.raises(InputError, match="text: expected a string, got int"):
            await host.send(session_id, 42)  # type: ignore[arg-type]
        refused: dict[str, Any] = {
            "spec: expected an AgentSpec, got dict": host.start({"tools": []}, "hi"),  # type: ignore[arg-type]
            "prompt: expected a string or None, got int": host.start(SPEC, 7),  # type: ignore[arg-type]
            "after: expected an integer from 0 to .*, got -1": host.events(session_id, after=-1),
            "after: expected an integer from 0 to .*, got '2'": host.events(session_id, after="2"),  # type: ignore[arg-type]
            "after: expected an integer from 0 to .*, got 9223372036854775808": host.events(
                session_id, after=2**63
            ),
            "wait: expected a number of seconds from 0 to 1e15, got nan": host.events(
                session_id, wait=NAN
            ),
            "wait: expected None or a number of seconds from 0 to 1e15, got True": host.result(
                session_id, wait=True
            ),
            "cannot encode event": host.start(SPEC, "lone \ud800 surrogate"),
        }
        for named, call in refused.items():
            with pytest.raises(InputError, match=named):
                await call
        assert await host.sessions() == [session_id]


async def test_tool_results_are_checked_field_by_field_and_may_come_from_any_iterable() -> None:
    log = MemoryLog()
    chat = ScriptedChat([tool_response(("ask", {"q": "x"}, "a1")), text_response("ok")])
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(REMOTE_SPEC, "go")
        assert (await settle(host, session_id)).status == "requires_action"
        before = await log.read(session_id)
        refused: dict[str, Any] = {
            "results: expected a list of ToolResult, got NoneType": None,
            "results: expected a list of ToolResult, got str": "a1",
            r"results\[0\]: expected ToolResult": [{"tool_use_id": "a1", "text": "1"}],
            r"results\[0\].tool_use_id: expected str, got 1": [ToolResult(1, "x")],  # type: ignore[arg-type]
            r"results\[0\].text: expected str, got None": [ToolResult("a1", None)],  # type: ignore[arg-type]
            r"results\[0\].is_error: expected bool, got 'yes'": [ToolResult("a1", "1", "yes")],  # type: ignore[arg-type]
        }
        for named, results in refused.items():
            with pytest.raises(InputError, match=named):
                await host.submit_tool_results(session_id, results)
        assert await log.read(session_id) == before
        await host.submit_tool_results(session_id, (r for r in [ToolResult("a1", "answer")]))  # type: ignore[arg-type]
        assert (await settle(host, session_id)).text == "ok"
        logged = [e.event for e in await log.read(session_id)]
        answers = [(r.tool_call_id, r.text) for r in logged if isinstance(r, ToolReturned)]
        assert answers == [("a1", "answer")]
        await check_consistent(host, log, session_id)


async def test_racing_cancels_log_one_cancel_and_a_racing_send_is_refused() -> None:
    log = MemoryLog()
    gate = Gate(text_response("too late"))
    async with Host(chat=gate, log=log) as host:
        busy = await host.start(SPEC, "think")
        idle = await host.start(SPEC, None)
        await gate.entered.wait()
        refused: list[str] = []

        async def send(session_id: str) -> None:
            try:
                await host.send(session_id, "more")
            except InputError as exc:
                refused.append(str(exc))

        for session_id in (busy, idle):
            async with anyio.create_task_group() as group:
                for _ in range(3):
                    group.start_soon(host.cancel, session_id)
                group.start_soon(send, session_id)
            logged = types(await log.read(session_id))
            assert logged.count("local.cancelled") == 1
            # The message was taken before the cancel, or refused after it.
            assert logged[-1] == "local.cancelled"
            await check_consistent(host, log, session_id)
            with pytest.raises(InputError, match=f"{session_id} is cancelled; nothing to retry"):
                await host.retry(session_id)
        assert all(text.endswith("is cancelled and takes no messages") for text in refused)


async def test_cancel_in_a_model_call_stops_the_session_for_good() -> None:
    log = MemoryLog()
    gate = Gate(text_response("too late"))
    async with Host(chat=gate, log=log) as host:
        session_id = await host.start(SPEC, "think hard")
        await gate.entered.wait()
        await host.cancel(session_id, reason="user gave up")
        assert gate.cancelled
        info = await host.status(session_id)
        assert (info.status, info.stop_reason) == ("cancelled", "cancelled")
        events = await host.events(session_id)
        assert types(events)[-1] == "local.cancelled"
        assert events[-1].event == Cancelled(reason="user gave up")
        with pytest.raises(InputError, match="is cancelled and takes no messages"):
            await host.send(session_id, "hello?")
        await host.cancel(session_id)
        assert len(await log.read(session_id)) == len(events)
        await check_consistent(host, log, session_id)
    assert gate.calls == 1


async def test_cancel_a_parked_session_answers_its_calls_in_history() -> None:
    log = MemoryLog()
    chat = ScriptedChat([tool_response(("ask", {"q": "x"}, "a1"))])
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(REMOTE_SPEC, "go")
        assert (await settle(host, session_id)).status == "requires_action"
        await host.cancel(session_id)
        assert (await host.status(session_id)).status == "cancelled"
        with pytest.raises(InputError, match="not waiting for tool results"):
            await host.submit_tool_results(session_id, [ToolResult("a1", "late")])
        await check_consistent(host, log, session_id)


async def test_retries_are_counted_whether_the_call_then_succeeds_or_fails() -> None:
    def down() -> ChatError:
        return ChatError("HTTP 503: down", transient=True, status=503)

    failing = with_retry(ScriptedChat([down(), down(), down()]), max_retries=2, sleep=_no_wait)
    async with Host(chat=failing) as host:
        session_id = await host.start(SPEC, "hello")
        assert (await settle(host, session_id)).status == "errored"
        logged = types(await host.events(session_id)).count("local.chat_retry")
        assert host.counters["chat_retries"] == logged == 2
        assert host.counters["chat_errors"] == 1
    recovering = with_retry(ScriptedChat([down(), text_response("ok")]), sleep=_no_wait)
    async with Host(chat=recovering) as host:
        session_id = await host.start(SPEC, "hello")
        assert (await settle(host, session_id)).text == "ok"
        assert host.counters["chat_retries"] == 1


async def _no_wait(seconds: float) -> None:
    pass


async def test_a_permanent_chat_error_is_errored_and_retry_finishes_it() -> None:
    log = MemoryLog()
    chat = ScriptedChat(
        [ChatError("HTTP 400: context too long", transient=False, status=400), text_response("ok")]
    )
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(SPEC, "hello")
        info = await settle(host, session_id)
        assert (info.status, info.error) == ("errored", "HTTP 400: context too long")
        events = await host.events(session_id)
        assert types(events)[-1] == "local.chat_error"
        failure = events[-1].event
        assert isinstance(failure, ChatFailed)
        assert (failure.status, failure.transient) == (400, False)
        assert host.counters["chat_errors"] == 1
        await check_consistent(host, log, session_id)

        await host.retry(session_id)
        info = await settle(host, session_id)
        assert (info.status, info.text, info.error) == ("idle", "ok", None)
        await check_consistent(host, log, session_id)
    assert chat.calls == 2
    assert chat.requests[0]["messages"] == chat.requests[1]["messages"]


async def test_a_malformed_response_is_errored_with_the_response_kept() -> None:
    log = MemoryLog()
    chat = ScriptedChat([{"nothing": "useful"}])
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(SPEC, "hello")
        info = await settle(host, session_id)
        assert info.status == "errored"
        assert info.error is not None
        assert info.error.startswith("malformed response")
        last = (await log.read(session_id))[-1]
        assert isinstance(last.event, ChatFailed)
        assert last.event.response == {"nothing": "useful"}
        await check_consistent(host, log, session_id)


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param('{"n":' * 600 + "1" + "}" * 600, id="objects 600 deep"),
        pytest.param("[" * 100_000, id="arrays 100k deep"),
    ],
)
@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
async def test_a_call_with_arguments_nested_too_deep_gets_an_error_and_the_session_goes_on(
    arguments: str, kind: str, tmp_path: Path
) -> None:
    ran: list[dict[str, Any]] = []

    async def step(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(args)
        return "ran"

    chat = ScriptedChat([tool_response(("step", arguments, "deep")), text_response("gave up")])
    path = tmp_path / "log"
    async with (
        SqliteLog(path) if kind == "sqlite" else JsonlLog(path) as log,
        Host(chat=chat, log=log, tools=step) as host,
    ):
        session_id = await host.start(SPEC, "take 1 steps")
        info = await settle(host, session_id)
        assert (info.status, info.text, info.error) == ("idle", "gave up", None)
        assert "session_crashes" not in host.counters
        events = await log.read(session_id)
        assert check_log(events) == host._sessions[session_id].state
    async with SqliteLog(path) if kind == "sqlite" else JsonlLog(path) as reopened:
        assert await reopened.read(session_id) == events
    assert ran == []
    assert types(events) == [
        "local.session_opened",
        "local.user_message",
        "local.model_response",
        "local.tool_result",
        "local.tool_results",
        "local.model_response",
    ]
    # The reply is logged as the model gave it, and its call answered with an error.
    reply, answer = events[2].event, events[3].event
    assert isinstance(reply, ModelResponded)
    assert reply.message["tool_calls"][0]["function"]["arguments"] == arguments
    assert isinstance(answer, ToolReturned)
    assert (answer.tool_call_id, answer.is_error) == ("deep", True)
    assert answer.text.startswith("Error: arguments are nested too deeply (more than 64 levels")
    sent = chat.requests[1]["messages"][-1]
    assert (sent["tool_call_id"], json.loads(sent["content"])["error"]) == ("deep", answer.text)


async def test_send_after_idle_starts_a_new_episode() -> None:
    log = MemoryLog()
    async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
        session_id = await host.start(SPEC, prompt_for(2))
        assert (await settle(host, session_id)).text == answer_for(2)
        await host.send(session_id, prompt_for(3))
        info = await settle(host, session_id)
        # polls count the new episode only: three steps and the answer.
        assert (info.status, info.text, info.polls) == ("idle", answer_for(3), 4)
        await check_consistent(host, log, session_id)


async def test_many_sessions_run_side_by_side() -> None:
    log = MemoryLog()
    async with Host(chat=stepper(0.001), log=log, tools=step_tool(0.001)) as host:
        ids = [await host.start(SPEC, prompt_for(1 + i % 4)) for i in range(40)]
        for index, session_id in enumerate(ids):
            info = await settle(host, session_id)
            assert (info.status, info.text) == ("idle", answer_for(1 + index % 4))
            await check_consistent(host, log, session_id)
        assert sorted(await host.sessions()) == sorted(ids)


async def test_events_long_poll_returns_soon_after_a_new_event() -> None:
    log = MemoryLog()
    async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        await settle(host, session_id)
        last = (await host.status(session_id)).seq
        assert await host.events(session_id, after=last, wait=0) == []
        sent_at: list[float] = []

        async def send_later() -> None:
            await anyio.sleep(0.2)
            sent_at.append(anyio.current_time())
            await host.send(session_id, prompt_for(1, "again"))

        async with anyio.create_task_group() as group:
            group.start_soon(send_later)
            started = anyio.current_time()
            found = await host.events(session_id, after=last, wait=5)
            returned = anyio.current_time()
        assert found[0].seq == last + 1
        assert found[0].type == "local.user_message"
        # Woken by the event, not by the 5 s timeout (the latency figures are in bench/).
        assert returned - started < 1.0
        print(f"long-poll woke {1000 * (returned - sent_at[0]):.2f} ms after send")


async def test_events_long_poll_times_out_empty() -> None:
    async with Host(chat=ScriptedChat([text_response("hi")])) as host:
        session_id = await host.start(SPEC, "hello")
        await settle(host, session_id)
        last = (await host.status(session_id)).seq
        started = anyio.current_time()
        assert await host.events(session_id, after=last, wait=0.1) == []
        assert anyio.current_time() - started >= 0.1
        assert len(await host.events(session_id, after=1)) == last - 1


class CountsReads(EventLog):
    """A log counting the reads of session events (mixed in before the log's class)."""

    reads = 0

    async def read(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        self.reads += 1
        return await super().read(session_id, after=after, limit=limit)


class CountingLog(CountsReads, MemoryLog):
    """A MemoryLog counting the reads of session events."""


class CountingSqliteLog(CountsReads, SqliteLog):
    """A SqliteLog counting the reads of session events."""


async def test_long_polls_woken_by_one_change_share_a_read() -> None:
    log = CountingLog()
    async with Host(chat=ScriptedChat([text_response("hi")]), log=log) as host:
        session_id = await host.start(SPEC, None)
        last = (await host.status(session_id)).seq
        found: list[list[Envelope]] = []

        async def poll() -> None:
            found.append(await host.events(session_id, after=last, wait=30))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                for _ in range(100):
                    group.start_soon(poll)
                await anyio.wait_all_tasks_blocked()
                before = log.reads
                await host.send(session_id, "hello")
        assert len(found) == 100
        assert {types(events)[0] for events in found} == {"local.user_message"}
        # One read for the polls each change woke (the session logged a few changes
        # while they woke), not one each.
        assert log.reads - before < 10
        # Each poll has a list of its own.
        found[0].clear()
        assert found[1]


async def test_a_follower_gets_each_event_once_as_logged_without_reading_it_back(
    tmp_path: Path,
) -> None:
    """A long-poll following a session, each from the seq of the last event it has, gets
    every event once and in order, as the file holds them, from the host's memory."""
    async with CountingSqliteLog(tmp_path / "log.sqlite") as log:
        async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
            session_id = await host.start(SPEC, None)
            first = (await host.status(session_id)).seq
            followed: list[Envelope] = []
            prompts = [prompt_for(steps, str(steps)) for steps in (1, 3, 2)]

            last: list[int] = []
            caught_up = anyio.Event()

            async def follow() -> None:
                after = first
                while True:
                    found = await host.events(session_id, after=after, wait=30)
                    followed.extend(found)
                    after = found[-1].seq if found else after
                    if last and after >= last[0]:
                        caught_up.set()

            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    group.start_soon(follow)
                    await anyio.wait_all_tasks_blocked()
                    reads = log.reads
                    for prompt in prompts:
                        await host.send(session_id, prompt)
                        await settle(host, session_id)
                    last.append((await host.status(session_id)).seq)
                    if not followed or followed[-1].seq < last[0]:
                        await caught_up.wait()
                    group.cancel_scope.cancel()
            assert log.reads == reads
        logged = await log.read(session_id, after=first)
    assert [encode_envelope(e) for e in followed] == [encode_envelope(e) for e in logged]
    assert [e.seq for e in followed] == list(range(first + 1, first + 1 + len(logged)))


async def test_a_poll_from_before_the_last_events_reads_the_log() -> None:
    """The events the host keeps for followers serve only a poll they cover: one from
    an earlier seq gets the session's whole log past it."""
    log = CountingLog()
    async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
        session_id = await host.start(SPEC, None)
        assert await host.events(session_id, after=1, wait=0) == []
        await host.send(session_id, prompt_for(4))
        await settle(host, session_id)
        reads = log.reads
        found = await host.events(session_id, after=1)
        assert log.reads == reads + 1
        assert found == await log.read(session_id, after=1)
        assert len(found) > 8


async def test_a_stop_ends_long_polls_and_later_ones_do_not_wait() -> None:
    log = MemoryLog()
    async with Host(chat=ScriptedChat([text_response("hi")]), log=log) as host:
        session_id = await host.start(SPEC, "hello")
        last = (await settle(host, session_id)).seq
        returned: list[list[Envelope]] = []

        async def poll() -> None:
            returned.append(await host.events(session_id, after=last, wait=60))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(poll)
                await anyio.sleep(0.05)
                assert returned == []
                await host.stop()
            assert returned == [[]]
            # Nothing more will be logged: a poll after the stop returns at once.
            assert await host.events(session_id, after=last, wait=60) == []
            assert len(await host.events(session_id, after=last - 1, wait=60)) == 1


async def test_result_waits_until_the_session_is_at_rest() -> None:
    gate = Gate(text_response("finally"))
    async with Host(chat=gate) as host:
        session_id = await host.start(SPEC, "slow")
        info = await host.result(session_id, wait=0.05)
        assert info.status == "running"
        gate.opened.set()
        assert (await host.result(session_id)).text == "finally"


async def test_one_log_line_per_status_transition(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="turnkeeper.host")
    chat = ScriptedChat(
        [tool_response(("ask", {"q": "x"}, "a1")), text_response("done"), text_response("more")]
    )
    async with Host(chat=chat) as host:
        session_id = await host.start(REMOTE_SPEC, "go", session_id="logged")
        await settle(host, session_id)
        await host.submit_tool_results(session_id, [ToolResult("a1", "y")])
        await settle(host, session_id)
        await host.send(session_id, "again")
        await settle(host, session_id)
    lines = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "turnkeeper.host"
    ]
    transitions = [line for line in lines if line["event"] == "session.transition"]
    assert all(line["session_id"] == "logged" for line in transitions)
    assert [(line["previous"], line["status"]) for line in transitions] == [
        (None, "running"),
        ("running", "requires_action"),
        ("requires_action", "running"),
        ("running", "idle"),
        ("idle", "running"),
        ("running", "idle"),
    ]
    assert all("timestamp" in line and line["seq"] >= 1 for line in transitions)


class HeldAfterCommit(MemoryLog):
    """A MemoryLog whose appends, once their events are in, wait for `release` before they
    return: a reader sees a session that `start` has not yet heard is logged."""

    def __init__(self) -> None:
        super().__init__()
        self.committed = anyio.Event()
        self.release = anyio.Event()

    async def append(self, events: Any, *, expected_seq: int) -> None:
        await super().append(events, expected_seq=expected_seq)
        if expected_seq == 0:
            self.committed.set()
            await self.release.wait()


async def test_a_call_racing_start_uses_starts_session_and_makes_no_second_task() -> None:
    calls = 0

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return text_response("hi")

    log = HeldAfterCommit()
    infos: list[Any] = []
    # Bounded, so that a regression fails rather than hangs (the old code hung here).
    with anyio.fail_after(10):
        await race_start(chat, log, infos)
    # The status call answered once `start` had made its record.
    assert len(infos) == 1
    async with Host(chat=chat, log=log) as host:
        info = await settle(host, "s")
    assert (info.status, info.text, calls) == ("idle", "hi", 1)
    check_log(await log.read("s"))


async def race_start(chat: Any, log: HeldAfterCommit, infos: list[Any]) -> None:
    """Start session "s" and, while its first append is held, ask for its status."""
    async with Host(chat=chat, log=log) as host, anyio.create_task_group() as group:

        async def start() -> None:
            await host.start(SPEC, "hello", session_id="s")

        async def look() -> None:
            infos.append(await host.status("s"))

        group.start_soon(start)
        await log.committed.wait()
        group.start_soon(look)
        # A duplicate start meanwhile is refused, as once the first has returned.
        with pytest.raises(InputError, match="s already exists"):
            await host.start(SPEC, "hello", session_id="s")
        await anyio.sleep(0.05)
        assert infos == []
        log.release.set()


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
async def test_a_host_refuses_a_log_it_cannot_write(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("log" if kind == "jsonl" else "log.sqlite")
    opened: Any = JsonlLog if kind == "jsonl" else SqliteLog
    async with opened(path) as writer:
        await writer.sessions()
        for log in (opened(path), opened(path, read_only=True)):
            async with log:
                with pytest.raises(LogError, match=r"only reads .* a host must write its log"):
                    async with Host(chat=ScriptedChat([]), log=log):
                        pass


async def test_a_thousand_crashes_within_the_window_back_off_without_overflow() -> None:
    crashes = 1_100

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal crashes
        if crashes:
            crashes -= 1
            raise RuntimeError("crash")
        return text_response("made it")

    host = Host(chat=chat, max_restarts=2_000, restart_backoff=0.001, max_backoff=0)
    with anyio.fail_after(60):
        async with host:
            await host.start(SPEC, "hello", session_id="s")
            info = await host.result("s", wait=60)
    assert (info.status, info.text, crashes) == ("idle", "made it", 0)


async def test_retry_of_a_session_that_did_not_fail_does_nothing() -> None:
    log = MemoryLog()
    chat = ScriptedChat([text_response("one"), text_response("two")])
    async with Host(chat=chat, log=log) as host:
        await host.start(SPEC, "hello", session_id="s")
        before = await settle(host, "s")
        await host.retry("s")
        # No task woken for nothing: the next message is the next request, not queued.
        assert not host._sessions["s"].running
        await host.send("s", "again")
        after = await settle(host, "s")
    assert (before.text, after.text) == ("one", "two")
    assert "local.message_queued" not in types(await log.read("s"))
