"""Compaction on a fleet of workers sharing one PostgreSQL database: the worker running a
session logs its summaries, and the worker that takes the session up next rebuilds the
same history from the log and sends what one Host running the whole session sends."""

from __future__ import annotations

import pytest

from tests.sessions.test_compaction import (
    PARKED_ANSWER,
    PARKED_PROMPT,
    SPEC,
    Ledger,
    events_of,
    run_live,
    step,
)
from tests.sessions.test_fleet import check_log, worker
from turnkeeper.events import Compacted
from turnkeeper.logs import MemoryLog
from turnkeeper.state import replay


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.mark.anyio
async def test_the_next_worker_sends_what_one_host_would_after_the_summaries(
    postgres_url: str,
) -> None:
    live_chat, first_chat, taken_chat = Ledger(), Ledger(), Ledger()
    parked, live = await run_live(MemoryLog(), live_chat)
    tools = {"step": step}
    # Worker a runs the session to where it waits for a person, and stops (releasing it).
    async with worker(postgres_url, "a", tools=tools, model=first_chat) as a:
        await a.start(SPEC, PARKED_PROMPT, session_id="fleet-compacted")
        assert (await a.result("fleet-compacted", wait=30)).status == "requires_action"
        logged = await a.events("fleet-compacted")
    assert events_of(logged, Compacted)
    # Worker b is asked next: it takes the session up from the database and goes on.
    async with worker(postgres_url, "b", tools=tools, model=taken_chat) as b:
        await b.submit_tool_results("fleet-compacted", PARKED_ANSWER)
        done = await b.result("fleet-compacted", wait=30)
        assert done.text == "finished 6 steps"
        taken = await b.events("fleet-compacted")
    assert first_chat.requests == live_chat.requests[:parked]
    assert taken_chat.requests == live_chat.requests[parked:]
    assert [e.type for e in taken] == [e.type for e in live]
    assert replay(taken).history == replay(live).history
    check_log(postgres_url, "fleet-compacted")
