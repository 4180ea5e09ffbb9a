"""Waiting for a client, cut short by a stop: results, errors and the stop itself."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from tests.service.server_main import chat
from turnkeeper.events import AgentSpec
from turnkeeper.service._longpoll import events_or_stop, unless_stopping
from turnkeeper.sessions import Host, UnknownSession

pytestmark = pytest.mark.anyio


async def test_the_call_s_result_comes_back() -> None:
    async def answer() -> int:
        await anyio.lowlevel.checkpoint()
        return 42

    assert await unless_stopping(anyio.Event(), answer) == 42


async def test_the_call_s_error_comes_back_unwrapped() -> None:
    async def fail() -> int:
        raise UnknownSession("no session x")

    with pytest.raises(UnknownSession, match="no session x"):
        await unless_stopping(anyio.Event(), fail)


async def test_a_stop_cancels_the_wait() -> None:
    stopping = anyio.Event()
    cancelled = anyio.Event()

    async def forever() -> int:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return 0

    async def stop_soon() -> None:
        await anyio.wait_all_tasks_blocked()
        stopping.set()

    async with anyio.create_task_group() as group:
        group.start_soon(stop_soon)
        assert await unless_stopping(stopping, forever) is None
    assert cancelled.is_set()
    stopped = anyio.Event()
    stopped.set()
    assert await unless_stopping(stopped, forever) is None


async def test_events_or_stop_long_polls_the_host() -> None:
    async with Host(chat=chat) as host:
        session_id = await host.start(AgentSpec(), "hi")
        await host.result(session_id, wait=10)
        found = await events_or_stop(host, session_id, after=0, wait=0, stopping=anyio.Event())
        assert [e.seq for e in found] == list(range(1, len(found) + 1))
        stopping = anyio.Event()
        stopping.set()
        assert await events_or_stop(host, session_id, after=0, wait=5, stopping=stopping) == []
