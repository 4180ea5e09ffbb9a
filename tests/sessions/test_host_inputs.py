"""Host: bad arguments are refused up front, before anything changes, with an InputError
(or UnknownSession) naming them."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.sessions.host_worker import SPEC, settle
from turnkeeper import McpServer
from turnkeeper.events import (
    AgentSpec,
    InputError,
    MemoryLog,
    ToolSpec,
    UnloggableEvent,
)
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host

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
