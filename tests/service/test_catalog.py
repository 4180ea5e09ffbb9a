"""The inspector's index of a log: the statuses it gives are a real Host's; the list is in
the order of last activity and pages through every session once, filtered by status and
by id; it reads a log as it grows, a budget at a time, also a SQLite file or a JsonlLog
directory another log object writes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, ChatError, GuardConfig, LoopDetection, ToolSpec
from turnkeeper.events import Envelope
from turnkeeper.logs import EventLog, JsonlLog, MemoryLog, SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.service import _catalog
from turnkeeper.service._catalog import Catalog
from turnkeeper.sessions import (
    Host,
    UnknownSession,
    UserMessage,
    begin_poll,
    end_poll,
    open_session,
)
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

ASK = ToolSpec("ask_human", "Ask the person.", {"type": "object", "properties": {}})
LOOKUP = ToolSpec(
    "lookup", "Look up.", {"type": "object", "properties": {"key": {"type": "string"}}}
)
SPEC = AgentSpec(tools=(ASK, LOOKUP))


def opened(session_id: str, prompt: str, at: float) -> list[Envelope]:
    """A session's first events: opened, its prompt, and the model's answer."""
    state = open_session(AgentSpec(), session_id=session_id)
    events, state, _ = begin_poll(state, UserMessage(prompt), now=at)
    answered, _ = end_poll(state, text_response(f"re: {prompt}", usage=(3, 1)), now=at + 0.1)
    return events + answered


async def append_session(
    log: EventLog, session_id: str, prompt: str = "hi", at: float = 1.0
) -> None:
    await log.append(opened(session_id, prompt, at), expected_seq=0)


async def follow_up(log: EventLog, session_id: str, at: float) -> None:
    """A second request of the session, answered."""
    events = await log.read(session_id)
    state = replay(events)
    begun, state, _ = begin_poll(state, UserMessage("more"), now=at)
    answered, _ = end_poll(state, text_response("again"), now=at)
    await log.append(begun + answered, expected_seq=events[-1].seq)


class Model:
    """A chat per prompt: `ask` asks the orchestrator, `loop` repeats one call, `down` is
    unreachable, `crash` raises what no backend should, `wait` waits for `release`."""

    def __init__(self) -> None:
        self.release = anyio.Event()

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        first = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if first == "ask":
            return tool_response(("ask_human", {}, f"c{len(request['messages'])}"))
        if first == "loop":
            return tool_response(("lookup", {"key": "k"}, f"c{len(request['messages'])}"))
        if first == "down":
            raise ChatError("connection refused", transient=True)
        if first == "crash":
            raise RuntimeError("a bug in the backend")
        if first == "wait":
            await self.release.wait()
        return text_response("done")


async def lookup(key: str) -> str:
    return key.upper()


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Return once `check()` is true (a Host's sessions settle in their own time)."""
    for _ in range(1500):
        if await check():
            return
        await anyio.sleep(0.02)
    raise AssertionError("not within 30 seconds")


async def test_the_statuses_are_the_ones_a_host_gives() -> None:
    model = Model()
    log = MemoryLog()
    async with Host(
        chat=model, log=log, tools={"lookup": lookup}, restart_backoff=0, max_restarts=1
    ) as host:
        # `loop` halts: its stop is not turned into an answer.
        halts = GuardConfig(loop=LoopDetection(answer=False))
        ids = {
            prompt: await host.start(
                SPEC, prompt, session_id=prompt, guards=halts if prompt == "loop" else None
            )
            for prompt in ("ask", "loop", "down", "crash", "wait", "plain")
        }
        cancelled = await host.start(SPEC, "ask", session_id="cancelled")
        idle = await host.start(SPEC, None, session_id="idle")

        async def settled() -> bool:
            statuses = {key: (await host.status(key)).status for key in [*ids, cancelled]}
            return "running" not in {v for k, v in statuses.items() if k != "wait"}

        await eventually(settled)
        await host.cancel(cancelled)
        catalog = Catalog(log)
        await catalog.catch_up(budget=10)
        expected = {key: (await host.status(key)).status for key in [*ids, cancelled, idle]}
        assert expected == {
            "ask": "requires_action",
            "loop": "halted",
            "down": "errored",
            "crash": "failed",
            "wait": "running",
            "plain": "idle",
            "cancelled": "cancelled",
            "idle": "idle",
        }
        page = catalog.page(limit=100)
        assert {summary.session_id: summary.status for summary in page.sessions} == expected
        assert catalog.counts() == {
            "requires_action": 1,
            "halted": 1,
            "errored": 1,
            "failed": 1,
            "running": 1,
            "idle": 2,
            "cancelled": 1,
        }
        assert catalog.summary("down").error == "connection refused"
        assert "a bug in the backend" in str(catalog.summary("crash").error)
        assert catalog.summary("loop").stop_reason == "going_in_circles"

        # What happens next moves the sessions, and their counts.
        model.release.set()
        await eventually(lambda: _idle(host, "wait"))
        await catalog.catch_up(budget=10)
        assert catalog.summary("wait").status == "idle"
        assert catalog.counts()["idle"] == 3
        assert "running" not in catalog.counts()
        assert catalog.page(limit=1).sessions[0].session_id == "wait"


async def _idle(host: Host, session_id: str) -> bool:
    return (await host.status(session_id)).status == "idle"


async def test_the_list_is_in_the_order_of_last_activity_and_pages_through_each_once() -> None:
    log = MemoryLog()
    for n in range(25):
        await append_session(log, f"s{n:02}", at=float(n))
    await follow_up(log, "s03", at=100.0)
    await follow_up(log, "s10", at=101.0)
    catalog = Catalog(log, page=7)
    await catalog.catch_up(budget=10)
    assert not catalog.indexing
    assert catalog.total == 25
    seen: list[str] = []
    cursor = None
    while True:
        page = catalog.page(limit=4, cursor=cursor)
        assert page.matched == 25
        seen += [summary.session_id for summary in page.sessions]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["s10", "s03"] + [f"s{n:02}" for n in range(24, -1, -1) if n not in (3, 10)]
    assert catalog.summary("s10").events == 5
    assert catalog.summary("s10").polls == 2
    assert catalog.summary("s10").last_at == 101.0


async def test_search_by_id_in_any_case_and_a_status_filter_count_what_they_match() -> None:
    log = MemoryLog()
    for name in ("Alpha-1", "alpha-2", "beta-1", "ALPHA-3", "gamma"):
        await append_session(log, name)
    catalog = Catalog(log)
    await catalog.catch_up(budget=10)
    page = catalog.page(search="alpha", limit=2)
    assert [s.session_id for s in page.sessions] == ["ALPHA-3", "alpha-2"]
    assert page.matched == 3
    assert page.next_cursor is not None
    rest = catalog.page(search="ALPHA", limit=2, cursor=page.next_cursor)
    assert [s.session_id for s in rest.sessions] == ["Alpha-1"]
    assert rest.matched == 3
    assert rest.next_cursor is None
    assert catalog.page(status="idle", limit=10).matched == 5
    assert catalog.page(status="halted", limit=10).sessions == []
    assert catalog.page(status="halted", limit=10).matched == 0
    assert catalog.page(status="idle", search="-1", limit=10).matched == 2


async def test_a_large_log_is_read_a_budget_at_a_time() -> None:
    log = MemoryLog()
    for n in range(40):
        await append_session(log, f"s{n}", at=float(n))
    catalog = Catalog(log, page=10)
    await catalog.catch_up(budget=0)
    # A page of 10 events: three sessions and part of a fourth.
    assert (catalog.total, catalog.indexing) == (4, True)
    for _ in range(20):
        await catalog.catch_up(budget=0)
    assert not catalog.indexing
    assert catalog.total == 40
    assert catalog.counts() == {"idle": 40}


@settings(max_examples=40)
@given(
    st.lists(st.integers(0, 7), min_size=1, max_size=40),
    st.integers(1, 5),
    st.integers(1, 9),
)
async def test_paging_gives_each_session_once_most_recent_first(
    touches: list[int], limit: int, page: int
) -> None:
    log = MemoryLog()
    at = 0.0
    for n in touches:
        at += 1
        session_id = f"s{n}"
        if await log.last_seq(session_id):
            await follow_up(log, session_id, at)
        else:
            await append_session(log, session_id, at=at)
    catalog = Catalog(log, page=page)
    while True:
        await catalog.catch_up(budget=0)
        if not catalog.indexing:
            break
    last: dict[str, int] = {}
    for index, n in enumerate(touches):
        last[f"s{n}"] = index
    expected = sorted(last, key=last.__getitem__, reverse=True)
    seen: list[str] = []
    cursor = None
    while True:
        listed = catalog.page(limit=limit, cursor=cursor)
        seen += [summary.session_id for summary in listed.sessions]
        if listed.next_cursor is None:
            break
        cursor = listed.next_cursor
    assert seen == expected


async def test_a_sqlite_log_another_log_writes_is_read_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    async with SqliteLog(path) as writer:
        await append_session(writer, "first")
        async with SqliteLog(path, read_only=True) as reader:
            catalog = Catalog(reader)
            await catalog.catch_up(budget=10)
            assert [s.session_id for s in catalog.page(limit=10).sessions] == ["first"]
            await append_session(writer, "second")
            await follow_up(writer, "first", at=50.0)
            assert await catalog.events("second", after=0) != []
            await catalog.catch_up(budget=10)
            assert [s.session_id for s in catalog.page(limit=10).sessions] == ["first", "second"]


async def test_a_jsonl_directory_another_log_writes_is_opened_anew_to_read_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opened anew at every look (at most once a second, and five times as long as opening
    # takes, otherwise).
    monkeypatch.setattr(_catalog, "_REOPEN_SECONDS", 0.0)
    monkeypatch.setattr(_catalog, "_REOPEN_FACTOR", 0)
    directory = tmp_path / "log"
    async with JsonlLog(directory) as writer:
        await append_session(writer, "first")

        async def reopen() -> EventLog:
            return await JsonlLog(directory, read_only=True).__aenter__()

        catalog = Catalog(await reopen(), reopen=reopen)
        await catalog.catch_up(budget=10)
        assert catalog.total == 1
        await append_session(writer, "second")
        # A tail waits for the session's events, opening the log anew as it looks.
        with anyio.fail_after(10):
            found = await catalog.events("second", after=0, wait=5)
        assert [envelope.seq for envelope in found] == [1, 2, 3]
        await catalog.catch_up(budget=10)
        assert [s.session_id for s in catalog.page(limit=10).sessions] == ["second", "first"]


async def test_an_unknown_session_is_named() -> None:
    log = MemoryLog()
    await append_session(log, "known")
    catalog = Catalog(log)
    await catalog.catch_up(budget=10)
    for call in (
        lambda: catalog.read("nope"),
        lambda: catalog.events("nope"),
        lambda: catalog.check("nope"),
    ):
        with pytest.raises(UnknownSession, match="nope"):
            await call()
    with pytest.raises(UnknownSession, match="nope"):
        catalog.summary("nope")
    assert [e.seq for e in await catalog.events("known", after=1)] == [2, 3]
