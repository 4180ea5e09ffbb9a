"""Host: bad arguments are refused up front, before anything changes, with an InputError
(or UnknownSession) naming them; and reads go on working after a stop."""

from __future__ import annotations

import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.sessions.host_worker import SPEC, settle
from turnkeeper import McpServer
from turnkeeper.core import AgentSpec, InputError, ToolResult, ToolSpec, UnloggableEvent
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, UnknownSession

pytestmark = pytest.mark.anyio

LONE = "lone \ud800 surrogate"
CHARGE = ToolSpec("charge", "Charge a card.", {"type": "object", "properties": {}})
CHARGING = AgentSpec(system_prompt="Charge once.", tools=(CHARGE,))
MCP_SPEC = AgentSpec(
    system_prompt="Add with the tool.",
    mcp_servers=(
        McpServer(
            "calc",
            command=sys.executable,
            args=(str(Path(__file__).parents[1] / "tools" / "mcp_server.py"),),
            timeout=30,
        ),
    ),
)


def types(events: list[Any]) -> list[str]:
    return [envelope.type for envelope in events]


async def test_a_cancel_with_a_reason_the_log_refuses_leaves_the_work_in_flight_alone() -> None:
    runs = 0
    started = anyio.Event()
    release = anyio.Event()

    async def charge() -> str:
        nonlocal runs
        runs += 1
        started.set()
        await release.wait()
        return "charged"

    log = MemoryLog()
    chat = ScriptedChat([tool_response(("charge", {}, "c1")), text_response("done")])
    async with Host(chat=chat, log=log, tools={"charge": charge}) as host:
        session_id = await host.start(CHARGING, "pay")
        await started.wait()
        before = await log.read(session_id)
        refused: dict[Any, str] = {
            123: "reason: expected a string, got int",
            None: "reason: expected a string, got NoneType",
            LONE: "reason: cannot encode event",
        }
        # Bounded: a cancel that ended the task would wait for the charge run again.
        with anyio.fail_after(5):
            for reason, named in refused.items():
                with pytest.raises(InputError, match=named):
                    await host.cancel(session_id, reason=reason)
        # Refused before the session's task was touched: the call is still in flight.
        assert host._sessions[session_id].running
        assert await log.read(session_id) == before
        release.set()
        info = await settle(host, session_id)
        assert (info.status, info.text) == ("idle", "done")
    # The charge ran once, and was never cut short to run again.
    assert runs == 1
    assert len(chat.requests) == 2
    assert "local.cancelled" not in types(await log.read(session_id))


async def test_a_cancel_with_an_empty_reason_is_a_cancel_even_if_the_call_then_raises() -> None:
    entered = anyio.Event()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        try:
            await anyio.sleep(10)
        except BaseException:
            # A backend that raises its own error when cancelled.
            raise RuntimeError("broke while cancelled") from None
        return text_response("too late")

    log = MemoryLog()
    async with Host(chat=chat, log=log, max_restarts=0) as host:
        session_id = await host.start(SPEC, "go")
        await entered.wait()
        await host.cancel(session_id, reason="")
        info = await host.status(session_id)
        # Not a crash given up on: the cancel is what ended the call.
        assert (info.status, info.error) == ("cancelled", None)
        assert "session_crashes" not in host.counters
    assert types(await log.read(session_id))[-1] == "local.cancelled"


async def test_a_message_the_log_refuses_is_refused_naming_the_text() -> None:
    log = MemoryLog()
    async with Host(chat=ScriptedChat([text_response("hi")]), log=log) as host:
        session_id = await host.start(SPEC, "hello")
        await settle(host, session_id)
        before = await log.read(session_id)
        with pytest.raises(UnloggableEvent, match="text: cannot encode event"):
            await host.send(session_id, LONE)
        assert await log.read(session_id) == before
        assert (await host.status(session_id)).status == "idle"


async def test_a_start_with_mcp_servers_is_refused_before_any_server_starts() -> None:
    log = MemoryLog()
    async with Host(chat=ScriptedChat([]), log=log) as host:
        await host.start(SPEC, None, session_id="taken")
        refused: dict[str, Callable[[], Awaitable[str]]] = {
            "cannot encode event": lambda: host.start(MCP_SPEC, LONE),
            "session_id: taken already exists": lambda: host.start(
                MCP_SPEC, "add", session_id="taken"
            ),
            "max_turns": lambda: host.start(MCP_SPEC, "add", max_turns=0),
        }
        for named, start in refused.items():
            with pytest.raises(InputError, match=named):
                await start()
        assert host._mcp.connections == 0
        assert await log.sessions() == ["taken"]


@pytest.mark.parametrize("bad", [["x"], {"a": 1}, 5, None, ""], ids=repr)
async def test_a_session_id_that_is_not_a_string_is_an_unknown_session(bad: Any) -> None:
    async with Host(chat=ScriptedChat([text_response("hi")])) as host:
        await settle(host, await host.start(SPEC, "hello"))
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: host.status(bad),
            lambda: host.events(bad),
            lambda: host.result(bad),
            lambda: host.send(bad, "hi"),
            lambda: host.cancel(bad),
            lambda: host.retry(bad),
            lambda: host.submit_tool_results(bad, [ToolResult("a1", "x")]),
        ]
        for call in calls:
            with pytest.raises(UnknownSession, match="no session"):
                await call()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("chat", None),
        ("guard", "loop"),
        ("clock", 5),
        ("log", "agents.sqlite"),
        ("tools", 42),
        ("mailbox_size", "5"),
        ("mailbox_size", 0),
        ("mailbox_size", True),
        ("max_restarts", -1),
        ("max_restarts", 1.5),
        ("tool_concurrency", 0),
        ("max_model_calls", 0),
        ("max_model_calls", True),
        ("max_model_calls", 2.0),
        ("max_resting", -1),
        ("restart_window", 0),
        ("restart_window", math.inf),
        ("restart_window", "60"),
        ("restart_backoff", math.nan),
        ("restart_backoff", -0.1),
        ("max_backoff", math.inf),
        ("max_backoff", True),
        ("stop_grace", math.nan),
        ("stop_grace", math.inf),
        ("stop_grace", -1),
        # Past the float range: refused, not an OverflowError.
        ("stop_grace", 10**400),
        ("restart_window", 10**400),
        ("tool_timeout", 0),
        ("tool_timeout", math.nan),
        ("tool_timeout", -1.0),
        ("tool_timeout", False),
    ],
)
async def test_bad_host_arguments_are_refused_naming_them(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=field):
        Host(**{"chat": ScriptedChat([]), field: value})


async def test_host_arguments_at_their_bounds_are_taken() -> None:
    host = Host(
        chat=ScriptedChat([text_response("hi")]),
        mailbox_size=1,
        max_restarts=0,
        restart_window=0.5,
        restart_backoff=0,
        max_backoff=0.0,
        stop_grace=0,
        tool_concurrency=1,
        tool_timeout=0.01,
        max_model_calls=None,
        max_resting=0,
    )
    async with host:
        info = await settle(host, await host.start(SPEC, "hello"))
    assert info.text == "hi"


async def test_waits_and_the_stop_grace_are_finite_seconds_checked_before_anything() -> None:
    async with Host(chat=ScriptedChat([text_response("hi"), text_response("again")])) as host:
        session_id = await host.start(SPEC, "hello")
        await settle(host, session_id)
        refused: dict[str, Callable[[], Awaitable[object]]] = {
            "wait: expected a number of seconds from 0 to 1e15, got -1": lambda: host.events(
                session_id, wait=-1
            ),
            "wait: expected a number of seconds from 0 to 1e15, got inf": lambda: host.events(
                session_id, wait=math.inf
            ),
            "wait: expected a number of seconds from 0 to 1e15, got '1'": lambda: host.events(
                session_id,
                wait="1",  # type: ignore[arg-type]
            ),
            ("wait: expected None or a number of seconds from 0 to 1e15, got -0.5"): lambda: (
                host.result(session_id, wait=-0.5)
            ),
            ("wait: expected None or a number of seconds from 0 to 1e15, got inf"): lambda: (
                host.result(session_id, wait=math.inf)
            ),
            "wait: expected a number of seconds from 0 to 1e15, got 1000": lambda: host.events(
                session_id, wait=10**400
            ),
            "after: expected an integer .*, got True": lambda: host.events(session_id, after=True),
            "after: expected an integer .*, got 1.0": lambda: host.events(
                session_id,
                after=1.0,  # type: ignore[arg-type]
            ),
            ("grace: expected None or a number of seconds from 0 to 1e15, got nan"): lambda: (
                host.stop(grace=math.nan)
            ),
            "grace: expected None or a number of seconds from 0 to 1e15, got -1": lambda: host.stop(
                grace=-1
            ),
        }
        for named, call in refused.items():
            with pytest.raises(InputError, match=named):
                await call()
        # The refused stops stopped nothing: the host still takes work.
        await host.send(session_id, "more")
        assert (await settle(host, session_id)).text == "again"


@pytest.mark.parametrize("max_resting", [None, 0])
async def test_reads_after_a_stop_answer_from_the_log_the_host_made(
    max_resting: int | None,
) -> None:
    host = Host(chat=ScriptedChat([text_response("hi")]), max_resting=max_resting)
    async with host:
        session_id = await host.start(SPEC, "hello")
        info = await settle(host, session_id)
        events = await host.events(session_id)
    # With max_resting=0 the session was dropped from memory and is read back.
    assert (session_id in host._sessions) is (max_resting is None)
    assert await host.status(session_id) == info
    assert await host.result(session_id) == info
    assert await host.events(session_id) == events
    assert await host.events(session_id, after=1, wait=1) == events[1:]
    assert await host.sessions() == [session_id]
    assert await host.statuses() == {"idle": 1}
