"""runs_by_page and rebuilt_on: every session of a log rebuilt in one pass, page by page,
as replaying each session's own events would; a session that does not replay gets its
error."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, LogCorrupt, LogError, SeqError, ToolSpec
from turnkeeper.events import Envelope
from turnkeeper.logs import EventLog, MemoryLog, SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import run
from turnkeeper.sessions._rebuild import Rebuilt, rebuilt_on, runs_by_page
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

SPEC = AgentSpec(system_prompt="Look things up.", tools=(ToolSpec("lookup"),))


async def rebuild_all(log: EventLog, *, page: int = 20_000) -> dict[str, Rebuilt]:
    """Every session, each run folded on from what the pages before left it in, as a
    Host's recovery does; a session that did not replay keeps its error."""
    rebuilt: dict[str, Rebuilt] = {}
    async for runs in runs_by_page(log, page=page):
        for session_id, events in runs.items():
            before = rebuilt.get(session_id)
            if not isinstance(before, LogError):
                rebuilt[session_id] = rebuilt_on(None if before is None else before[0], events)
    return rebuilt


async def recorded(session_id: str, trips: int) -> list[Envelope]:
    """A session of `trips` tool round trips and an answer, under `session_id`."""
    steps = iter(range(trips))

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        step = next(steps, None)
        if step is None:
            return text_response(f"{session_id} done")
        return tool_response(("lookup", {"key": f"{session_id} {step}"}))

    async def lookup(key: str) -> str:
        return f"value of {key}"

    result = await run(SPEC, "Look it up.", chat, tools={"lookup": lookup}, session_id=session_id)
    return list(result.events)


async def interleaved(log: EventLog, sessions: dict[str, list[Envelope]]) -> None:
    """Append the sessions' events a few at a time, taking turns, as a Host would."""
    done = dict.fromkeys(sessions, 0)
    while any(done[name] < len(events) for name, events in sessions.items()):
        for name, events in sessions.items():
            start = done[name]
            if start < len(events):
                await log.append(events[start : start + 3], expected_seq=start)
                done[name] = min(start + 3, len(events))


@pytest.mark.parametrize("page", [1, 2, 7, 10_000])
async def test_every_session_rebuilds_as_its_own_replay_would(page: int) -> None:
    sessions = {f"s{index}": await recorded(f"s{index}", index) for index in range(4)}
    log = MemoryLog()
    await interleaved(log, sessions)
    rebuilt = await rebuild_all(log, page=page)
    assert list(rebuilt) == list(sessions)
    for name, events in sessions.items():
        assert rebuilt[name] == (replay(events), events[-1])


@settings(max_examples=200, deadline=None)
@given(
    trips=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    page=st.integers(1, 40),
    data=st.data(),
)
async def test_any_interleaving_and_page_size_rebuild_as_each_replay(
    trips: list[int], page: int, data: st.DataObject
) -> None:
    sessions = {
        f"s{index}": await recorded(f"s{index}", count) for index, count in enumerate(trips)
    }
    log = MemoryLog()
    done = dict.fromkeys(sessions, 0)
    while waiting := [name for name, events in sessions.items() if done[name] < len(events)]:
        name = data.draw(st.sampled_from(waiting))
        start = done[name]
        end = min(start + data.draw(st.integers(1, 4)), len(sessions[name]))
        await log.append(sessions[name][start:end], expected_seq=start)
        done[name] = end
    rebuilt = await rebuild_all(log, page=page)
    assert rebuilt == {name: (replay(events), events[-1]) for name, events in sessions.items()}


async def test_a_session_that_does_not_replay_gets_its_error_and_the_others_rebuild(
    tmp_path: Path,
) -> None:
    sessions = {"good": await recorded("good", 2), "gap": await recorded("gap", 3)}
    path = tmp_path / "log.sqlite"
    async with SqliteLog(path) as log:
        await interleaved(log, sessions)
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("DELETE FROM events WHERE session_id = 'gap' AND seq = 4")
    connection.close()
    async with SqliteLog(path) as log:
        rebuilt = await rebuild_all(log, page=5)
    error = rebuilt["gap"]
    assert isinstance(error, SeqError)
    assert "gap" in str(error)
    assert rebuilt["good"] == (replay(sessions["good"]), sessions["good"][-1])


async def test_a_page_that_does_not_read_is_a_log_error(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    async with SqliteLog(path) as log:
        await interleaved(log, {"a": await recorded("a", 1), "b": await recorded("b", 1)})
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("UPDATE events SET body = x'7b' WHERE session_id = 'b' AND seq = 2")
    connection.close()
    async with SqliteLog(path) as log:
        with pytest.raises(LogCorrupt, match="session b seq 2"):
            await rebuild_all(log)


async def test_an_empty_log_rebuilds_nothing() -> None:
    assert await rebuild_all(MemoryLog()) == {}


async def test_runs_come_in_order_of_each_sessions_last_event_in_the_page() -> None:
    sessions = {name: await recorded(name, 1) for name in ("a", "b", "c")}
    log = MemoryLog()
    for name, end in (("a", 2), ("b", 2), ("c", 2), ("a", 4), ("c", 4), ("b", 4)):
        start = await log.last_seq(name)
        await log.append(sessions[name][start:end], expected_seq=start)
    pages = [list(runs) async for runs in runs_by_page(log, page=100)]
    assert pages == [["a", "c", "b"]]
    paged = [
        [(name, len(run)) for name, run in runs.items()] async for runs in runs_by_page(log, page=8)
    ]
    assert paged == [[("b", 2), ("c", 2), ("a", 4)], [("c", 2), ("b", 2)]]
