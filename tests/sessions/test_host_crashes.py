"""Host supervision: crashes injected into the model and the log, crash loops, hard and
graceful stops, and recovery by a new Host on the same log.

After every crash the log must still say exactly what happened: each session's seqs
contiguous, nothing logged twice (a tool call re-run after a crash excepted), every tool
call answered once in history, and `replay(log)` equal to the host's live state.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sessions.host_worker import (
    SPEC,
    Chat,
    answer_for,
    check_log,
    progress,
    prompt_for,
    settle,
    step_text,
    step_tool,
    stepper,
)
from tests.tools.test_handlers import cancelled_elsewhere
from turnkeeper.core import ChatError, InputError, LogCorrupt, ToolResult
from turnkeeper.events import Envelope, Failed, ToolCalled, ToolMayHaveRun, ToolReturned
from turnkeeper.logs import EventLog, JsonlLog, MemoryLog, SqliteLog
from turnkeeper.sessions import Host, HostStopped, SessionUnreadable
from turnkeeper.state import replay
from turnkeeper.tools import ToolContext

pytestmark = pytest.mark.anyio

Mode = Literal["before", "after"]


class CrashingChat:
    """The stepper model, raising RuntimeError on chosen calls (1-based), optionally in
    the middle of the call (after a short sleep), as a crash of the session task would."""

    def __init__(self, crash_on: Sequence[int] = (), *, mid_await: bool = False) -> None:
        self.model = stepper()
        self.crash_on = set(crash_on)
        self.mid_await = mid_await
        self.calls = 0

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls in self.crash_on:
            if self.mid_await:
                await anyio.sleep(0.01)
            raise RuntimeError(f"model crashed on call {self.calls}")
        return await self.model(request)


Trigger = int | tuple[str, int]
"""The n-th append (from 1), or the n-th append holding an event of a type."""


class FlakyLog(MemoryLog):
    """A MemoryLog whose chosen appends fail with OSError: `before` writing (nothing is
    logged) or `after` (logged, but the host never hears so: a lost acknowledgement)."""

    def __init__(self, failures: dict[Trigger, Mode] | None = None) -> None:
        super().__init__()
        self.failures = dict(failures or {})
        self.appends = 0
        self.seen: Counter[str] = Counter()

    async def append(self, events: Sequence[Envelope], *, expected_seq: int) -> None:
        self.appends += 1
        kinds = sorted({envelope.type for envelope in events})
        self.seen.update(kinds)
        modes = [self.failures.get(self.appends)]
        modes += [self.failures.get((kind, self.seen[kind])) for kind in kinds]
        what = ", ".join(kinds)
        if "before" in modes:
            raise OSError(f"cannot append {what}")
        await super().append(events, expected_seq=expected_seq)
        if "after" in modes:
            raise OSError(f"appended {what} but not acknowledged")


class CountingTools:
    """The step handler, counting runs per tool call id."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.handler = step_tool()

    async def __call__(self, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        self.runs[ctx.tool_call_id] += 1
        return await self.handler(name, args, ctx)


def payloads(events: Sequence[Envelope], *, skip: tuple[str, ...] = ()) -> list[bytes]:
    """The events as (type, payload), without times, leaving out the `skip` types."""
    return [msgspec.json.encode(e.event) for e in events if e.type not in skip]


async def check_host(host: Host, log: EventLog) -> None:
    """Every session's log checks out and replays to the host's live state."""
    for session_id in await log.sessions():
        state = check_log(await log.read(session_id))
        assert state == host._sessions[session_id].state, session_id
        assert state.seq == (await host.status(session_id)).seq


async def clean_run(steps: int) -> list[Envelope]:
    """The log of the same session with nothing going wrong."""
    log = MemoryLog()
    async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
        session_id = await host.start(SPEC, prompt_for(steps), session_id="s")
        await settle(host, session_id)
    return await log.read(session_id)


@pytest.mark.parametrize("crash_on", [(1,), (3,), (2, 4)])
@pytest.mark.parametrize("mid_await", [False, True])
async def test_a_model_crash_restarts_the_session_from_the_log(
    crash_on: tuple[int, ...], mid_await: bool
) -> None:
    log = MemoryLog()
    chat = CrashingChat(crash_on, mid_await=mid_await)
    async with Host(chat=chat, log=log, tools=step_tool(), restart_backoff=0.001) as host:
        session_id = await host.start(SPEC, prompt_for(3), session_id="s")
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(3))
        assert host.counters["session_crashes"] == len(crash_on)
        await check_host(host, log)
    # A crash loses nothing and adds nothing: the log is the log of a clean run.
    assert payloads(await log.read(session_id)) == payloads(await clean_run(3))
    assert chat.calls == 4 + len(crash_on)


async def test_a_raising_tool_handler_is_an_error_result_not_a_crash() -> None:
    log = MemoryLog()
    failed: list[str] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        if args["n"] == 2 and not failed:
            failed.append(ctx.tool_call_id)
            raise RuntimeError("tool blew up")
        return step_text(args["n"])

    async with Host(chat=stepper(), log=log, tools=handler) as host:
        session_id = await host.start(SPEC, prompt_for(3))
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(3))
        assert "session_crashes" not in host.counters
        assert host.counters["tool_errors"] == 1
        await check_host(host, log)
    history = replay(await log.read(session_id)).history
    answers = {m["tool_call_id"]: m["content"] for m in history if m["role"] == "tool"}
    assert "RuntimeError: tool blew up" in answers["step-2"]
    assert answers["step-3"] == step_text(3)


RESULT_1 = ("local.tool_result", 1)
CALL_2 = ("local.tool_call", 2)
RESULTS_1 = ("local.tool_results", 1)
REPLY_2 = ("local.model_response", 2)
REPLY_3 = ("local.model_response", 3)


# A 2-step session: reply 1 calls step-1, results 1 carry its result to reply 2, which
# calls step-2; reply 3 is the answer.
@pytest.mark.parametrize(
    ("failures", "logged_calls", "tool_runs", "model_calls"),
    [
        # The result is not logged: the call is logged and run again, under the same id.
        ({RESULT_1: "before"}, {"step-1": 2, "step-2": 1}, {"step-1": 2, "step-2": 1}, 3),
        # The result is logged but not acknowledged: the rebuilt session has it.
        ({RESULT_1: "after"}, {"step-1": 1, "step-2": 1}, {"step-1": 1, "step-2": 1}, 3),
        # The call is logged but not acknowledged, so it never ran: it is logged again.
        ({CALL_2: "after"}, {"step-1": 1, "step-2": 2}, {"step-1": 1, "step-2": 1}, 3),
        # The model's reply is not logged: the model is asked again.
        ({REPLY_2: "before"}, {"step-1": 1, "step-2": 1}, {"step-1": 1, "step-2": 1}, 4),
        # The reply is logged (with its call) but not acknowledged: no second model call;
        # the call is logged again before it runs.
        ({REPLY_2: "after"}, {"step-1": 1, "step-2": 2}, {"step-1": 1, "step-2": 1}, 3),
        # The final answer is logged but not acknowledged: the rebuilt session is idle.
        ({REPLY_3: "after"}, {"step-1": 1, "step-2": 1}, {"step-1": 1, "step-2": 1}, 3),
        # The results (logged with the result) are not logged, so step-1 runs again; then
        # the answer is not acknowledged.
        (
            {RESULTS_1: "before", REPLY_3: "after"},
            {"step-1": 2, "step-2": 1},
            {"step-1": 2, "step-2": 1},
            3,
        ),
    ],
)
async def test_a_crash_while_logging_resumes_from_what_the_log_holds(
    failures: dict[Trigger, Mode],
    logged_calls: dict[str, int],
    tool_runs: dict[str, int],
    model_calls: int,
) -> None:
    log = FlakyLog(failures)
    tools = CountingTools()
    chat = CrashingChat()
    async with Host(chat=chat, log=log, tools=tools, restart_backoff=0.001) as host:
        session_id = await host.start(SPEC, prompt_for(2), session_id="s")
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(2))
        assert host.counters["session_crashes"] == len(failures)
        await check_host(host, log)
    assert dict(tools.runs) == tool_runs
    assert chat.calls == model_calls
    events = await log.read(session_id)
    calls = Counter(e.event.tool_call_id for e in events if isinstance(e.event, ToolCalled))
    assert dict(calls) == logged_calls
    # Each call logged again is marked, once, as one that may have run.
    marks = Counter(e.event.tool_call_id for e in events if isinstance(e.event, ToolMayHaveRun))
    assert dict(marks) == {call_id: n - 1 for call_id, n in logged_calls.items() if n > 1}
    skip = ("local.tool_call", "local.tool_may_have_run")
    assert payloads(events, skip=skip) == payloads(await clean_run(2), skip=skip)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.integers(1, 4),
    chat_crashes=st.sets(st.integers(1, 8), max_size=3),
    log_failures=st.dictionaries(
        st.integers(2, 20), st.sampled_from(["before", "after"]), max_size=4
    ),
)
async def test_any_crashes_leave_the_log_equal_to_a_clean_run(
    steps: int, chat_crashes: set[int], log_failures: dict[Trigger, Mode]
) -> None:
    log = FlakyLog(log_failures)
    tools = CountingTools()
    async with Host(
        chat=CrashingChat(sorted(chat_crashes)),
        log=log,
        tools=tools,
        max_restarts=100,
        restart_backoff=0.0,
    ) as host:
        session_id = await host.start(SPEC, prompt_for(steps), session_id="s")
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(steps))
        await check_host(host, log)
    events = await log.read(session_id)
    skip = ("local.tool_call", "local.tool_may_have_run")
    assert payloads(events, skip=skip) == payloads(await clean_run(steps), skip=skip)
    logged_calls = Counter(e.event.tool_call_id for e in events if isinstance(e.event, ToolCalled))
    # At least once, and never run without a logged call first.
    assert set(tools.runs) == {f"step-{n}" for n in range(1, steps + 1)}
    assert all(tools.runs[i] <= logged_calls[i] for i in tools.runs)


async def test_a_crash_loop_fails_one_session_while_100_siblings_finish() -> None:
    log = MemoryLog()
    model = stepper()
    explosions = 0

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal explosions
        if "explode" in progress(request["messages"])[2]:
            explosions += 1
            raise RuntimeError("boom")
        return await model(request)

    async with Host(
        chat=chat, log=log, tools=step_tool(), max_restarts=3, restart_backoff=0.01
    ) as host:
        doomed = await host.start(SPEC, prompt_for(2, "explode"), session_id="doomed")
        siblings = [await host.start(SPEC, prompt_for(1 + i % 3)) for i in range(100)]
        info = await settle(host, doomed)
        assert (info.status, info.error) == ("failed", "RuntimeError: boom")
        events = await host.events(doomed)
        assert events[-1].type == "local.failed"
        assert events[-1].event == Failed(error="RuntimeError: boom")
        with pytest.raises(InputError, match="doomed is failed"):
            await host.send(doomed, "try again")
        for index, session_id in enumerate(siblings):
            info = await settle(host, session_id)
            assert (info.status, info.text) == ("idle", answer_for(1 + index % 3))
        assert host.counters["session_crashes"] == 4
        await check_host(host, log)
    assert explosions == 4
    assert replay(await log.read(doomed)).status == "failed"


CRASHED = "OSError: cannot append local.tool_call, local.tool_may_have_run"


async def test_a_crash_loop_while_running_tools_records_the_real_error() -> None:
    # Step-1's result fails, then its call, run again, twice: three crashes.
    log = FlakyLog({RESULT_1: "before", CALL_2: "before", ("local.tool_call", 3): "before"})
    async with Host(
        chat=stepper(), log=log, tools=step_tool(), max_restarts=2, restart_backoff=0.001
    ) as host:
        session_id = await host.start(SPEC, prompt_for(2))
        info = await settle(host, session_id)
        # Not "ExceptionGroup: ...": the error inside the tools' task group is named.
        assert (info.status, info.error) == ("failed", CRASHED)
        await check_host(host, log)
    events = await log.read(session_id)
    assert [e.type for e in events][-2:] == ["local.tool_call", "local.failed"]
    assert events[-1].event == Failed(error=CRASHED)


async def test_a_stray_cancellation_fails_one_call_and_touches_no_sibling() -> None:
    log = MemoryLog()
    model = stepper()
    strays = {"chat": 0, "tool": 0}

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        if progress(request["messages"])[2].endswith("chat") and not strays["chat"]:
            strays["chat"] += 1
            await cancelled_elsewhere()
        return await model(request)

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        if ctx.session_id == "tool" and not strays["tool"]:
            strays["tool"] += 1
            await cancelled_elsewhere()
        return step_text(args["n"])

    async with Host(chat=chat, log=log, tools=handler, restart_backoff=0.001) as host:
        for name in ("chat", "tool", "sibling"):
            await host.start(SPEC, prompt_for(2, name), session_id=name)
        for name in ("chat", "tool", "sibling"):
            info = await settle(host, name)
            assert (info.status, info.text) == ("idle", answer_for(2))
        # The model call's is a crash of its session, restarted from the log; the tool
        # call's is that call's error result, which the model sees.
        assert host.counters["session_crashes"] == 1
        assert host.counters["tool_errors"] == 1
        await check_host(host, log)
    assert strays == {"chat": 1, "tool": 1}
    results = [e.event for e in await log.read("tool") if isinstance(e.event, ToolReturned)]
    assert results[0].is_error
    assert results[0].text.startswith(("CancelledError", "Stray: a future"))


async def test_stop_ends_a_session_waiting_out_its_restart_backoff_at_once() -> None:
    log = MemoryLog()
    crashed = anyio.Event()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        crashed.set()
        raise RuntimeError("model down")

    async with Host(chat=chat, log=log, restart_backoff=60) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        await crashed.wait()
        await anyio.sleep(0.01)
        assert host._sessions[session_id].backing_off
        with anyio.fail_after(5):
            await host.stop()
        await check_host(host, log)
    assert [e.type for e in await log.read(session_id)][-1] == "local.user_message"


async def test_crashes_spread_wider_than_the_restart_window_never_fail_a_session() -> None:
    log = MemoryLog()
    chat = CrashingChat([1, 2, 3, 4, 5])
    # Each restart waits 10 ms, so no two crashes fall within one 5 ms window.
    async with Host(
        chat=chat,
        log=log,
        tools=step_tool(),
        max_restarts=1,
        restart_window=0.005,
        restart_backoff=0.01,
    ) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(1))
        assert host.counters["session_crashes"] == 5
        await check_host(host, log)


async def test_a_log_that_refuses_the_failure_still_fails_the_session_in_memory() -> None:
    log = FlakyLog()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        # From the first crash on, every append fails: the log is gone.
        log.failures = dict.fromkeys(range(log.appends + 1, log.appends + 100), "before")
        raise RuntimeError("boom")

    async with Host(chat=chat, log=log, max_restarts=1, restart_backoff=0.001) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        info = await settle(host, session_id)
        assert (info.status, info.stop_reason, info.error) == (
            "failed",
            "failed",
            "RuntimeError: boom",
        )
        assert [e.type for e in await log.read(session_id)][-1] == "local.user_message"


async def test_a_crash_of_a_retried_model_call_does_not_undo_the_retry() -> None:
    log = MemoryLog()
    model = stepper()
    calls = 0

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ChatError("HTTP 400: bad request", transient=False, status=400)
        if calls == 2:
            raise RuntimeError("backend bug")
        return await model(request)

    async with Host(chat=chat, log=log, tools=step_tool(), restart_backoff=0.001) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        info = await settle(host, session_id)
        assert (info.status, info.error) == ("errored", "HTTP 400: bad request")
        # retry() is not logged: the log still ends in the chat error when the retried
        # call crashes, yet the restarted session makes the call again.
        await host.retry(session_id)
        info = await settle(host, session_id)
        assert (info.status, info.text, info.error) == ("idle", answer_for(1), None)
        await check_host(host, log)
    assert calls == 4


async def test_a_chat_error_logged_though_its_append_raised_leaves_the_session_errored() -> None:
    log = FlakyLog({("local.chat_error", 1): "after"})

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        raise ChatError("HTTP 401: bad key", transient=False, status=401)

    async with Host(chat=chat, log=log, restart_backoff=0.001) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        info = await settle(host, session_id)
        assert (info.status, info.error) == ("errored", "HTTP 401: bad key")
        await check_host(host, log)


async def test_a_cancel_the_log_refuses_leaves_the_session_going_on() -> None:
    log = FlakyLog({("local.cancelled", 1): "before"})
    model = stepper()
    entered = anyio.Event()
    opened = anyio.Event()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        if not opened.is_set():
            entered.set()
            await opened.wait()
        return await model(request)

    async with Host(chat=chat, log=log, tools=step_tool()) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        await entered.wait()
        with pytest.raises(OSError, match=r"cannot append local\.cancelled"):
            await host.cancel(session_id)
        opened.set()
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(1))
        await host.send(session_id, prompt_for(2))
        assert (await settle(host, session_id)).text == answer_for(2)
        await host.cancel(session_id)
        assert (await host.status(session_id)).status == "cancelled"
        await check_host(host, log)


async def test_a_cancel_its_caller_gives_up_on_leaves_the_session_going_on() -> None:
    log = MemoryLog()
    started = anyio.Event()

    async def tools(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        if not started.is_set():
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                # Slow to stop: the cancel's caller gives up first.
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.1)
        return step_text(int(args["n"]))

    async with Host(chat=stepper(), log=log, tools=tools) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        await started.wait()
        with anyio.move_on_after(0.02) as scope:
            await host.cancel(session_id)
        assert scope.cancelled_caught
        # Nothing says the session was cancelled: its task starts again and runs the
        # call again (it was logged, not answered), marked as one that may have run.
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(1))
        events = await log.read(session_id)
        kinds = [e.type for e in events]
        assert kinds.count("local.tool_call") == 2
        marked = kinds.index("local.tool_may_have_run")
        assert kinds[marked + 1] == "local.tool_call"
        assert kinds.index("local.tool_call") < marked
        await check_host(host, log)


async def test_results_logged_though_their_append_raised_are_taken_up() -> None:
    log = FlakyLog({("local.tool_result", 1): "after"})
    async with Host(chat=stepper(), log=log) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        assert (await settle(host, session_id)).status == "requires_action"
        with pytest.raises(OSError, match="not acknowledged"):
            await host.submit_tool_results(session_id, [ToolResult("step-1", step_text(1))])
        # The host takes up what the log holds and goes on from there.
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(1))
        await check_host(host, log)


class Blocker:
    """A model and a tool handler that block for chosen sessions, as a stuck call would."""

    def __init__(self) -> None:
        self.model = stepper()
        self.tool = step_tool()
        self.poll_blocked = anyio.Event()
        self.tool_blocked = anyio.Event()

    async def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        _, answered, text = progress(request["messages"])
        if "errored" in text:
            raise ChatError("HTTP 401: bad key", transient=False, status=401)
        if "mid-poll" in text and answered == 1:
            self.poll_blocked.set()
            await anyio.sleep_forever()
        return await self.model(request)

    async def tools(self, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        if ctx.session_id == "mid-tool" and args["n"] == 2:
            self.tool_blocked.set()
            await anyio.sleep_forever()
        return await self.tool(name, args, ctx)


class Recorder:
    """The stepper model and step tool, recording each call by session (from its prompt)."""

    def __init__(self) -> None:
        self.model = stepper()
        self.tool = step_tool()
        self.calls: Counter[str] = Counter()
        self.runs: list[tuple[str, str]] = []

    async def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls[progress(request["messages"])[2].split()[-1]] += 1
        return await self.model(request)

    async def tools(self, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        self.runs.append((ctx.session_id, ctx.tool_call_id))
        return await self.tool(name, args, ctx)


SESSIONS = ("done", "mid-poll", "mid-tool", "errored")


@pytest.mark.parametrize("how", ["scope around the host", "host task group"])
async def test_a_new_host_finishes_what_a_hard_stopped_one_left(tmp_path: Path, how: str) -> None:
    path = tmp_path / "events.db"
    blocker = Blocker()
    async with SqliteLog(path) as log:
        with anyio.CancelScope() as outer:
            async with Host(chat=blocker.chat, log=log, tools=blocker.tools) as host:
                for name in SESSIONS:
                    await host.start(SPEC, prompt_for(3, name), session_id=name)
                assert (await settle(host, "done")).status == "idle"
                assert (await settle(host, "errored")).status == "errored"
                await blocker.poll_blocked.wait()
                await blocker.tool_blocked.wait()
                if how == "host task group":
                    assert host._group is not None
                    host._group.cancel_scope.cancel()
                else:
                    outer.cancel()
                    await anyio.sleep_forever()
        assert outer.cancelled_caught == (how != "host task group")
        before = {name: await log.read(name) for name in SESSIONS}
    assert before["mid-poll"][-1].type == "local.tool_results"
    assert before["mid-tool"][-1].type == "local.tool_call"
    stuck_call = before["mid-tool"][-1].event
    assert isinstance(stuck_call, ToolCalled)
    assert stuck_call.tool_call_id == "step-2"

    recorder = Recorder()
    async with (
        SqliteLog(path) as log,
        Host(chat=recorder.chat, log=log, tools=recorder.tools) as host,
    ):
        assert host.counters["sessions_recovered"] == 2
        for name in ("mid-poll", "mid-tool"):
            info = await settle(host, name)
            assert (info.status, info.text) == ("idle", answer_for(3))
        info = await host.status("errored")
        assert (info.status, info.error) == ("errored", "HTTP 401: bad key")
        assert recorder.calls["errored"] == 0
        await host.retry("errored")
        assert (await settle(host, "errored")).text == answer_for(3)
        assert (await host.status("done")).text == answer_for(3)
        await check_host(host, log)
        after = {name: await log.read(name) for name in SESSIONS}
    for name in SESSIONS:
        # Nothing logged before the stop changed; each model call made after it is one
        # logged after it: none for a poll whose answer was logged, one for the one in flight.
        assert after[name][: len(before[name])] == before[name]
        new = after[name][len(before[name]) :]
        assert recorder.calls[name] == sum(e.type == "local.model_response" for e in new)
    assert after["done"] == before["done"]
    assert recorder.calls["mid-poll"] == 3
    # The tool call logged without a result ran again, under its id, marked first.
    assert recorder.runs.count(("mid-tool", "step-2")) == 1
    again = [e.event for e in after["mid-tool"][len(before["mid-tool"]) :]]
    assert again[:2] == [ToolMayHaveRun("step-2", stuck_call.name), stuck_call]
    assert sum(isinstance(event, ToolMayHaveRun) for event in again) == 1
    assert ("mid-tool", "step-1") not in recorder.runs


async def test_stop_lets_a_turn_finish_within_the_grace_and_cancels_the_rest() -> None:
    log = MemoryLog()
    model = stepper()
    quick_gate = anyio.Event()
    entered = {"quick": anyio.Event(), "stuck": anyio.Event()}

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        name = progress(request["messages"])[2].split()[-1]
        entered[name].set()
        if name == "quick":
            await quick_gate.wait()
        else:
            await anyio.sleep_forever()
        return await model(request)

    host = Host(chat=chat, log=log, tools=step_tool())
    async with host:
        await host.start(SPEC, prompt_for(2, "quick"), session_id="quick")
        await host.start(SPEC, prompt_for(2, "stuck"), session_id="stuck")
        for event in entered.values():
            await event.wait()
        async with anyio.create_task_group() as group:
            group.start_soon(host.stop, 1.0)
            await anyio.sleep(0.01)
            quick_gate.set()
        quick = await log.read("quick")
        stuck = await log.read("stuck")
        # The quick session finished its turn within the grace: its reply's call ran and
        # its result is logged; the next model call is left to the next host.
        assert [e.type for e in quick][-3:] == [
            "local.model_response",
            "local.tool_call",
            "local.tool_result",
        ]
        assert replay(quick).status == "requires_action"
        assert not replay(quick).in_poll
        # The stuck one was cancelled in its model call; its log ends with the input.
        assert [e.type for e in stuck][-1] == "local.user_message"
        assert replay(stuck).in_poll
        await check_host(host, log)
        with pytest.raises(HostStopped, match="not running"):
            await host.send("quick", "more")

    recorder = Recorder()
    async with Host(chat=recorder.chat, log=log, tools=recorder.tools) as again:
        for name, logged in (("quick", quick), ("stuck", stuck)):
            info = await settle(again, name)
            assert (info.status, info.text) == ("idle", answer_for(2))
            new = (await log.read(name))[len(logged) :]
            assert recorder.calls[name] == sum(e.type == "local.model_response" for e in new)
        await check_host(again, log)
        # Nothing of the quick session's was cut short, so nothing is marked as such.
        assert "local.tool_may_have_run" not in [e.type for e in await log.read("quick")]
    assert recorder.calls == {"quick": 2, "stuck": 3}


async def test_recovery_skips_an_unreadable_session_and_resumes_the_others() -> None:
    log = MemoryLog()
    gate = anyio.Event()

    async def stalled(request: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        raise AssertionError("never answered")

    async with Host(chat=stalled, log=log, stop_grace=0) as host:
        await host.start(SPEC, prompt_for(1), session_id="good")
    # A hand-made session whose log cannot be replayed (it does not start with an open).
    broken = (await log.read("good"))[1]
    await log.append([Envelope("broken", 1, broken.at, broken.event)], expected_seq=0)

    model: Chat = stepper()
    async with Host(chat=model, log=log, tools=step_tool()) as host:
        assert host.counters["sessions_recovered"] == 1
        assert (await settle(host, "good")).text == answer_for(1)
        assert sorted(await host.sessions()) == ["broken", "good"]
        info = await host.status("broken")
        assert info.status == "unreadable"
        assert info.error is not None
        assert "seq 1" in info.error
        with pytest.raises(SessionUnreadable, match="broken cannot be rebuilt"):
            await host.send("broken", "hello")


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
async def test_recovery_reads_session_by_session_past_a_damaged_row(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / ("log.sqlite" if kind == "sqlite" else "jsonl")
    gate = anyio.Event()

    def open_log() -> EventLog:
        return SqliteLog(path) if kind == "sqlite" else JsonlLog(path)

    async def stalled(request: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        raise AssertionError("never answered")

    async with open_log() as log, Host(chat=stalled, log=log, stop_grace=0) as host:
        for name in ("good", "damaged", "also-good"):
            await host.start(SPEC, prompt_for(1, name), session_id=name)
    if kind == "sqlite":
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute(
            "UPDATE events SET body = x'7b' WHERE session_id = 'damaged' AND seq = 2"
        )
        connection.close()
    else:
        lines = (path / "damaged.jsonl").read_bytes().split(b"\n")
        (path / "damaged.jsonl").write_bytes(b"\n".join([lines[0], b"{", *lines[2:]]))

    async with open_log() as log:
        # The one pass over the log stops at the damaged row...
        with pytest.raises(LogCorrupt, match="damaged"):
            await log.read_all()
        async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
            # ... so the host reads the sessions one by one, and loses only that one.
            assert host.counters["sessions_recovered"] == 2
            for name in ("good", "also-good"):
                assert (await settle(host, name)).text == answer_for(1)
            # That session alone is quarantined: shown as unreadable, counted apart.
            info = await host.status("damaged")
            assert (info.status, info.seq) == ("unreadable", 0)
            assert info.error is not None
            assert "damaged" in info.error
            with pytest.raises(SessionUnreadable, match="session damaged cannot be rebuilt"):
                await host.events("damaged")
            assert await host.statuses() == {"idle": 2, "unreadable": 1}


class ResultRefusingSqlite(SqliteLog):
    """A SqliteLog that refuses the first append holding a tool result (nothing logged),
    as a disk error would: the session task crashes after its `local.tool_call` landed."""

    refused = False

    async def append(self, events: Sequence[Envelope], *, expected_seq: int) -> None:
        if not self.refused and any(e.type == "local.tool_result" for e in events):
            self.refused = True
            raise OSError("disk full")
        await super().append(events, expected_seq=expected_seq)


def marks_of(events: Sequence[Envelope]) -> list[str]:
    return [e.event.tool_call_id for e in events if isinstance(e.event, ToolMayHaveRun)]


async def test_a_call_run_again_after_a_crash_is_marked_once_first(tmp_path: Path) -> None:
    tools = CountingTools()
    async with (
        ResultRefusingSqlite(tmp_path / "events.db") as log,
        Host(chat=stepper(), log=log, tools=tools, restart_backoff=0.001) as host,
    ):
        session_id = await host.start(SPEC, prompt_for(2))
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", answer_for(2))
        assert host.counters["session_crashes"] == 1
        await check_host(host, log)
        events = await log.read(session_id)
    assert dict(tools.runs) == {"step-1": 2, "step-2": 1}
    # The mark comes just before step-1's second `local.tool_call`, and only there.
    assert marks_of(events) == ["step-1"]
    types = [e.type for e in events]
    index = types.index("local.tool_may_have_run")
    assert types[index - 1 : index + 3] == [
        "local.tool_call",
        "local.tool_may_have_run",
        "local.tool_call",
        "local.tool_result",
    ]


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
async def test_a_host_reopened_on_a_call_with_no_result_marks_it_then_runs_it(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / ("events.db" if kind == "sqlite" else "events.jsonl")

    def opened() -> EventLog:
        return SqliteLog(path) if kind == "sqlite" else JsonlLog(path)

    blocker = Blocker()
    async with opened() as log:
        with anyio.CancelScope() as hard_stop:
            async with Host(chat=blocker.chat, log=log, tools=blocker.tools) as host:
                await host.start(SPEC, prompt_for(3, "mid-tool"), session_id="mid-tool")
                await blocker.tool_blocked.wait()
                hard_stop.cancel()
        before = await log.read("mid-tool")
    assert [e.type for e in before][-1] == "local.tool_call"
    # Step-1 was answered before the stop: only step-2 may have run.
    assert marks_of(before) == []

    tools = CountingTools()
    async with opened() as log, Host(chat=stepper(), log=log, tools=tools) as host:
        info = await settle(host, "mid-tool")
        assert (info.status, info.text) == ("idle", answer_for(3))
        await check_host(host, log)
        after = await log.read("mid-tool")
    assert dict(tools.runs) == {"step-2": 1, "step-3": 1}
    stuck = before[-1].event
    assert isinstance(stuck, ToolCalled)
    new = [e.event for e in after[len(before) :]]
    assert new[:2] == [ToolMayHaveRun(stuck.tool_call_id, stuck.name), stuck]
    assert marks_of(after) == ["step-2"]


async def test_calls_answered_from_outside_are_never_marked(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteLog(path) as log, Host(chat=stepper(), log=log) as host:
        session_id = await host.start(SPEC, prompt_for(2))
        assert (await settle(host, session_id)).status == "requires_action"
    # A new host on the same log (no handler: the caller answers every call).
    async with SqliteLog(path) as log, Host(chat=stepper(), log=log) as host:
        for step in (1, 2):
            assert (await settle(host, session_id)).pending[0].id == f"step-{step}"
            await host.submit_tool_results(session_id, [ToolResult(f"step-{step}", "ok")])
        assert (await settle(host, session_id)).status == "idle"
        await check_host(host, log)
        events = await log.read(session_id)
    assert marks_of(events) == []
    assert not any(isinstance(e.event, ToolCalled) for e in events)
