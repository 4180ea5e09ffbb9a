"""Host(max_resting=...): sessions at rest beyond the limit are dropped from memory and read
back from the log on their next use, and no API call can tell.

Each test looks at `host._sessions` to see what the host holds; everything else goes
through the API, on real logs, on both anyio backends.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sessions.host_worker import check_log, settle
from turnkeeper import state
from turnkeeper.core import (
    AgentSpec,
    ChatError,
    InputError,
    LogError,
    ToolResult,
    ToolSpec,
    TurnkeeperError,
)
from turnkeeper.events import Envelope
from turnkeeper.logs import Batch, MemoryLog, SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import Host, SessionInfo
from turnkeeper.sessions import _host_actor as host_actor
from turnkeeper.sessions import _host_records as host_records
from turnkeeper.sessions._rebuild import runs_by_page
from turnkeeper.state import PackedState, SessionState

pytestmark = pytest.mark.anyio

ASK = ToolSpec("ask", "Ask a person.", {"type": "object", "properties": {"q": {"type": "string"}}})
# No host in these tests has a handler for `ask`: a call of it parks the session.
SPEC = AgentSpec(system_prompt="Answer, or ask when told to.", tools=(ASK,))
Kind = Literal["hello", "ask", "fail"]


class Model:
    """A deterministic model that reads only the request: to a last user message holding
    "ask" it calls `ask` (then answers with the result); one holding "fail" fails the
    first call with that text (a retry succeeds); one holding "crash" raises RuntimeError
    (a crash of the session) on the first `crashes` calls with that text; anything else
    is answered "re: <text>"."""

    def __init__(self, crashes: int = 0) -> None:
        self.crashes = crashes
        self.calls: Counter[str] = Counter()

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = request["messages"]
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        text = str(messages[last_user]["content"])
        self.calls[text] += 1
        if "crash" in text and self.calls[text] <= self.crashes:
            raise RuntimeError(f"model crashed on {text!r}")
        if "fail" in text and self.calls[text] == 1:
            raise ChatError(f"model down for {text!r}", transient=False, status=503)
        if "ask" in text:
            answers = [m for m in messages[last_user:] if m.get("role") == "tool"]
            if not answers:
                return tool_response(("ask", {"q": text}, f"ask-{len(messages)}"))
            return text_response(f"{text}: told {answers[-1]['content']}")
        return text_response(f"re: {text}")


class GatedLog(MemoryLog):
    """A MemoryLog that holds one session's next append, or its next whole read (once it
    has read: the read returns what the log held when it began), until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_append: str | None = None
        self.hold_read: str | None = None
        self.held = anyio.Event()
        self.release = anyio.Event()

    async def _append(self, batch: Batch) -> None:
        if batch.session_id == self.hold_append:
            self.hold_append = None
            self.held.set()
            await self.release.wait()
        await super()._append(batch)

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        found = await super()._read(session_id, after, limit)
        if session_id == self.hold_read and after == 0:
            self.hold_read = None
            self.held.set()
            await self.release.wait()
        return found


class TornLog(MemoryLog):
    """A MemoryLog whose next append for session `tear` lands but raises, and whose next
    whole read of that session then fails: the host cannot tell what the log holds."""

    def __init__(self) -> None:
        super().__init__()
        self.tear: str | None = None
        self.unreadable: str | None = None

    async def _append(self, batch: Batch) -> None:
        await super()._append(batch)
        if batch.session_id == self.tear:
            self.tear = None
            self.unreadable = batch.session_id
            raise LogError("the disk went away after the write")

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        if session_id == self.unreadable:
            self.unreadable = None
            raise LogError("the disk went away")
        return await super()._read(session_id, after, limit)


class CountingLog(MemoryLog):
    """A MemoryLog that counts whole reads of each session (a session read back)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        if after == 0:
            self.reads[session_id] += 1
        return await super()._read(session_id, after, limit)


def fixed_clock() -> float:
    """One time for every event, so that two hosts given the same calls log the same."""
    return 1_000.0


async def run_to_rest(host: Host, session_id: str, prompt: str) -> SessionInfo:
    """Start the session on `prompt` and its id (see `Model`); its info once at rest."""
    await host.start(SPEC, f"{prompt} {session_id}", session_id=session_id)
    return await settle(host, session_id)


def at_rest_held(host: Host) -> int:
    return sum(1 for s in host._sessions.values() if s.status != "running")


async def raised(call: Callable[[], Awaitable[object]]) -> str:
    """The type and message of what awaiting `call()` raised ('' if nothing)."""
    try:
        await call()
    except TurnkeeperError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


@pytest.mark.parametrize("log_kind", ["memory", "sqlite"])
async def test_dropped_sessions_answer_every_call_as_if_they_had_stayed(
    log_kind: str, tmp_path: Path
) -> None:
    log = MemoryLog() if log_kind == "memory" else SqliteLog(tmp_path / "log.sqlite")
    model = Model()
    kinds: list[Kind] = ["hello", "ask", "fail"]
    async with log, Host(chat=model, log=log, max_resting=3, clock=fixed_clock) as host:
        before: dict[str, SessionInfo] = {}
        logged: dict[str, list[Envelope]] = {}
        for n in range(20):
            session_id = f"s{n}"
            before[session_id] = await run_to_rest(host, session_id, kinds[n % 3])
            logged[session_id] = await host.events(session_id)
            assert at_rest_held(host) <= 3
        assert {info.status for info in before.values()} == {"idle", "requires_action", "errored"}
        assert len(host._sessions) == 3

        for session_id, info in before.items():
            assert session_id not in host._sessions  # what follows reads it back
            assert await host.status(session_id) == info
            assert await host.result(session_id, wait=1) == info
            assert await host.events(session_id) == logged[session_id]
            assert check_log(logged[session_id]) == host._sessions[session_id].state
            assert len(host._sessions) <= 3

        # s0 is idle, s1 requires_action, s2 errored, s3 idle: each dropped by now.
        assert not {"s0", "s1", "s2", "s3"} & set(host._sessions)
        await host.send("s0", "hello again")
        again = await settle(host, "s0")
        assert (again.status, again.text) == ("idle", "re: hello again")
        assert again.seq == before["s0"].seq + 2  # the message and the answer

        ask = before["s1"].pending[0]
        await host.submit_tool_results("s1", [ToolResult(ask.id, "yes")])
        told = await settle(host, "s1")
        assert (told.status, told.text) == ("idle", "ask s1: told yes")

        assert (await host.status("s2")).error == "model down for 'fail s2'"
        await host.retry("s2")
        retried = await settle(host, "s2")
        assert (retried.status, retried.text, retried.error) == ("idle", "re: fail s2", None)

        await host.cancel("s3", "no longer needed")
        assert (await host.status("s3")).status == "cancelled"
        with pytest.raises(InputError, match="cancelled"):
            await host.send("s3", "hello?")

        held = next(iter(host._sessions))
        dropped = "s4"
        assert dropped not in host._sessions
        refusal = await raised(lambda: host.start(SPEC, "hello", session_id=held))
        assert refusal == f"InputError: session_id: {held} already exists"
        assert await raised(lambda: host.start(SPEC, "hello", session_id=dropped)) == (
            f"InputError: session_id: {dropped} already exists"
        )
        assert await host.status(dropped) == before[dropped]

        for session_id in await host.sessions():
            seq = (await host.status(session_id)).seq
            events = await log.read(session_id)
            assert check_log(events) == host._sessions[session_id].state
            assert events[-1].seq == seq
        assert len(host._sessions) <= 3


def packed(host: Host, session_id: str) -> bool:
    """Whether the host holds the session's state packed (see `_Session.rest`)."""
    record = host._sessions[session_id]
    return record.packed is not None and record._state is None


@pytest.mark.parametrize("log_kind", ["memory", "sqlite"])
async def test_sessions_at_rest_are_held_packed_and_answer_every_call_as_before(
    log_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryLog() if log_kind == "memory" else SqliteLog(tmp_path / "log.sqlite")
    kinds: list[Kind] = ["hello", "ask", "fail"]
    unpacked: list[str] = []

    def unpack_state(packed: PackedState) -> SessionState:
        unpacked.append(packed.rest.session_id)
        return state.unpack_state(packed)

    monkeypatch.setattr(host_records, "unpack_state", unpack_state)
    async with log, Host(chat=Model(), log=log, max_resting=None) as host:
        before: dict[str, SessionInfo] = {}
        for n in range(6):
            session_id = f"s{n}"
            before[session_id] = await run_to_rest(host, session_id, kinds[n % 3])
        assert all(packed(host, session_id) for session_id in before)

        # Counting statuses, and a session's status, result or new events, unpack nothing.
        assert await host.statuses() == {"idle": 2, "requires_action": 2, "errored": 2}
        for session_id, info in before.items():
            assert await host.status(session_id) == info
            assert await host.result(session_id) == info
            assert await host.events(session_id, after=info.seq, wait=0.01) == []
        assert unpacked == []
        assert all(packed(host, session_id) for session_id in before)
        for session_id, info in before.items():
            assert await host.result(session_id, wait=1) == info
            events = await host.events(session_id)
            # Read (and so unpacked), then let go again once no call uses it: packed as it
            # was, not again.
            kept = host._sessions[session_id].packed
            assert check_log(events) == host._sessions[session_id].state
            await host.status(session_id)
            assert packed(host, session_id)
            assert host._sessions[session_id].packed is kept

        await host.send("s0", "hello again")
        again = await settle(host, "s0")
        assert (again.status, again.text) == ("idle", "re: hello again")
        ask = before["s1"].pending[0]
        await host.submit_tool_results("s1", [ToolResult(ask.id, "yes")])
        assert (await settle(host, "s1")).text == "ask s1: told yes"
        await host.retry("s2")
        assert (await settle(host, "s2")).text == "re: fail s2"
        for session_id in before:
            assert packed(host, session_id)
            assert check_log(await log.read(session_id)) == host._sessions[session_id].state


class SlowAsk:
    """An `ask` handler that answers "yes" at once, or, to a question holding "slow", once
    `gate` is set; `all_waiting` is set once `slow` calls wait for it."""

    def __init__(self, slow: int) -> None:
        self.gate = anyio.Event()
        self.all_waiting = anyio.Event()
        self.slow = slow

    async def __call__(self, q: str) -> str:
        if "slow" in q:
            self.slow -= 1
            if self.slow == 0:
                self.all_waiting.set()
            await self.gate.wait()
        return "yes"


async def packed_soon(host: Host, session_id: str) -> bool:
    """Whether the host holds the session's state packed within 100 of its looks at the
    sessions in their tool calls."""
    for _ in range(100):
        if packed(host, session_id):
            return True
        await anyio.sleep(host_actor.PACK_IN_TOOLS)
    return False


@pytest.mark.parametrize("log_kind", ["memory", "sqlite"])
async def test_sessions_long_in_their_tool_calls_are_held_packed_and_go_on_as_before(
    log_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host's looks at the sessions in their tool calls, closer together.
    monkeypatch.setattr(host_actor, "PACK_IN_TOOLS", 0.05)
    log = MemoryLog() if log_kind == "memory" else SqliteLog(tmp_path / "log.sqlite")
    ask = SlowAsk(3)
    async with log, Host(chat=Model(), log=log, tools={"ask": ask}) as host:
        for session_id in ("s0", "s1", "s2"):
            await host.start(SPEC, f"ask slow {session_id}", session_id=session_id)
        with anyio.fail_after(10):
            await ask.all_waiting.wait()
        quick = await run_to_rest(host, "s3", "ask")
        assert quick.text == "ask s3: told yes"
        for session_id in ("s0", "s1", "s2"):
            assert await packed_soon(host, session_id)
            info = await host.status(session_id)
            events = await host.events(session_id)
            assert (info.status, info.seq, events[-1].type) == (
                "running",
                len(events),
                "local.tool_call",
            )
            assert check_log(events) == host._sessions[session_id].state
        # Each was read (and so unpacked) since: a later look lets the state go again.
        kept = host._sessions["s0"].packed
        assert not packed(host, "s0")
        assert await packed_soon(host, "s0")
        assert host._sessions["s0"].packed is kept

        await host.send("s1", "hello later")
        await host.cancel("s2")
        ask.gate.set()
        assert (await settle(host, "s0")).text == "ask slow s0: told yes"
        assert (await settle(host, "s1")).text == "re: hello later"
        assert (await settle(host, "s2")).status == "cancelled"
        for session_id in ("s0", "s1", "s2", "s3"):
            assert check_log(await log.read(session_id)) == host._sessions[session_id].state


async def test_a_long_poll_keeps_its_session_while_others_are_dropped() -> None:
    async with Host(chat=Model(), max_resting=1) as host:
        first = await run_to_rest(host, "a", "hello")
        polled: list[Envelope] = []

        async def poll() -> None:
            polled.extend(await host.events("a", after=first.seq, wait=30))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(poll)
                await anyio.wait_all_tasks_blocked()
                for session_id in ("b", "c", "d"):
                    await run_to_rest(host, session_id, "hello")
                assert set(host._sessions) == {"a", "d"}
                # The poll is woken by this change only if it waits on the record that
                # the send changes, the one the host kept.
                await host.send("a", "hello more")
        assert polled[0].seq == first.seq + 1
        assert (await settle(host, "a")).text == "re: hello more"
        await run_to_rest(host, "e", "hello")
        assert set(host._sessions) == {"e"}


async def test_an_api_call_in_progress_keeps_its_session() -> None:
    log = GatedLog()
    async with Host(chat=Model(), log=log, max_resting=1) as host:
        await run_to_rest(host, "a", "hello")
        record = host._sessions["a"]
        log.hold_append = "a"
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(host.send, "a", "hello again")
                await log.held.wait()
                try:
                    # Still at rest: the send's append has not landed yet.
                    assert (await host.status("a")).status == "idle"
                    for session_id in ("c", "d", "e"):
                        await run_to_rest(host, session_id, "hello")
                    assert host._sessions.get("a") is record
                    assert "c" not in host._sessions
                finally:
                    # Else the send's append, shielded, would hold a failed test forever.
                    log.release.set()
        info = await settle(host, "a")
        assert (info.status, info.text) == ("idle", "re: hello again")
        assert check_log(await log.read("a")) == host._sessions["a"].state


async def test_a_read_back_in_flight_keeps_a_newer_record_from_being_dropped() -> None:
    log = GatedLog()
    async with Host(chat=Model(), log=log, max_resting=0) as host:
        await run_to_rest(host, "a", "hello")
        assert host._sessions == {}
        log.hold_read = "a"
        seen: list[SessionInfo] = []

        async def look() -> None:
            seen.append(await host.status("a"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(look)
                await log.held.wait()
                try:
                    # Read back by this call meanwhile, changed, and at rest: were it
                    # dropped, the read held above would make the stale record the host's.
                    await host.send("a", "hello again")
                    latest = await settle(host, "a")
                    assert "a" in host._sessions
                finally:
                    log.release.set()
        assert seen == [latest]
        assert latest.text == "re: hello again"
        assert host._sessions == {}
        assert await host.status("a") == latest


async def test_a_session_that_may_be_behind_its_log_is_kept() -> None:
    seen: list[SessionInfo] = []
    for max_resting in (None, 0):
        log = TornLog()
        async with Host(chat=Model(), log=log, max_resting=max_resting) as host:
            await run_to_rest(host, "a", "hello")
            log.tear = "a"
            with pytest.raises(LogError):
                await host.send("a", "hello again")
            await run_to_rest(host, "b", "hello")
            # Read back, it would be mid-turn, the message logged after all.
            assert "a" in host._sessions
            seen.append(await host.status("a"))
    assert seen[0] == seen[1]
    assert seen[1].status == "idle"


async def test_transition_lines_are_the_same_when_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="turnkeeper.host")
    seen: list[list[tuple[object, ...]]] = []
    for max_resting in (None, 0):
        caplog.clear()
        async with Host(chat=Model(), max_resting=max_resting) as host:
            asked = await run_to_rest(host, "a", "ask")
            await host.submit_tool_results("a", [ToolResult(asked.pending[0].id, "yes")])
            await settle(host, "a")
            await host.send("a", "hello")
            await settle(host, "a")
            assert ("a" in host._sessions) is (max_resting is None)
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "turnkeeper.host"]
        seen.append(
            [
                (line["previous"], line["status"], line["seq"])
                for line in lines
                if line["event"] == "session.transition"
            ]
        )
    assert seen[0] == seen[1]
    assert len(seen[0]) == 6


async def test_restart_intensity_survives_a_drop() -> None:
    infos: list[SessionInfo] = []
    for max_resting in (None, 0):
        async with Host(
            chat=Model(crashes=2), max_resting=max_resting, max_restarts=2, restart_backoff=0.0
        ) as host:
            # Two crashes, then an answer: at rest, with two crashes on record.
            assert (await run_to_rest(host, "a", "crash twice")).status == "idle"
            assert ("a" in host._sessions) is (max_resting is None)
            # A third crash within the window is one too many.
            await host.send("a", "crash now")
            infos.append(await settle(host, "a"))
    assert infos[0] == infos[1]
    failed = ("failed", "RuntimeError: model crashed on 'crash now'")
    assert (infos[1].status, infos[1].error) == failed


async def test_no_limit_keeps_every_session_and_zero_keeps_none_at_rest() -> None:
    for max_resting, held in ((None, 30), (0, 0)):
        async with Host(chat=Model(), max_resting=max_resting) as host:
            for n in range(30):
                await run_to_rest(host, f"s{n}", "hello")
            assert len(host._sessions) == held
            assert await host.statuses() == {"idle": 30}


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
async def test_max_resting_must_be_none_or_a_count(bad: object) -> None:
    with pytest.raises(InputError, match="max_resting"):
        Host(chat=Model(), max_resting=bad)  # type: ignore[arg-type]


async def test_statuses_count_dropped_sessions_without_reading_them_back() -> None:
    log = CountingLog()
    async with Host(chat=Model(), log=log, max_resting=2) as host:
        kinds: list[Kind] = ["hello", "ask", "fail", "hello"]
        for n in range(12):
            await run_to_rest(host, f"s{n}", kinds[n % 4])
        await host.cancel("s0")
        # A session logged by another writer, and one that cannot be rebuilt.
        other = MemoryLog()
        async with Host(chat=Model(), log=other) as elsewhere:
            await run_to_rest(elsewhere, "foreign", "ask")
        foreign = await other.read("foreign")
        await log.append(foreign, expected_seq=0)
        await log.append(
            [msgspec.structs.replace(foreign[1], session_id="broken", seq=1)], expected_seq=0
        )
        log.reads.clear()

        counts = await host.statuses()

        assert set(log.reads) == {"foreign", "broken"}
        assert counts == {
            "idle": 5,
            "requires_action": 4,
            "errored": 3,
            "cancelled": 1,
            "unreadable": 1,
        }
        assert len(host._sessions) <= 2
        ids = await host.sessions()
        assert counts == Counter([(await host.status(s)).status for s in ids])
        assert await host.statuses() == counts


async def test_a_recovered_host_holds_at_most_max_resting(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    async with SqliteLog(path) as log, Host(chat=Model(), log=log, max_resting=None) as first:
        infos: dict[str, SessionInfo] = {}
        for n in range(50):
            infos[f"s{n}"] = await run_to_rest(first, f"s{n}", "ask" if n % 10 == 0 else "hello")
    async with SqliteLog(path) as log, Host(chat=Model(), log=log, max_resting=5) as host:
        assert set(host._sessions) == {f"s{n}" for n in range(45, 50)}
        assert await host.statuses() == {"idle": 45, "requires_action": 5}
        assert len(host._sessions) == 5
        for session_id, info in infos.items():
            assert await host.status(session_id) == info
        assert len(host._sessions) == 5


class Watched(MemoryLog):
    """A MemoryLog that notes, at each read of a page, how many sessions `host` holds."""

    def __init__(self) -> None:
        super().__init__()
        self.host: Host | None = None
        self.held: list[int] = []

    async def read_all(
        self, *, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, Envelope]]:
        if self.host is not None:
            self.held.append(len(self.host._sessions))
        return await super().read_all(after=after, limit=limit)


async def test_recovery_holds_at_most_max_resting_at_rest_as_it_goes() -> None:
    log = Watched()
    async with Host(chat=Model(), log=log, max_resting=None) as first:
        infos = {f"s{n}": await run_to_rest(first, f"s{n}", "hello") for n in range(40)}
        # Let go during the pass, then given more events: read again whole at the end.
        await first.send("s0", "hello again")
        infos["s0"] = await settle(first, "s0")
    host = Host(chat=Model(), log=log, max_resting=3)
    log.host = host
    with anyio.fail_after(10):
        async with host:
            assert set(host._sessions) == {"s38", "s39", "s0"}
            for session_id, info in infos.items():
                assert await host.status(session_id) == info
    # Pages of 20,000 events: one page here, and the pass holds no more as it goes.
    assert log.held
    assert max(log.held) <= 3


async def test_recovery_lets_go_at_rest_sessions_page_by_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "turnkeeper.sessions._host_recovery.runs_by_page", lambda log: runs_by_page(log, page=7)
    )
    log = Watched()
    async with Host(chat=Model(), log=log, max_resting=None) as first:
        infos = {f"s{n}": await run_to_rest(first, f"s{n}", "hello") for n in range(30)}
        await first.send("s3", "ask")
        infos["s3"] = await settle(first, "s3")
    host = Host(chat=Model(), log=log, max_resting=4)
    log.host = host
    async with host:
        assert len(host._sessions) == 4
        for session_id, info in infos.items():
            assert await host.status(session_id) == info
        for session_id in infos:
            check_log(await log.read(session_id))
    assert max(log.held) <= 5


@pytest.mark.parametrize(("page", "max_resting"), [(20_000, None), (20_000, 2), (3, 0), (5, 3)])
async def test_recovery_logs_one_line_per_session_however_the_pages_fall(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, page: int, max_resting: int
) -> None:
    log = MemoryLog()
    async with Host(chat=Model(), log=log) as first:
        statuses = {
            f"s{n}": (await run_to_rest(first, f"s{n}", "ask" if n % 3 else "hello")).status
            for n in range(9)
        }
    monkeypatch.setattr(
        "turnkeeper.sessions._host_recovery.runs_by_page", lambda log: runs_by_page(log, page=page)
    )
    caplog.set_level(logging.INFO, logger="turnkeeper.host")
    caplog.clear()
    async with Host(chat=Model(), log=log, max_resting=max_resting):
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "turnkeeper.host"]
    recovered = [
        (line["session_id"], line["status"])
        for line in lines
        if line["event"] == "session.transition" and line["previous"] is None
    ]
    assert sorted(recovered) == sorted(statuses.items())


# -- the same calls on a host that drops and on one that does not --------------------------

SESSIONS = 3
Op = tuple[str, int, Kind]
ops = st.lists(
    st.tuples(
        st.sampled_from(["start", "send", "submit", "retry", "cancel", "status", "events"]),
        st.integers(0, SESSIONS - 1),
        st.sampled_from(["hello", "ask", "fail"]),
    ),
    max_size=14,
)


async def play(steps: Sequence[Op], max_resting: int | None) -> list[object]:
    """What each step returns or raises, then every session's info and log, on a host
    with `max_resting`. Every session is left at rest after each step."""
    log = MemoryLog()
    seen: list[object] = []
    async with Host(chat=Model(), log=log, max_resting=max_resting, clock=fixed_clock) as host:
        for index, (op, n, kind) in enumerate(steps):
            session_id = f"p{n}"
            text = f"{kind} {index}"
            try:
                if op == "start":
                    await host.start(SPEC, text, session_id=session_id)
                elif op == "send":
                    await host.send(session_id, text)
                elif op == "submit":
                    pending = (await host.status(session_id)).pending
                    ids = [use.id for use in pending] or ["none"]
                    results = [ToolResult(call_id, f"answer {index}") for call_id in ids]
                    await host.submit_tool_results(session_id, results)
                elif op == "retry":
                    await host.retry(session_id)
                elif op == "cancel":
                    await host.cancel(session_id)
                elif op == "status":
                    seen.append(await host.status(session_id))
                else:
                    seen.append(await host.events(session_id))
            except TurnkeeperError as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
            for started in await host.sessions():
                seen.append(await settle(host, started))
            if max_resting is not None:
                assert at_rest_held(host) <= max_resting
        for session_id in await host.sessions():
            seen.append(await log.read(session_id))
    return seen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ops, max_resting=st.integers(0, 1))
async def test_dropping_changes_nothing_any_calls_can_see(
    steps: list[Op], max_resting: int
) -> None:
    assert await play(steps, max_resting) == await play(steps, None)


async def test_a_reply_json_does_not_hold_as_it_is_reads_the_same_after_a_drop() -> None:
    finish = ToolSpec("finish", "Finish.", {"type": "object", "properties": {}})
    spec = AgentSpec(tools=(finish,), terminal_tool="finish")
    arguments = {"answer": (1, 2), "score": float("nan")}
    reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "function": {"name": "finish", "arguments": arguments}}
                    ],
                }
            }
        ]
    }

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return reply

    async with Host(chat=chat, log=MemoryLog(), max_resting=0) as host:
        session_id = await host.start(spec, "go")
        live = await host.result(session_id)
        assert session_id not in host._sessions
        assert (
            (await host.status(session_id)).result
            == live.result
            == {
                "answer": [1, 2],
                "score": None,
            }
        )
