"""The conformance suite every event log store passes: one test per promise of EventLog,
run on each store of tests/logs/conftest.py (MemoryLog, JsonlLog, SqliteLog, PostgresLog;
a new store joins by adding its fixture there)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.logs.conftest import Store
from turnkeeper.core import (
    AgentSpec,
    GuardConfig,
    InputError,
    LogError,
    SeqError,
    UnloggableEvent,
    Usage,
)
from turnkeeper.events import (
    AnyEvent,
    ChatFailed,
    ChatRetried,
    Envelope,
    MessageReceived,
    ModelResponded,
    SessionOpened,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.logs._jsonl_log import JsonlLog
from turnkeeper.logs._log import EventLog, SeqConflict
from turnkeeper.logs._memory_log import MemoryLog
from turnkeeper.logs._sqlite_log import SqliteLog

LogFactory = Callable[[], EventLog]

# Values of the wrong type, as code that skips type checks could put in an event.
WRONG_TYPE: Any = 123
WRONG_SEQ: Any = 1.0
NO_DICT: Any = ["not", "a", "dict"]

# The single-process stores by name, for tests elsewhere that pick one (old logs, say).
FILE_KINDS = ["jsonl", "sqlite"]
KINDS = ["memory", *FILE_KINDS]


def factory(kind: str, where: Path, *, read_only: bool = False) -> LogFactory:
    """A maker of logs of `kind` over the same storage under `where` (each call reopens
    it); of logs that only read it if `read_only` (a file kind's)."""
    if kind == "memory":
        return MemoryLog
    if kind == "jsonl":
        return lambda: JsonlLog(where / "log", read_only=read_only)
    return lambda: SqliteLog(where / "log.db", read_only=read_only)


@pytest.fixture
def make_log(store: Store) -> LogFactory:
    return store.open


@pytest.fixture
def make_persistent_log(persistent_store: Store) -> LogFactory:
    return persistent_store.open


def nested(depth: int) -> list[Any]:
    """A list nested `depth` lists deep, built without recursion."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def envelope(session_id: str, seq: int, event: AnyEvent | None = None, at: float = 0.0) -> Envelope:
    """An envelope for tests; by default a user message naming its session and seq."""
    body = event if event is not None else MessageReceived(text=f"{session_id}#{seq}")
    return Envelope(session_id=session_id, seq=seq, at=at or float(seq), event=body)


def run(session_id: str, first: int, count: int, at: float = 0.0) -> list[Envelope]:
    """`count` envelopes of one session numbered from `first`."""
    return [envelope(session_id, seq, at=at) for seq in range(first, first + count)]


def varied_session(session_id: str) -> list[Envelope]:
    """One session's events of many kinds, with nested, unicode and raw model data."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q": "café ☕"}'},
            }
        ],
    }
    response: dict[str, Any] = {
        "id": "chatcmpl-1",
        "choices": [{"message": message, "finish_reason": "tool_calls", "logprobs": None}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7},
        "x_vendor": [1, 2.5, True, {"nested": ["deep"]}],
    }
    events: list[AnyEvent] = [
        SessionOpened(
            spec=AgentSpec(system_prompt="be brief", model="tiny"),
            history=({"role": "system", "content": "be brief"},),
            max_turns=5,
            guards=GuardConfig(),
            resume=False,
        ),
        MessageReceived(text='find café 🌍\n"quoted" \\ back'),
        ChatRetried(attempt=1, delay=0.5, error="HTTP 503", status=503),
        ModelResponded(
            response=msgspec.Raw(msgspec.json.encode(response)),
            message=message,
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=12, completion_tokens=7),
        ),
        ToolCalled(tool_call_id="call_1", name="search", input={"q": "café ☕"}),
        ToolReturned(tool_call_id="call_1", text="", is_error=True),
        ChatFailed(error="HTTP 400", transient=False, status=400, response={"error": "bad"}),
    ]
    return [
        Envelope(session_id=session_id, seq=seq, at=1_700_000_000.25 + seq, event=event)
        for seq, event in enumerate(events, start=1)
    ]


async def append_all(log: EventLog, events: Sequence[Envelope], batch: int) -> None:
    """Append one session's events in batches of `batch`."""
    for start in range(0, len(events), batch):
        await log.append(events[start : start + batch], expected_seq=events[start].seq - 1)


@pytest.mark.anyio
async def test_round_trip_reads_back_what_was_appended(make_log: LogFactory) -> None:
    events = varied_session("s1")
    async with make_log() as log:
        await log.append(events[:1], expected_seq=0)
        await log.append(events[1:4], expected_seq=1)
        await log.append(events[4:], expected_seq=4)
        assert await log.read("s1") == events
        assert await log.last_seq("s1") == len(events)
        assert [type(e.event) for e in await log.read("s1")] == [type(e.event) for e in events]


@pytest.mark.anyio
async def test_stale_expected_seq_raises_conflict_and_changes_nothing(
    make_log: LogFactory,
) -> None:
    async with make_log() as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        with pytest.raises(SeqConflict, match=r"session s1: .*expected last seq 0.* is 2") as info:
            await log.append([envelope("s1", 1)], expected_seq=0)
        assert (info.value.session_id, info.value.expected, info.value.actual) == ("s1", 0, 2)
        with pytest.raises(SeqConflict) as ahead:
            await log.append([envelope("s1", 6)], expected_seq=5)
        assert (ahead.value.expected, ahead.value.actual) == (5, 2)
        assert await log.read("s1") == run("s1", 1, 2)
        assert isinstance(info.value, LogError)


@pytest.mark.anyio
async def test_racing_appends_on_one_session_let_exactly_one_win(make_log: LogFactory) -> None:
    outcomes: list[str] = []

    async def attempt(log: EventLog, writer: int) -> None:
        try:
            await log.append(
                [envelope("s1", 1, MessageReceived(text=f"writer {writer}"))], expected_seq=0
            )
            outcomes.append(f"won {writer}")
        except SeqConflict:
            outcomes.append("conflict")

    async with make_log() as log:
        async with anyio.create_task_group() as group:
            for writer in range(20):
                group.start_soon(attempt, log, writer)
        winners = [outcome for outcome in outcomes if outcome.startswith("won")]
        assert len(winners) == 1
        assert outcomes.count("conflict") == 19
        (only,) = await log.read("s1")
        assert only.event == MessageReceived(text=f"writer {winners[0].split()[1]}")


@pytest.mark.parametrize(
    ("events", "expected_seq", "error", "message"),
    [
        ([], 0, LogError, "empty batch"),
        ([envelope("a", 1), envelope("b", 2)], 0, LogError, "one session's events"),
        ([envelope("a", 1), envelope("a", 3)], 0, SeqError, r"session a: seq 3 .*expected seq 2"),
        ([envelope("a", 2)], 0, SeqError, r"session a: seq 2 .*expected seq 1"),
        ([envelope("a", 1), envelope("a", 1)], 0, SeqError, r"session a: seq 1 .*expected seq 2"),
        ([envelope("a", 1)], -1, LogError, "expected_seq must be an int >= 0"),
        ([envelope("a", 1)], True, LogError, "expected_seq must be an int >= 0"),
        ([envelope("a", 2**63)], 2**63 - 1, LogError, "numbers events past 2..63 - 1"),
        (["not an envelope"], 0, LogError, "must be Envelope instances, got str"),
        ("a string", 0, LogError, "must be a sequence of Envelope, got str"),
        (
            [Envelope(session_id="a", seq=1, at=math.nan, event=MessageReceived(text="x"))],
            0,
            UnloggableEvent,
            "session a seq 1: event would not read back",
        ),
        (
            [
                Envelope(
                    session_id="a",
                    seq=1,
                    at=1.0,
                    event=ChatFailed(error="x", transient=True, response=object()),
                )
            ],
            0,
            UnloggableEvent,
            "session a seq 1: cannot encode event",
        ),
        (
            [Envelope(session_id="a", seq=1, at=1.0, event=MessageReceived(text="\ud800"))],
            0,
            UnloggableEvent,
            "session a seq 1: cannot encode event",
        ),
        (
            [
                Envelope(
                    session_id="a",
                    seq=1,
                    at=1.0,
                    event=ChatFailed(error="x", transient=True, response=nested(100_000)),
                )
            ],
            0,
            UnloggableEvent,
            "session a seq 1: cannot encode event: .*recursion",
        ),
        (
            [envelope("a", 1), envelope("a", 2, at=math.inf)],
            0,
            UnloggableEvent,
            "session a seq 2: event would not read back: .*Expected `float`, got `null`",
        ),
        (
            [envelope("a", 1, at=-math.inf)],
            0,
            UnloggableEvent,
            "session a seq 1: event would not read back",
        ),
        (
            [envelope("a", 1, ChatRetried(attempt=1, delay=math.nan, error="HTTP 503"))],
            0,
            UnloggableEvent,
            r"session a seq 1: event would not read back: .*\$\.event\.delay",
        ),
        (
            [envelope("a", 1, MessageReceived(text=WRONG_TYPE))],
            0,
            UnloggableEvent,
            r"session a seq 1: event would not read back: .*Expected `str`, got `int`",
        ),
        (
            [Envelope(session_id="", seq=1, at=1.0, event=MessageReceived(text="x"))],
            0,
            UnloggableEvent,
            r"session  seq 1: event would not read back: .*length >= 1",
        ),
        (
            [Envelope(session_id="a", seq=WRONG_SEQ, at=1.0, event=MessageReceived(text="x"))],
            0,
            UnloggableEvent,
            r"session a seq 1.0: event would not read back: .*Expected `int`, got `float`",
        ),
        (
            [
                envelope("a", 1),
                envelope("a", 2, ToolCalled(tool_call_id="c", name="t", input=NO_DICT)),
            ],
            0,
            UnloggableEvent,
            r"session a seq 2: event would not read back: .*Expected `object`, got `array`",
        ),
    ],
)
@pytest.mark.anyio
async def test_invalid_batches_raise_a_clear_error_and_log_nothing(
    make_log: LogFactory,
    events: Sequence[Envelope],
    expected_seq: int,
    error: type[LogError],
    message: str,
) -> None:
    async with make_log() as log:
        with pytest.raises(error, match=message) as raised:
            await log.append(events, expected_seq=expected_seq)
        # What the events hold is bad input; anything else is a misuse of the log.
        assert isinstance(raised.value, InputError) == (error is UnloggableEvent)
        assert await log.sessions() == []
        assert await log.read_all() == []


@pytest.mark.anyio
async def test_payload_values_json_changes_are_held_as_they_read_back(
    store: Store, make_log: LogFactory
) -> None:
    odd: dict[str, Any] = {
        "pair": (1, 2),
        "keys": {1: "one"},
        "nan": math.nan,
        "usage": Usage(prompt_tokens=3, completion_tokens=4),
    }
    events = [
        envelope("s1", 1, ToolCalled(tool_call_id="c", name="t", input=odd)),
        envelope("s1", 2, ChatFailed(error="x", transient=True, response=(math.inf, "y"))),
    ]
    as_read: dict[str, Any] = {
        "pair": [1, 2],
        "keys": {"1": "one"},
        "nan": None,
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "cost": None},
    }
    expected = [
        envelope("s1", 1, ToolCalled(tool_call_id="c", name="t", input=as_read)),
        envelope("s1", 2, ChatFailed(error="x", transient=True, response=[None, "y"])),
    ]
    async with make_log() as log:
        await log.append(events, expected_seq=0)
        assert await log.read("s1") == expected
        assert [e for _, e in await log.read_all()] == expected
    if store.persistent:
        async with make_log() as reopened:
            assert await reopened.read("s1") == expected


@pytest.mark.anyio
async def test_concurrent_appends_from_200_sessions_all_land_contiguous(
    make_log: LogFactory,
) -> None:
    sessions = [f"s{index:03d}" for index in range(200)]
    written = {session_id: run(session_id, 1, 6) for session_id in sessions}

    async def write(log: EventLog, session_id: str) -> None:
        events = written[session_id]
        await log.append(events[:1], expected_seq=0)
        await log.append(events[1:3], expected_seq=1)
        await log.append(events[3:], expected_seq=3)

    async with make_log() as log:
        async with anyio.create_task_group() as group:
            for session_id in sessions:
                group.start_soon(write, log, session_id)
        assert sorted(await log.sessions()) == sessions
        for session_id in sessions:
            assert await log.read(session_id) == written[session_id]
        everything = await log.read_all()
        positions = [position for position, _ in everything]
        assert positions == sorted(set(positions))
        assert len(everything) == 200 * 6
        for session_id in sessions:
            seqs = [e.seq for _, e in everything if e.session_id == session_id]
            assert seqs == [1, 2, 3, 4, 5, 6]


@pytest.mark.anyio
async def test_read_after_and_limit(make_log: LogFactory) -> None:
    events = run("s1", 1, 10)
    async with make_log() as log:
        await append_all(log, events, batch=4)
        assert await log.read("s1", after=3) == events[3:]
        assert await log.read("s1", after=3, limit=2) == events[3:5]
        assert await log.read("s1", limit=1) == events[:1]
        assert await log.read("s1", after=9, limit=5) == events[9:]
        assert await log.read("s1", after=10) == []
        assert await log.read("s1", after=50) == []
        assert await log.read("s1", limit=0) == []
        assert await log.read("nobody") == []
        assert await log.last_seq("nobody") == 0


# A session id as a name that is not UTF-8 decodes with surrogateescape: a lone surrogate.
NOT_UTF8 = b"s\xff".decode("utf-8", "surrogateescape")


@pytest.mark.anyio
async def test_a_session_id_holding_a_lone_surrogate_names_no_session(
    make_log: LogFactory,
) -> None:
    async with make_log() as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        assert await log.read(NOT_UTF8) == []
        assert await log.read(NOT_UTF8, after=1, limit=3) == []
        assert await log.last_seq(NOT_UTF8) == 0
        with pytest.raises(UnloggableEvent) as unloggable:
            await log.append([envelope(NOT_UTF8, 1)], expected_seq=0)
        with pytest.raises(SeqError) as gap:
            await log.append([envelope(NOT_UTF8, 2)], expected_seq=0)
        assert await log.sessions() == ["s1"]
        assert [e for _, e in await log.read_all()] == run("s1", 1, 2)
    # Each error's text can be printed and logged, and names the id with its surrogate escaped.
    for error, text in [
        (unloggable.value, r"session s\udcff seq 1: cannot encode event"),
        (gap.value, r"session s\udcff: seq 2 leaves a gap"),
        (SeqConflict(NOT_UTF8, 3, 0), r"session s\udcff: append expected last seq 3"),
    ]:
        assert str(error).startswith(text)
        str(error).encode("utf-8")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda log: log.read("s1", after=-1), "after must be an int from 0 to 2..63 - 1"),
        (lambda log: log.read("s1", limit=-2), "limit must be None or an int from 0 to"),
        (lambda log: log.read("s1", after=1.5), "after must be an int from 0"),
        (lambda log: log.read("s1", after=2**63), "after must be an int from 0"),
        (lambda log: log.read("s1", limit=2**64), "limit must be None or an int from 0"),
        (lambda log: log.read(""), "session_id must be a non-empty string"),
        (lambda log: log.read(7), "session_id must be a non-empty string"),
        (lambda log: log.last_seq(None), "session_id must be"),
        (lambda log: log.read_all(after=-1), "after must be an int from 0"),
        (lambda log: log.read_all(after=2**63), "after must be an int from 0"),
        (lambda log: log.read_all(limit="3"), "limit must be None"),
    ],
)
@pytest.mark.anyio
async def test_bad_read_arguments_raise_log_error(
    make_log: LogFactory, call: Callable[[EventLog], Awaitable[object]], message: str
) -> None:
    async with make_log() as log:
        with pytest.raises(LogError, match=message):
            await call(log)


@pytest.mark.anyio
async def test_a_task_polling_reads_lets_other_tasks_and_its_timeout_run(
    make_log: LogFactory,
) -> None:
    async with make_log() as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await anyio.lowlevel.checkpoint()

        for read in (
            lambda: log.read("s1"),
            lambda: log.read_all(),
            lambda: log.last_seq("s1"),
            lambda: log.sessions(),
        ):
            ticks = 0
            async with anyio.create_task_group() as group:
                group.start_soon(tick)
                with anyio.move_on_after(0.05) as scope:
                    # Bounded, so that reads that never yield fail the test, not hang it.
                    for _ in range(100_000):
                        await read()
                group.cancel_scope.cancel()
            assert scope.cancelled_caught
            assert ticks > 1


@pytest.mark.anyio
async def test_sessions_are_listed_in_order_of_creation(make_log: LogFactory) -> None:
    async with make_log() as log:
        await log.append([envelope("zeta", 1)], expected_seq=0)
        await log.append([envelope("alpha", 1, at=2.0)], expected_seq=0)
        await log.append([envelope("zeta", 2, at=3.0)], expected_seq=1)
        await log.append([envelope("mid", 1, at=4.0)], expected_seq=0)
        assert await log.sessions() == ["zeta", "alpha", "mid"]


@pytest.mark.anyio
async def test_read_all_positions_increase_and_resume_after_a_position(
    make_log: LogFactory,
) -> None:
    async with make_log() as log:
        for step in range(1, 5):
            for session_id in ("a", "b", "c"):
                await log.append(
                    [envelope(session_id, step, at=float(step))], expected_seq=step - 1
                )
        everything = await log.read_all()
        assert len(everything) == 12
        positions = [position for position, _ in everything]
        assert all(left < right for left, right in itertools.pairwise(positions))
        assert [e.session_id for _, e in everything[:3]] == ["a", "b", "c"]

        paged: list[tuple[int, Envelope]] = []
        cursor = 0
        while page := await log.read_all(after=cursor, limit=5):
            paged.extend(page)
            cursor = page[-1][0]
        assert paged == everything
        assert await log.read_all(after=positions[6]) == everything[7:]
        assert await log.read_all(after=positions[-1]) == []

        await log.append([envelope("d", 1, at=9.0)], expected_seq=0)
        tail = await log.read_all(after=cursor)
        assert [(e.session_id, e.seq) for _, e in tail] == [("d", 1)]
        assert tail[0][0] > cursor


@pytest.mark.anyio
async def test_reopened_log_reads_the_same_events_and_appends_on(
    make_persistent_log: LogFactory,
) -> None:
    varied = varied_session("s-varied")
    async with make_persistent_log() as log:
        await append_all(log, varied, batch=3)
        for step in range(1, 4):
            for session_id in ("b", "a"):
                await log.append([envelope(session_id, step, at=2e9 + step)], expected_seq=step - 1)
        before = (await log.sessions(), await log.read_all(), await log.read("s-varied"))

    async with make_persistent_log() as log:
        assert (await log.sessions(), await log.read_all(), await log.read("s-varied")) == before
        assert await log.last_seq("a") == 3
        with pytest.raises(SeqConflict):
            await log.append([envelope("a", 3)], expected_seq=2)
        await log.append([envelope("a", 4, at=3e9)], expected_seq=3)
        after = await log.read_all(after=before[1][-1][0])
        assert [(e.session_id, e.seq) for _, e in after] == [("a", 4)]


@pytest.mark.anyio
async def test_a_log_is_writable_from_open_to_close(make_log: LogFactory) -> None:
    log = make_log()
    states = [log.writable]
    async with log:
        states.append(log.writable)
        await log.append(run("s1", 1, 1), expected_seq=0)
        states.append(log.writable)
    states.append(log.writable)
    assert states == [False, True, True, False]


@pytest.mark.anyio
async def test_a_single_writer_log_opened_beside_a_writer_or_read_only_only_reads(
    single_writer_store: Store,
) -> None:
    make = single_writer_store.open
    async with make() as writer:
        await writer.append(run("s1", 1, 2), expected_seq=0)
        for reader, why in [
            (make(), "another log writes it"),
            (make(read_only=True), "it was opened read_only"),
        ]:
            async with reader:
                assert not reader.writable
                assert await reader.read("s1") == run("s1", 1, 2)
                with pytest.raises(LogError, match=f"this log only reads the .*: {why}"):
                    await reader.append([envelope("s1", 3)], expected_seq=2)
                assert await reader.last_seq("s1") == 2
        assert writer.writable
        await writer.append([envelope("s1", 3)], expected_seq=2)
    async with make(read_only=True) as reader:
        assert await reader.read("s1") == run("s1", 1, 3)
        assert not reader.writable
        # A reader takes no lock: a writer opened beside it writes.
        async with make() as writer:
            assert writer.writable
            await writer.append([envelope("s1", 4)], expected_seq=3)


@pytest.mark.anyio
async def test_a_closed_log_refuses_work(make_log: LogFactory) -> None:
    log = make_log()
    await log.append([envelope("s1", 1)], expected_seq=0)
    await log.close()
    await log.close()
    with pytest.raises(LogError, match="is closed"):
        await log.append([envelope("s1", 2)], expected_seq=1)
    with pytest.raises(LogError, match="is closed"):
        await log.read("s1")
    with pytest.raises(LogError, match="is closed"):
        await log.read_all()


@pytest.mark.anyio
async def test_close_waits_for_appends_in_flight(make_persistent_log: LogFactory) -> None:
    log = make_persistent_log()
    await log.read_all()
    sessions = [f"s{index}" for index in range(50)]
    finished: list[str] = []

    async def write(session_id: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        await log.append(run(session_id, 1, 2), expected_seq=0)
        finished.append(session_id)

    async with anyio.create_task_group() as group:
        for session_id in sessions:
            await group.start(write, session_id)
        unfinished_at_close = len(sessions) - len(finished)
        await log.close()
    assert unfinished_at_close > 0
    assert sorted(finished) == sorted(sessions)
    async with make_persistent_log() as reopened:
        for session_id in sessions:
            assert await reopened.last_seq(session_id) == 2


@pytest.mark.anyio
async def test_leaving_async_with_under_cancellation_still_closes(make_log: LogFactory) -> None:
    with anyio.CancelScope() as scope:
        async with make_log() as log:
            await log.append(run("s1", 1, 2), expected_seq=0)
            scope.cancel()
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    with pytest.raises(LogError, match="is closed"):
        await log.read("s1")


operations = st.lists(
    st.tuples(st.integers(min_value=0, max_value=4), st.integers(min_value=1, max_value=3)),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations)
@pytest.mark.anyio
async def test_any_sequence_of_appends_reads_back_in_order(
    store: Store, ops: list[tuple[int, int]]
) -> None:
    fresh = store.fresh()
    make = fresh.open
    expected: dict[str, list[Envelope]] = {}
    order: list[Envelope] = []
    clock = 0.0
    async with make() as log:
        for session_index, count in ops:
            session_id = f"s{session_index}"
            have = expected.setdefault(session_id, [])
            clock += 1.0
            batch = run(session_id, len(have) + 1, count, at=clock)
            await log.append(batch, expected_seq=len(have))
            have.extend(batch)
            order.extend(batch)
        for session_id, events in expected.items():
            assert await log.read(session_id) == events
        assert [e for _, e in await log.read_all()] == order
        live = await log.read_all()
    if fresh.persistent:
        async with make() as reopened:
            assert await reopened.read_all() == live
            assert await reopened.sessions() == list(expected)
