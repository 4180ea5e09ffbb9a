"""Waiting for a client, cut short by a stop or the client going away: results, errors,
the stop and the hang-up."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from tests.service.server_main import chat
from turnkeeper.core import AgentSpec
from turnkeeper.service._longpoll import events_or_stop, unless_stopping
from turnkeeper.sessions import Host, UnknownSession

pytestmark = pytest.mark.anyio


async def test_the_call_s_result_comes_back() -> None:
    async def answer() -> int:
        await anyio.lowlevel.checkpoint()
        return 42

    assert await unless_stopping(anyio.Event(), answer, anyio.sleep_forever) == 42


async def test_the_call_s_error_comes_back_unwrapped() -> None:
    async def fail() -> int:
        raise UnknownSession("no session x")

    with pytest.raises(UnknownSession, match="no session x"):
        await unless_stopping(anyio.Event(), fail, anyio.sleep_forever)


@pytest.mark.parametrize("cause", ["stop", "hang-up"])
async def test_a_stop_or_a_hang_up_cancels_the_wait(cause: str) -> None:
    stopping = anyio.Event()
    hung_up = anyio.Event()
    cancelled = anyio.Event()

    async def forever() -> int:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return 0

    async def end_soon() -> None:
        await anyio.wait_all_tasks_blocked()
        (stopping if cause == "stop" else hung_up).set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(end_soon)
            assert await unless_stopping(stopping, forever, hung_up.wait) is None
    assert cancelled.is_set()
    stopped = anyio.Event()
    stopped.set()
    assert await unless_stopping(stopped, forever, anyio.sleep_forever) is None


async def test_events_or_stop_long_polls_the_host() -> None:
    async with Host(chat=chat) as host:
        session_id = await host.start(AgentSpec(), "hi")
        await host.result(session_id, wait=10)
        found = await events_or_stop(
            host, session_id, after=0, wait=0, stopping=anyio.Event(), gone=anyio.sleep_forever
        )
        assert [e.seq for e in found] == list(range(1, len(found) + 1))
        stopping = anyio.Event()
        stopping.set()
        assert (
            await events_or_stop(
                host, session_id, after=0, wait=5, stopping=stopping, gone=anyio.sleep_forever
            )
            == []
        )
