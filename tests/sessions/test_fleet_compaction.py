"""Compaction on a fleet of workers sharing one PostgreSQL database: the worker running a
session logs its summaries, and the worker that takes the session up next rebuilds the
same history from the log and sends what one Host running the whole session sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.sessions.test_compaction import SPEC, Ledger, events_of, step
from tests.sessions.test_fleet import check_log
from turnkeeper.core import ToolResult
from turnkeeper.events import Compacted
from turnkeeper.logs import MemoryLog, PostgresLog
from turnkeeper.sessions import FleetHost, Host
from turnkeeper.state import replay


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@asynccontextmanager
async def worker(url: str, name: str, chat: Ledger) -> AsyncIterator[FleetHost]:
    async with (
        PostgresLog(url, worker_id=name, lease=5.0, requery=0.2) as log,
        FleetHost(chat=chat, log=log, tools={"step": step}, scan_interval=0.2) as host,
    ):
        yield host


@pytest.mark.anyio
async def test_the_next_worker_sends_what_one_host_would_after_the_summaries(
    postgres_url: str,
) -> None:
    prompt = "take 6 steps then ask"
    answer = [ToolResult("ask-1", "go on")]
    live_chat, first_chat, taken_chat = Ledger(), Ledger(), Ledger()
    async with Host(chat=live_chat, log=MemoryLog(), tools={"step": step}) as host:
        await host.start(SPEC, prompt, session_id="s")
        assert (await host.result("s", wait=30)).status == "requires_action"
        parked = len(live_chat.requests)
        await host.submit_tool_results("s", answer)
        assert (await host.result("s", wait=30)).text == "finished 6 steps"
        live = await host.events("s")
    # Worker a runs the session to where it waits for a person, and stops (releasing it).
    async with worker(postgres_url, "a", first_chat) as a:
        await a.start(SPEC, prompt, session_id="fleet-compacted")
        assert (await a.result("fleet-compacted", wait=30)).status == "requires_action"
        logged = await a.events("fleet-compacted")
    assert events_of(logged, Compacted)
    # Worker b is asked next: it takes the session up from the database and goes on.
    async with worker(postgres_url, "b", taken_chat) as b:
        await b.submit_tool_results("fleet-compacted", answer)
        done = await b.result("fleet-compacted", wait=30)
        assert done.text == "finished 6 steps"
        taken = await b.events("fleet-compacted")
    assert first_chat.requests == live_chat.requests[:parked]
    assert taken_chat.requests == live_chat.requests[parked:]
    assert [e.type for e in taken] == [e.type for e in live]
    assert replay(taken).history == replay(live).history
    check_log(postgres_url, "fleet-compacted")
