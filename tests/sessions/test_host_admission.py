"""Host admission control (`max_model_calls`) and the cheap paths of a turn: starting a
session without a log read, a session at rest without a task, appends that are never
cancelled halfway without a shield around each."""

from __future__ import annotations

from collections.abc import Sequence
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
    stepper,
)
from turnkeeper.core import InputError
from turnkeeper.events import Envelope
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import ScriptedChat, text_response
from turnkeeper.sessions import Host
from turnkeeper.sessions._host_actor import _IDLE_TASKS
from turnkeeper.tools import ToolContext

pytestmark = pytest.mark.anyio


class Counting:
    """A model that notes how many of its calls are in flight at once."""

    def __init__(self, delay: float = 0.01) -> None:
        self.chat = stepper(delay)
        self.in_flight = 0
        self.most = 0
        self.calls = 0

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            return await self.chat(request)
        finally:
            self.in_flight -= 1


class Meeting:
    """A model whose calls each wait (up to `patience` seconds) until `expected` of them
    are in flight at once: they overlap exactly when nothing holds any of them back."""

    def __init__(self, expected: int, patience: float = 10.0) -> None:
        self.expected = expected
        self.patience = patience
        self.in_flight = 0
        self.most = 0
        self.all_in = anyio.Event()

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight == self.expected:
            self.all_in.set()
        try:
            with anyio.move_on_after(self.patience):
                await self.all_in.wait()
            return text_response("done")
        finally:
            self.in_flight -= 1


class Gate:
    """A model whose first call blocks until the gate opens; the others answer at once."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.opened = anyio.Event()
        self.calls = 0

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            await self.opened.wait()
        return text_response("done")


async def test_max_model_calls_bounds_the_calls_in_flight() -> None:
    log = MemoryLog()
    model = Counting()

    async def step(n: int) -> str:
        return step_text(n)

    async with Host(chat=model, log=log, tools={"step": step}, max_model_calls=3) as host:
        ids = [await host.start(SPEC, prompt_for(2, str(i))) for i in range(12)]
        infos = [await settle(host, session_id) for session_id in ids]
    assert [info.text for info in infos] == [answer_for(2)] * 12
    assert model.most == 3
    assert model.calls == host.counters["model_calls"] == 12 * 3
    for session_id in ids:
        check_log(await log.read(session_id))


async def test_sessions_waiting_for_a_model_call_slot_hold_no_task() -> None:
    log = MemoryLog()
    gate = Gate()
    async with Host(chat=gate, log=log, max_model_calls=1) as host:
        first = await host.start(SPEC, "first")
        await gate.entered.wait()
        waiting = [await host.start(SPEC, f"waiting {i}") for i in range(5)]
        await anyio.wait_all_tasks_blocked()
        for session_id in waiting:
            assert (await host.status(session_id)).status == "running"
            assert not host._sessions[session_id].running
        assert host._sessions[first].running
        gate.opened.set()
        infos = [await settle(host, session_id) for session_id in [first, *waiting]]
    assert [info.text for info in infos] == ["done"] * 6
    assert gate.calls == 6
    for session_id in [first, *waiting]:
        check_log(await log.read(session_id))


async def test_without_a_bound_the_calls_overlap() -> None:
    # Each call waits for the others, so how fast the sessions start does not matter.
    model = Meeting(6)
    async with Host(chat=model) as host:
        ids = [await host.start(SPEC, prompt_for(0, str(i))) for i in range(6)]
        for session_id in ids:
            await settle(host, session_id)
    assert model.most == 6
    assert model.all_in.is_set()


async def test_a_session_waiting_for_a_model_call_slot_can_be_cancelled() -> None:
    log = MemoryLog()
    gate = Gate()
    async with Host(chat=gate, log=log, max_model_calls=1) as host:
        first = await host.start(SPEC, "first")
        await gate.entered.wait()
        waiting = await host.start(SPEC, "second")
        await anyio.sleep(0.01)
        assert (await host.status(waiting)).status == "running"
        with anyio.fail_after(2):
            await host.cancel(waiting, reason="changed my mind")
        assert (await host.status(waiting)).status == "cancelled"
        gate.opened.set()
        assert (await settle(host, first)).text == "done"
        # The slot the cancelled waiter never got is free: a new session gets it.
        third = await host.start(SPEC, "third")
        assert (await settle(host, third)).text == "done"
    assert gate.calls == 2
    state = check_log(await log.read(waiting))
    assert state.status == "cancelled"


async def test_stop_makes_no_call_for_a_session_waiting_for_a_slot() -> None:
    log = MemoryLog()
    gate = Gate()
    host = Host(chat=gate, log=log, max_model_calls=1)
    async with host:
        first = await host.start(SPEC, "first")
        await gate.entered.wait()
        waiting = await host.start(SPEC, "second")
        with anyio.fail_after(2):
            async with anyio.create_task_group() as group:
                group.start_soon(host.stop, 5.0)
                await anyio.sleep(0.01)
                # The call in flight ends; the waiter gets its slot, sees the stop and
                # leaves its logged request for the next host (well before the grace).
                gate.opened.set()
    assert gate.calls == 1
    assert (await log.read(first))[-1].type == "local.model_response"
    assert check_log(await log.read(waiting)).in_poll
    async with Host(chat=ScriptedChat([text_response("resumed")]), log=log) as again:
        assert (await settle(again, waiting)).text == "resumed"


async def test_stop_after_the_grace_cancels_calls_in_flight_and_waiting() -> None:
    log = MemoryLog()
    gate = Gate()
    with anyio.fail_after(2):
        async with Host(chat=gate, log=log, max_model_calls=1, stop_grace=0.05) as host:
            first = await host.start(SPEC, "first")
            await gate.entered.wait()
            waiting = await host.start(SPEC, "second")
    assert gate.calls == 1
    for session_id in (first, waiting):
        assert check_log(await log.read(session_id)).in_poll


async def test_max_model_calls_must_be_positive() -> None:
    with pytest.raises(InputError, match="max_model_calls"):
        Host(chat=ScriptedChat([]), max_model_calls=0)


async def test_a_session_id_already_in_the_log_is_refused() -> None:
    log = MemoryLog()
    async with (
        Host(chat=ScriptedChat([text_response("hi")]), log=log) as one,
        Host(chat=ScriptedChat([text_response("hi")]), log=log) as other,
    ):
        # `other` recovered the log before `one` wrote the session: only the log knows.
        await one.start(SPEC, "hello", session_id="shared")
        with pytest.raises(InputError, match="session_id: shared already exists"):
            await other.start(SPEC, "again", session_id="shared")
        assert (await settle(one, "shared")).text == "hi"
        assert [e.type for e in await log.read("shared")] == [
            "local.session_opened",
            "local.user_message",
            "local.model_response",
        ]


async def test_concurrent_starts_of_one_id_open_it_once() -> None:
    log = MemoryLog()
    outcomes: list[str] = []

    async with Host(chat=ScriptedChat([text_response("hi")]), log=log) as host:

        async def start() -> None:
            try:
                outcomes.append(await host.start(SPEC, "hello", session_id="once"))
            except InputError as exc:
                outcomes.append(str(exc))

        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(start)
        assert (await settle(host, "once")).text == "hi"
    assert sorted(outcomes) == ["once"] + ["session_id: once already exists"] * 2
    check_log(await log.read("once"))


async def test_a_session_at_rest_holds_no_task_and_a_message_wakes_it() -> None:
    log = MemoryLog()
    chat = ScriptedChat([text_response("first"), text_response("second")])
    async with Host(chat=chat, log=log) as host:
        session_id = await host.start(SPEC, "one")
        assert (await settle(host, session_id)).text == "first"

        def running() -> bool:
            return host._sessions[session_id].running

        assert not running()
        # Looking at a session at rest does not start a task for it.
        await host.status(session_id)
        await host.events(session_id)
        assert not running()
        await host.send(session_id, "two")
        assert running()
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", "second")
        assert not running()
    check_log(await log.read(session_id))


class GatedLog(MemoryLog):
    """A MemoryLog that, once it has logged a model response, holds the append until the
    gate opens: the events are in the log, the append has not returned."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.gate = anyio.Event()

    async def append(self, events: Sequence[Envelope], *, expected_seq: int) -> None:
        await super().append(events, expected_seq=expected_seq)
        if any(e.type == "local.model_response" for e in events) and not self.gate.is_set():
            self.entered.set()
            await self.gate.wait()


async def test_cancel_in_the_middle_of_an_append_waits_for_it() -> None:
    log = GatedLog()
    async with Host(chat=ScriptedChat([text_response("hi")]), log=log) as host:
        session_id = await host.start(SPEC, "hello")
        await log.entered.wait()
        async with anyio.create_task_group() as group:
            group.start_soon(host.cancel, session_id, "too slow")
            await anyio.sleep(0.01)
            assert (await host.status(session_id)).status == "running"
            log.gate.set()
        assert (await host.status(session_id)).status == "cancelled"
        events = await log.read(session_id)
        assert [e.type for e in events][-2:] == ["local.model_response", "local.cancelled"]
        assert check_log(events) == host._sessions[session_id].state


async def test_a_host_cancelled_from_outside_mid_append_keeps_its_state_equal_to_the_log() -> None:
    log = GatedLog()

    async def open_later() -> None:
        await log.entered.wait()
        await anyio.sleep(0.05)
        log.gate.set()

    async with anyio.create_task_group() as group:
        group.start_soon(open_later)
        with anyio.CancelScope() as outer:
            async with Host(chat=ScriptedChat([text_response("hi")]), log=log) as host:
                session_id = await host.start(SPEC, "hello")
                await log.entered.wait()
                outer.cancel()
                await anyio.sleep_forever()
    assert outer.cancelled_caught
    events = await log.read(session_id)
    assert events[-1].type == "local.model_response"
    assert check_log(events) == host._sessions[session_id].state


class CountingStarts:
    """Counts the tasks a host's task group starts (wrapping its start_soon)."""

    def __init__(self, host: Host) -> None:
        assert host._group is not None
        self.group = host._group
        self.start_soon = self.group.start_soon
        self.started = 0
        setattr(self.group, "start_soon", self._counted)  # noqa: B010 (a Final attribute)

    def _counted(self, *args: Any, **kwargs: Any) -> None:
        self.started += 1
        self.start_soon(*args, **kwargs)


async def test_a_turn_goes_to_a_session_task_waiting_idle_not_a_new_one() -> None:
    log = MemoryLog()

    async def step(n: int) -> str:
        return step_text(n)

    async with Host(chat=stepper(), log=log, tools={"step": step}, max_model_calls=2) as host:
        ids = [await host.start(SPEC, prompt_for(2, str(i))) for i in range(8)]
        for session_id in ids:
            await settle(host, session_id)
        # Every session at rest; the tasks that ran them wait to be handed more.
        assert all(not host._sessions[session_id].running for session_id in ids)
        assert 1 <= len(host._idle) <= _IDLE_TASKS
        starts = CountingStarts(host)
        for session_id in ids:
            await host.send(session_id, prompt_for(1, "again"))
            assert (await settle(host, session_id)).text == answer_for(1)
        assert starts.started == 0
        idle = list(host._idle)
    assert host._idle == []
    assert all(task.handed.is_set() and task.session is None for task in idle)
    for session_id in ids:
        check_log(await log.read(session_id))


async def test_no_more_than_the_bound_of_session_tasks_wait_idle() -> None:
    count = _IDLE_TASKS + 20
    # Each call waits for all the others: every session has a task of its own at once.
    model = Meeting(count)
    async with Host(chat=model) as host:
        ids = [await host.start(SPEC, f"hello {i}") for i in range(count)]
        for session_id in ids:
            assert (await settle(host, session_id)).text == "done"
        await anyio.wait_all_tasks_blocked()
        assert model.most == count
        assert len(host._idle) == _IDLE_TASKS


async def test_a_stop_runs_the_calls_of_the_reply_in_flight_within_the_grace() -> None:
    # Stopped while the model call is in flight: the reply comes back within the grace with
    # a call, logged as called; the call runs and its result is logged, and no model call
    # follows. The host taken up later goes on from the result, with nothing marked as a
    # call that may have run.
    log = MemoryLog()
    answered = anyio.Event()
    ran: list[str] = []
    model = stepper()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        await answered.wait()
        return await model(request)

    async def tools(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(ctx.tool_call_id)
        await anyio.sleep(0.05)
        return step_text(int(args["n"]))

    with anyio.fail_after(10):
        async with Host(chat=chat, log=log, tools=tools, stop_grace=5) as host:
            session_id = await host.start(SPEC, prompt_for(2))
            await anyio.wait_all_tasks_blocked()
            async with anyio.create_task_group() as group:
                group.start_soon(host.stop)
                await anyio.wait_all_tasks_blocked()
                answered.set()
        kinds = [e.type for e in await log.read(session_id)]
        assert kinds[-2:] == ["local.tool_call", "local.tool_result"]
        assert len(ran) == 1
        async with Host(chat=chat, log=log, tools=tools) as later:
            assert (await settle(later, session_id)).text == answer_for(2)
    kinds = [e.type for e in await log.read(session_id)]
    assert "local.tool_may_have_run" not in kinds
    assert kinds.count("local.tool_call") == len(ran) == 2
    assert check_log(await log.read(session_id)).status == "idle"
