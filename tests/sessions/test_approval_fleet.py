"""Tool approval on a fleet of workers (one PostgreSQL log): a worker that does not own the
session takes the decisions, through the owner's inbox, and gets its refusals back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest

from tests.service.server_main import ASK_HUMAN, LOOKUP, answer_for, chat
from turnkeeper.core import AgentSpec, ApprovalDecision, InputError, ToolResult
from turnkeeper.events import ApprovalDecided
from turnkeeper.logs import PostgresLog
from turnkeeper.sessions import FleetHost
from turnkeeper.state import replay

# Asking the person running the session needs approval first.
SPEC = AgentSpec(
    system_prompt="Ask, then look things up.",
    tools=(LOOKUP, msgspec.structs.replace(ASK_HUMAN, approval="always")),
)


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def lookup(key: str) -> str:
    return key.upper()


@asynccontextmanager
async def worker(url: str, name: str) -> AsyncIterator[FleetHost]:
    async with (
        PostgresLog(url, worker_id=name, lease=5.0, requery=0.2) as log,
        FleetHost(chat=chat, log=log, tools={"lookup": lookup}, scan_interval=0.2) as host,
    ):
        yield host


@pytest.mark.anyio
async def test_any_worker_takes_decisions_on_a_session_another_owns(postgres_url: str) -> None:
    async with worker(postgres_url, "a") as a, worker(postgres_url, "b") as b:
        session_id = await a.start(SPEC, "q")
        info = await b.result(session_id, wait=30)
        assert info.status == "awaiting_approval"
        assert b.shared.epoch(session_id) is None
        (asked,) = info.awaiting
        assert asked.name == "ask_human"
        decision = [ApprovalDecision(asked.id, approved=True)]
        await b.approve(session_id, decision, request_id="approve-1")
        # Sent again with its key: done once.
        await b.approve(session_id, decision, request_id="approve-1")
        info = await b.result(session_id, wait=30)
        assert info.status == "requires_action"
        assert [use.id for use in info.pending] == [asked.id]
        # A refusal comes back to the worker that sent the decisions.
        with pytest.raises(InputError, match="no tool calls awaiting approval"):
            await b.approve(session_id, decision)
        await b.submit_tool_results(session_id, [ToolResult(asked.id, "yes")])
        done = await b.result(session_id, wait=30)
        assert done.text == answer_for("q", "yes")
        assert a.shared.epoch(session_id) is not None
        assert b.shared.epoch(session_id) is None
        events = await b.events(session_id)
    decided = [e.event for e in events if isinstance(e.event, ApprovalDecided)]
    assert decided == [ApprovalDecided(tool_call_id=asked.id, approved=True)]
    assert replay(events).status == "idle"
