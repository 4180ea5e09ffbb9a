"""report_event / collecting_events: the per-poll channel for events from a chat backend."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from turnkeeper.events import AnyEvent, ChatRetried
from turnkeeper.providers._report import collecting_events, report_event


def retry(attempt: int) -> ChatRetried:
    return ChatRetried(attempt=attempt, delay=0.0, error="HTTP 503", status=503)


def test_outside_a_poll_an_event_is_dropped() -> None:
    report_event(retry(1))
    with collecting_events() as collected:
        pass
    assert collected == []


def test_inside_the_block_events_are_collected_in_order() -> None:
    with collecting_events() as collected:
        report_event(retry(1))
        report_event(retry(2))
    assert collected == [retry(1), retry(2)]
    report_event(retry(3))
    assert collected == [retry(1), retry(2)]


def test_nested_collectors_are_independent() -> None:
    with collecting_events() as outer:
        report_event(retry(1))
        with collecting_events() as inner:
            report_event(retry(2))
        report_event(retry(3))
    assert outer == [retry(1), retry(3)]
    assert inner == [retry(2)]


def test_the_sink_is_reset_when_the_block_raises() -> None:
    sinks: list[list[AnyEvent]] = []

    def poll_that_crashes() -> None:
        with collecting_events() as sink:
            sinks.append(sink)
            report_event(retry(1))
            raise RuntimeError("backend crashed")

    with pytest.raises(RuntimeError, match="backend crashed"):
        poll_that_crashes()
    report_event(retry(2))
    assert sinks == [[retry(1)]]
    with collecting_events() as fresh:
        pass
    assert fresh == []


@pytest.mark.anyio
async def test_events_reported_from_a_worker_thread_are_collected() -> None:
    with collecting_events() as collected:
        await anyio.to_thread.run_sync(report_event, retry(1))
        report_event(retry(2))
    assert collected == [retry(1), retry(2)]


@pytest.mark.anyio
async def test_concurrent_polls_collect_only_their_own_events() -> None:
    results: dict[str, list[AnyEvent]] = {}
    first_in = anyio.Event()
    second_reported = anyio.Event()

    async def first() -> None:
        with collecting_events() as collected:
            report_event(retry(1))
            first_in.set()
            await second_reported.wait()
            report_event(retry(2))
        results["first"] = collected

    async def second() -> None:
        await first_in.wait()
        with collecting_events() as collected:
            report_event(retry(10))
            second_reported.set()
            await anyio.lowlevel.checkpoint()
            report_event(retry(11))
        results["second"] = collected

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        group.start_soon(second)
    assert results == {"first": [retry(1), retry(2)], "second": [retry(10), retry(11)]}


@pytest.mark.anyio
async def test_a_task_started_outside_the_block_does_not_report_into_it() -> None:
    go, reported = anyio.Event(), anyio.Event()

    async def outsider() -> None:
        await go.wait()
        report_event(retry(99))
        reported.set()

    async with anyio.create_task_group() as group:
        group.start_soon(outsider)
        with collecting_events() as collected:
            report_event(retry(1))
            go.set()
            await reported.wait()
    assert collected == [retry(1)]
