"""with_retry, and the HTTP status / Retry-After rules it relies on (providers/_chat.py)."""

from __future__ import annotations

import email.utils
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import ChatError, InputError
from turnkeeper.events import ChatRetried
from turnkeeper.providers import (
    ScriptedChat,
    error_for_status,
    parse_retry_after,
    text_response,
    with_retry,
)
from turnkeeper.providers._report import collecting_events

OK = text_response("ok")


class FakeTime:
    """A clock that only moves when the code under test sleeps (or a test moves it)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay
        await anyio.lowlevel.checkpoint()


def retrying(chat: ScriptedChat, time: FakeTime, **options: Any) -> Any:
    options.setdefault("jitter", lambda: 1.0)
    return with_retry(chat, sleep=time.sleep, clock=time.clock, **options)


def transient(message: str = "connection reset", **kwargs: Any) -> ChatError:
    return ChatError(message, transient=True, **kwargs)


# error_for_status and parse_retry_after


@pytest.mark.parametrize(
    ("status", "is_transient"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (408, True),
        (409, False),
        (422, False),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (599, True),
    ],
)
def test_error_for_status_classifies_transient_and_permanent(
    status: int, is_transient: bool
) -> None:
    error = error_for_status(status, "server said no")
    assert error.transient is is_transient
    assert error.status == status
    assert error.message == f"HTTP {status}: server said no"
    assert error.retry_after is None


def test_error_for_status_carries_retry_after_and_handles_empty_detail() -> None:
    error = error_for_status(429, "", retry_after=2.5)
    assert error.message == "HTTP 429"
    assert error.retry_after == 2.5


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), (" 3 ", 3.0), ("0", 0.0), ("1.5", 1.5)],
)
def test_parse_retry_after_reads_delta_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value, now=1_000.0) == seconds


@pytest.mark.parametrize("value", [None, "", "-5", "soon", "1e3", "inf", "nan", "+4", "3 s"])
def test_parse_retry_after_rejects_absent_negative_and_garbage(value: str | None) -> None:
    assert parse_retry_after(value, now=1_000.0) is None


def test_parse_retry_after_reads_an_http_date_relative_to_now() -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    at = email.utils.parsedate_to_datetime(date).timestamp()
    assert parse_retry_after(date, now=at - 30) == 30.0
    assert parse_retry_after(date, now=at + 30) == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 -0000", now=at - 1) == 1.0


@given(st.text())
def test_parse_retry_after_never_raises(value: str) -> None:
    seconds = parse_retry_after(value, now=1.7e9)
    assert seconds is None or seconds >= 0


# what is retried


@pytest.mark.anyio
@pytest.mark.parametrize("status", [408, 429, 500, 503])
async def test_transient_http_statuses_are_retried(status: int) -> None:
    time = FakeTime()
    chat = ScriptedChat([error_for_status(status, "busy"), OK])
    with collecting_events() as events:
        response = await retrying(chat, time)(
            {"model": "m", "messages": [], "tools": []},
        )
    assert response is OK
    assert chat.calls == 2
    assert events == [
        ChatRetried(attempt=1, delay=1.0, error=f"HTTP {status}: busy", status=status)
    ]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "reason", ["timeout", "connection refused", "connection reset", "connection closed"]
)
async def test_transport_failures_are_retried(reason: str) -> None:
    time = FakeTime()
    chat = ScriptedChat([transient(reason), transient(reason), OK])
    with collecting_events() as events:
        assert await retrying(chat, time)({"messages": []}) is OK
    assert chat.calls == 3
    assert [(e.attempt, e.error, e.status) for e in events if isinstance(e, ChatRetried)] == [
        (1, reason, None),
        (2, reason, None),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 401, 404])
async def test_permanent_http_statuses_are_not_retried(status: int) -> None:
    time = FakeTime()
    chat = ScriptedChat([error_for_status(status, "bad"), OK])
    with collecting_events() as events, pytest.raises(ChatError) as raised:
        await retrying(chat, time)({"messages": []})
    assert raised.value.status == status
    assert chat.calls == 1
    assert events == []
    assert time.sleeps == []


@pytest.mark.anyio
async def test_other_exceptions_propagate_without_retry() -> None:
    time = FakeTime()
    chat = ScriptedChat([KeyError("bug in the backend"), OK])
    with pytest.raises(KeyError, match="bug in the backend"):
        await retrying(chat, time)({"messages": []})
    assert chat.calls == 1
    assert time.sleeps == []


@pytest.mark.anyio
async def test_gives_up_after_max_retries_with_the_last_error() -> None:
    time = FakeTime()
    last = transient("third")
    chat = ScriptedChat([transient("first"), transient("second"), last, OK])
    with collecting_events() as events, pytest.raises(ChatError) as raised:
        await retrying(chat, time, max_retries=2)({"messages": []})
    assert raised.value is last
    assert chat.calls == 3
    assert len(events) == 2


@pytest.mark.anyio
async def test_max_retries_zero_calls_once() -> None:
    time = FakeTime()
    chat = ScriptedChat([transient(), OK])
    with pytest.raises(ChatError):
        await retrying(chat, time, max_retries=0)({"messages": []})
    assert chat.calls == 1


@pytest.mark.anyio
async def test_success_after_retries_returns_the_response_and_passes_the_request() -> None:
    time = FakeTime()
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": []}
    chat = ScriptedChat([transient(), error_for_status(503, "down"), OK])
    assert await retrying(chat, time)(request) is OK
    assert chat.requests == [request, request, request]


# how long it waits


@pytest.mark.anyio
async def test_backoff_doubles_and_is_capped_at_max_delay() -> None:
    time = FakeTime()
    chat = ScriptedChat([transient()] * 7)
    with collecting_events() as events, pytest.raises(ChatError):
        await retrying(chat, time, max_retries=6, base_delay=1.0, max_delay=5.0)({})
    assert time.sleeps == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert [e.delay for e in events if isinstance(e, ChatRetried)] == time.sleeps
    assert [e.attempt for e in events if isinstance(e, ChatRetried)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.anyio
async def test_jitter_scales_each_delay_into_its_upper_half() -> None:
    draws = iter([0.0, 0.5, 1.0])
    time = FakeTime()
    chat = ScriptedChat([transient(), transient(), transient(), OK])
    await retrying(chat, time, base_delay=2.0, jitter=lambda: next(draws))({})
    assert time.sleeps == [1.0, 3.0, 8.0]


@pytest.mark.anyio
@given(draw=st.floats(0.0, 1.0), retries=st.integers(1, 12))
@settings(max_examples=200, deadline=None)
async def test_every_delay_lies_between_half_and_all_of_the_capped_backoff(
    draw: float, retries: int
) -> None:
    time = FakeTime()
    chat = ScriptedChat([transient()] * retries + [OK])
    call = with_retry(
        chat,
        max_retries=retries,
        base_delay=0.25,
        max_delay=10.0,
        deadline=1e9,
        sleep=time.sleep,
        clock=time.clock,
        jitter=lambda: draw,
    )
    assert await call({}) is OK
    for attempt, delay in enumerate(time.sleeps, start=1):
        capped = min(10.0, 0.25 * 2 ** (attempt - 1))
        assert capped / 2 <= delay <= capped


@pytest.mark.anyio
async def test_jitter_outside_zero_to_one_is_a_clear_error() -> None:
    time = FakeTime()
    chat = ScriptedChat([transient(), OK])
    with pytest.raises(InputError, match=r"jitter\(\) must return a number in \[0, 1\], got 1.5"):
        await retrying(chat, time, jitter=lambda: 1.5)({})


@pytest.mark.anyio
async def test_retry_after_longer_than_backoff_is_waited_even_past_max_delay() -> None:
    time = FakeTime()
    chat = ScriptedChat([error_for_status(429, "slow down", retry_after=42.0), OK])
    with collecting_events() as events:
        assert await retrying(chat, time, max_delay=5.0)({}) is OK
    assert time.sleeps == [42.0]
    assert events == [ChatRetried(attempt=1, delay=42.0, error="HTTP 429: slow down", status=429)]


@pytest.mark.anyio
async def test_retry_after_shorter_than_backoff_keeps_the_backoff() -> None:
    time = FakeTime()
    chat = ScriptedChat([transient(), error_for_status(503, "", retry_after=0.5), OK])
    await retrying(chat, time)({})
    assert time.sleeps == [1.0, 2.0]


# the deadline


@pytest.mark.anyio
async def test_deadline_stops_retrying_when_the_next_wait_would_pass_it() -> None:
    time = FakeTime()
    last = transient("second")
    chat = ScriptedChat([transient("first"), last, OK])
    with collecting_events() as events, pytest.raises(ChatError) as raised:
        await retrying(chat, time, base_delay=4.0, deadline=10.0)({})
    # waited 4 s; the next wait (8 s) would end at 12 s, past the 10 s deadline
    assert raised.value is last
    assert time.sleeps == [4.0]
    assert chat.calls == 2
    assert len(events) == 1


@pytest.mark.anyio
async def test_retry_after_beyond_the_deadline_is_not_waited_for() -> None:
    time = FakeTime()
    chat = ScriptedChat([error_for_status(429, "quota", retry_after=3600.0), OK])
    with collecting_events() as events, pytest.raises(ChatError, match="quota"):
        await retrying(chat, time, deadline=120.0)({})
    assert time.sleeps == []
    assert events == []


@pytest.mark.anyio
async def test_time_spent_in_attempts_counts_against_the_deadline() -> None:
    time = FakeTime()

    def slow_failure(request: dict[str, Any]) -> dict[str, Any]:
        time.now += 9.5
        raise transient("timeout")

    chat = ScriptedChat([slow_failure, OK])
    with pytest.raises(ChatError, match="timeout"):
        await retrying(chat, time, deadline=10.0)({})
    assert time.sleeps == []
    assert chat.calls == 1


# events and cancellation


@pytest.mark.anyio
async def test_each_retry_is_reported_before_its_wait() -> None:
    reported_at_sleep: list[int] = []
    time = FakeTime()

    with collecting_events() as events:

        async def sleep(delay: float) -> None:
            reported_at_sleep.append(len(events))
            await time.sleep(delay)

        chat = ScriptedChat([transient(), transient(), OK])
        await with_retry(chat, sleep=sleep, clock=time.clock, jitter=lambda: 1.0)({})
    assert reported_at_sleep == [1, 2]
    assert len(events) == 2


@pytest.mark.anyio
async def test_cancellation_during_a_wait_propagates() -> None:
    chat = ScriptedChat([transient(), OK])
    with anyio.CancelScope() as scope:

        async def sleep(delay: float) -> None:
            scope.cancel()
            await anyio.lowlevel.checkpoint()

        await with_retry(chat, sleep=sleep)({})
    assert scope.cancelled_caught
    assert chat.calls == 1


@pytest.mark.anyio
async def test_cancellation_during_an_attempt_propagates() -> None:
    with anyio.CancelScope() as scope:

        async def cancelled_mid_call(request: dict[str, Any]) -> dict[str, Any]:
            scope.cancel()
            await anyio.lowlevel.checkpoint()
            return OK

        chat = ScriptedChat([cancelled_mid_call, OK])
        await with_retry(chat)({})
    assert scope.cancelled_caught
    assert chat.calls == 1


# the property


@pytest.mark.anyio
@given(
    failures=st.lists(st.sampled_from(["transient", "permanent"]), max_size=8),
    max_retries=st.integers(0, 6),
)
@settings(max_examples=200, deadline=None)
async def test_calls_and_events_follow_from_the_failures(
    failures: list[str], max_retries: int
) -> None:
    time = FakeTime()
    script: list[Any] = [
        transient() if f == "transient" else error_for_status(400, "no") for f in failures
    ]
    chat = ScriptedChat([*script, OK])
    call = with_retry(
        chat, max_retries=max_retries, deadline=1e12, sleep=time.sleep, clock=time.clock
    )
    first_permanent = failures.index("permanent") if "permanent" in failures else len(failures)
    expected_calls = min(first_permanent + 1, max_retries + 1, len(failures) + 1)
    succeeds = first_permanent == len(failures) and len(failures) <= max_retries

    with collecting_events() as events:
        if succeeds:
            assert await call({}) is OK
        else:
            with pytest.raises(ChatError):
                await call({})
    assert chat.calls == expected_calls
    assert len(events) == expected_calls - 1
    assert all(isinstance(e, ChatRetried) for e in events)
    assert len(time.sleeps) == expected_calls - 1


# settings


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 2.0}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"base_delay": -1.0}, "base_delay"),
        ({"base_delay": float("nan")}, "base_delay"),
        ({"max_delay": float("inf")}, "max_delay"),
        ({"deadline": 0}, "deadline"),
        ({"deadline": "60"}, "deadline"),
    ],
)
def test_bad_settings_are_clear_errors(options: dict[str, Any], named: str) -> None:
    with pytest.raises(InputError, match=f"with_retry: {named} must be"):
        with_retry(ScriptedChat([]), **options)
