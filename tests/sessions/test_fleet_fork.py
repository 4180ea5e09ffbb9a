"""Host.fork on a fleet of workers sharing one PostgreSQL database: the worker asked
writes the fork and runs it, and any worker serves it."""

from __future__ import annotations

import pytest

from tests.service.server_main import ASK_SPEC, answer_for
from tests.sessions.test_fleet import check_log, worker
from turnkeeper.core import ToolResult
from turnkeeper.events import Forked


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.mark.anyio
async def test_a_fork_on_one_worker_runs_there_and_any_worker_serves_it(
    postgres_url: str,
) -> None:
    async with worker(postgres_url, "a") as a, worker(postgres_url, "b") as b:
        origin = await a.start(ASK_SPEC, "q")
        waiting = await a.result(origin, wait=30)
        assert waiting.status == "requires_action"
        forked = await b.fork(origin, waiting.seq, "fleet-fork")
        assert forked.status == "requires_action"
        (asked,) = forked.pending
        await a.submit_tool_results("fleet-fork", [ToolResult(asked.id, "yes")])
        done = await a.result("fleet-fork", wait=30)
        assert done.text == answer_for("q", "yes")
        events = await a.events("fleet-fork")
        assert events[waiting.seq].event == Forked(origin=origin, at_seq=waiting.seq)
        assert (await b.status(origin)).status == "requires_action"
    check_log(postgres_url, "fleet-fork")
