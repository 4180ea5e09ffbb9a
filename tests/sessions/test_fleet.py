"""FleetHost: workers sharing one PostgreSQL log, in one process (the multi-process fault
test is tests/service/test_fleet_faults.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from tests.logs.test_postgres_log import eventually, expire, query
from tests.providers.openai_server import Streamed, completion, serve_chat
from tests.service.server_main import ASK_SPEC, LOOKUP_SPEC, answer_for, chat
from turnkeeper.core import AgentSpec, InputError, ToolResult
from turnkeeper.events import TokenDelta, ToolMayHaveRun, ToolReturned
from turnkeeper.logs import PostgresLog
from turnkeeper.providers import OpenAIChat, aclose_shared_client
from turnkeeper.sessions import (
    FleetHost,
    SessionInfo,
    UnknownSession,
    recheck,
    session_id_for,
)
from turnkeeper.state import replay
from turnkeeper.tools import ToolContext


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def lookup(key: str) -> str:
    return key.upper()


@asynccontextmanager
async def worker(
    url: str, name: str, *, lease: float = 5.0, tools: Any = None, model: Any = chat
) -> AsyncIterator[FleetHost]:
    async with (
        PostgresLog(url, worker_id=name, lease=lease, requery=0.2) as log,
        FleetHost(
            chat=model, log=log, tools=tools or {"lookup": lookup}, scan_interval=0.2
        ) as host,
    ):
        yield host


def seqs_and_epochs(url: str, session_id: str) -> list[tuple[int, int]]:
    return [
        (seq, epoch)
        for seq, epoch in query(
            url,
            "SELECT seq, epoch FROM turnkeeper_events WHERE session_id = %s ORDER BY seq",
            (session_id,),
        )
    ]


def check_log(url: str, session_id: str) -> None:
    """The session's seqs run 1..n and its epochs never go down along them."""
    rows = seqs_and_epochs(url, session_id)
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1))
    epochs = [epoch for _, epoch in rows]
    assert epochs == sorted(epochs)


@pytest.mark.anyio
async def test_any_worker_serves_a_session_another_owns(postgres_url: str) -> None:
    async with worker(postgres_url, "a") as a, worker(postgres_url, "b") as b:
        session_id = await a.start(ASK_SPEC, "q")
        info = await b.result(session_id, wait=30)
        # B read it from the log: it waits for the human, and B does not own it.
        assert info.status == "requires_action"
        assert b.shared.epoch(session_id) is None
        (asked,) = info.pending
        await b.submit_tool_results(session_id, [ToolResult(asked.id, "yes")])
        done = await b.result(session_id, wait=30)
        assert done.status == "idle"
        assert done.text == answer_for("q", "yes")
        # A ran it all, and consumed B's request from the inbox.
        assert a.shared.epoch(session_id) is not None
        assert b.shared.epoch(session_id) is None
        await b.send(session_id, "again")
        again = await eventually(lambda: _rested_after(a, session_id, done.seq))
        assert isinstance(again, SessionInfo)
        assert again.text == answer_for("again", "yes") or again.status == "requires_action"
        events = await b.events(session_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    check_log(postgres_url, session_id)
    (consumed,) = query(postgres_url, "SELECT count(*) FROM turnkeeper_inbox")
    assert consumed[0] == 2
    assert query(postgres_url, "SELECT count(*) FROM turnkeeper_inbox WHERE consumed IS NULL") == [
        (0,)
    ]


async def _rested_after(host: FleetHost, session_id: str, seq: int) -> SessionInfo | None:
    info = await host.status(session_id)
    return info if info.seq > seq and info.status != "running" else None


@pytest.mark.anyio
async def test_a_request_with_an_idempotency_key_is_done_once(postgres_url: str) -> None:
    async with worker(postgres_url, "a") as a, worker(postgres_url, "b") as b:
        session_id = await a.start(ASK_SPEC, "q", request_id="create-1")
        assert session_id == session_id_for("create-1")
        with pytest.raises(InputError, match="already exists"):
            await b.start(ASK_SPEC, "q", request_id="create-1")
        info = await a.result(session_id, wait=30)
        (asked,) = info.pending
        results = [ToolResult(asked.id, "yes")]
        await b.submit_tool_results(session_id, results, request_id="results-1")
        # Sent again, to either worker: nothing more happens.
        await a.submit_tool_results(session_id, results, request_id="results-1")
        await b.submit_tool_results(session_id, results, request_id="results-1")
        done = await b.result(session_id, wait=30)
        assert done.text == answer_for("q", "yes")
        returned = [
            e.event.tool_call_id
            for e in await b.events(session_id)
            if isinstance(e.event, ToolReturned)
        ]
        assert returned.count(asked.id) == 1
        # A refusal comes back to the worker that posted the request.
        with pytest.raises(InputError, match="not waiting for tool results"):
            await b.submit_tool_results(session_id, results, request_id="results-2")
        with pytest.raises(UnknownSession):
            await b.send("local_nosuchsession", "hi")
    check_log(postgres_url, session_id)


@pytest.mark.anyio
async def test_a_session_at_rest_with_no_live_owner_goes_to_the_worker_asked(
    postgres_url: str,
) -> None:
    async with worker(postgres_url, "a") as a:
        session_id = await a.start(LOOKUP_SPEC, "q")
        await a.result(session_id, wait=30)
    # A stopped and released it at rest: no scan takes it, the first request does.
    async with worker(postgres_url, "b") as b:
        await anyio.sleep(0.5)
        assert b.shared.epoch(session_id) is None
        await b.send(session_id, "r")
        assert b.shared.epoch(session_id) is not None
        done = await b.result(session_id, wait=30)
        assert done.text == answer_for("r")
    check_log(postgres_url, session_id)


@pytest.mark.anyio
async def test_a_dead_workers_call_in_flight_runs_again_marked_and_the_old_owner_writes_nothing(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnkeeper.fleet")
    runs: list[tuple[str, str]] = []
    release = anyio.Event()

    async def blocking(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        runs.append((ctx.idempotency_key, "first" if not runs else "again"))
        if len(runs) == 1:
            await release.wait()
        return str(args["key"]).upper()

    async with worker(postgres_url, "a", lease=60, tools=blocking) as a:
        session_id = await a.start(LOOKUP_SPEC, "q")
        await eventually(lambda: _true(bool(runs)))
        seq_before = await a.log.last_seq(session_id)
        assert isinstance(a.shared, PostgresLog)
        await expire(postgres_url, a.shared)
        async with worker(postgres_url, "b", tools=blocking) as b:
            done = await eventually(lambda: _rested_after(b, session_id, seq_before))
            assert isinstance(done, SessionInfo)
            assert done.text == answer_for("q")
            assert b.shared.takeovers == 1
            # The old owner's handler returns now: its result is fenced out.
            last = await a.log.last_seq(session_id)
            release.set()
            await eventually(lambda: _true(a.shared.fence_losses > 0))
            assert await a.log.last_seq(session_id) == last
            assert a.shared.epoch(session_id) is None
            events = await b.events(session_id)
    lines = [json.loads(record.getMessage()) for record in caplog.records]
    (takeover,) = [line for line in lines if line["event"] == "fleet.takeover"]
    assert takeover["session_id"] == session_id
    assert takeover["taken_from"] == "a"
    assert takeover["worker"] == "b"
    assert any(line["event"] == "fleet.fence_lost" for line in lines)
    # The log with its mark replays to the end the new owner reached, and rechecks.
    replayed = replay(events)
    assert replayed.status == "idle"
    assert replayed.history[-1]["content"] == answer_for("q")
    assert recheck(events) is None
    marks = [e.event for e in events if isinstance(e.event, ToolMayHaveRun)]
    assert [m.tool_call_id for m in marks] == [runs[0][0].split(":", 1)[1]]
    assert runs[0][0] == runs[1][0] == f"{session_id}:{marks[0].tool_call_id}"
    check_log(postgres_url, session_id)


async def _true(value: bool) -> bool:
    return value


@pytest.mark.anyio
async def test_a_graceful_stop_hands_running_sessions_to_another_worker_at_once(
    postgres_url: str,
) -> None:
    async with worker(postgres_url, "b") as b:
        async with worker(postgres_url, "a") as a:
            session_id = await a.start(LOOKUP_SPEC, "slow-q")
            await a.stop(grace=0)
        done = await b.result(session_id, wait=30)
        assert done.text == answer_for("slow-q")
        assert b.shared.takeovers == 0
        assert b.shared.epoch(session_id) is not None
    check_log(postgres_url, session_id)


@pytest.mark.anyio
async def test_a_worker_that_cannot_renew_its_lease_starts_no_model_call(
    postgres_url: str,
) -> None:
    calls: dict[str, int] = {"a": 0, "b": 0}

    def counting(name: str) -> Any:
        async def counted(request: dict[str, Any]) -> dict[str, Any]:
            calls[name] += 1
            return await chat(request)

        return counted

    async with (
        PostgresLog(postgres_url, worker_id="a", lease=2.0, requery=0.2) as log_a,
        FleetHost(chat=counting("a"), log=log_a, scan_interval=0.2, stop_grace=0) as a,
    ):
        session_id = await a.start(AgentSpec(system_prompt="Echo."), "q")
        first = await a.result(session_id, wait=30)
        made = calls["a"]
        # Its heartbeat stops: soon it no longer knows its lease to be live.
        log_a._stop.set()
        assert log_a._heartbeat is not None
        await anyio.to_thread.run_sync(log_a._heartbeat.join)
        await eventually(lambda: _true(not log_a.lease_held))
        await a.send(session_id, "r")
        async with (
            PostgresLog(postgres_url, worker_id="b", lease=2.0, requery=0.2) as log_b,
            FleetHost(chat=counting("b"), log=log_b, scan_interval=0.2) as b,
        ):
            # Its lease runs out; B takes the session and makes the call A did not.
            done = await eventually(lambda: _rested_after(b, session_id, first.seq + 1))
            assert isinstance(done, SessionInfo)
            assert done.text == "echo: r"
            assert calls["a"] == made
            assert calls["b"] == 1
    check_log(postgres_url, session_id)


@pytest.mark.anyio
async def test_a_long_poll_on_a_worker_that_does_not_own_the_session_wakes_on_its_events(
    postgres_url: str,
) -> None:
    async with worker(postgres_url, "a") as a, worker(postgres_url, "b") as b:
        session_id = await a.start(AgentSpec(system_prompt="Echo."), None)
        seq = (await a.status(session_id)).seq
        found: list[Any] = []

        async def poll() -> None:
            found.extend(await b.events(session_id, after=seq, wait=30))

        async with anyio.create_task_group() as group:
            group.start_soon(poll)
            await anyio.sleep(0.3)
            await a.send(session_id, "hi")
        assert found
        assert found[0].seq == seq + 1
        assert found[0].type == "local.user_message"
        assert b.shared.epoch(session_id) is None
        # And with nothing new, it waits its time and returns nothing.
        last = (await a.result(session_id, wait=30)).seq
        assert await b.events(session_id, after=last, wait=0.3) == []
        with pytest.raises(UnknownSession):
            await b.events("local_nosuchsession", wait=0.1)


@pytest.mark.anyio
async def test_the_scan_runs_every_second_or_every_eighth_of_a_short_lease(
    postgres_url: str,
) -> None:
    def scan_interval(lease: float, **options: float) -> float:
        log = PostgresLog(postgres_url, worker_id=f"lease-{lease}", lease=lease)
        return FleetHost(chat=chat, log=log, **options).scan_interval

    intervals = {lease: scan_interval(lease) for lease in (10.0, 8.0, 2.0, 0.5)}
    assert intervals == {10.0: 1.0, 8.0: 1.0, 2.0: 0.25, 0.5: 0.0625}
    assert scan_interval(2.0, scan_interval=0.7) == 0.7


@pytest.mark.anyio
async def test_the_worker_running_a_session_streams_its_replies_to_a_watcher(
    postgres_url: str,
) -> None:
    answer = "Streamed from the worker that owns the session."
    async with serve_chat(Streamed(completion(answer, id="chatcmpl-f"), size=5)) as server:
        try:
            async with (
                PostgresLog(postgres_url, worker_id="a", lease=5.0, requery=0.2) as log,
                FleetHost(chat=OpenAIChat(server.base_url), log=log, scan_interval=0.2) as host,
            ):
                session_id = await host.start(AgentSpec(), None, session_id="streamed")
                got: list[TokenDelta] = []
                async with host.deltas(session_id) as deltas:
                    await host.send(session_id, "Say it.")
                    info = await host.result(session_id, wait=30)
                    while True:
                        try:
                            got.append(deltas.receive_nowait())
                        except anyio.WouldBlock:
                            break
        finally:
            await aclose_shared_client()
    assert info.text == answer
    assert server.received[0].body.get("stream") is True
    assert len(got) > 1
    assert "".join(d.text for d in got) == answer
    check_log(postgres_url, "streamed")
