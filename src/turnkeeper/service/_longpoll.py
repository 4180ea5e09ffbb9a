"""Waiting on the host (or another source of events) for a client, cut short when the
service starts to stop or the client goes away."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio
from starlette.requests import Request

from turnkeeper.events import Envelope

_T = TypeVar("_T")


class EventSource(Protocol):
    """Where a session's events are read from: a Host, or the inspector's catalog of a log
    another process writes."""

    async def events(
        self, session_id: str, *, after: int = 0, wait: float = 0.0
    ) -> list[Envelope]: ...


async def client_gone(request: Request) -> None:
    """Return once the client of `request`, whose body has been read (or has none), has
    gone away: the next message the server has for it is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_stopping(
    stopping: anyio.Event,
    call: Callable[[], Awaitable[_T]],
    gone: Callable[[], Awaitable[None]],
) -> _T | None:
    """What `call()` returns, or None as soon as `stopping` is set or `gone()` returns (the
    call is cancelled): a shutdown never waits on a client that waits, and a client that
    hung up holds nothing (a long-poll would otherwise wait its whole time, and be woken
    with the live ones)."""
    outcome: list[_T] = []
    failure: list[Exception] = []
    if stopping.is_set():
        return None
    async with anyio.create_task_group() as group:

        async def stop() -> None:
            await stopping.wait()
            group.cancel_scope.cancel()

        async def hang_up() -> None:
            await gone()
            group.cancel_scope.cancel()

        group.start_soon(stop)
        group.start_soon(hang_up)
        # The call made in this task, not a task of its own: a task costs about 25 µs of
        # CPU (anyio 4.14 and later give each a cancel scope and an event of its own).
        # Raised here, an error would leave the task group wrapped in an ExceptionGroup.
        try:
            outcome.append(await call())
        except Exception as exc:
            failure.append(exc)
        group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0] if outcome else None


async def events_or_stop(
    source: EventSource,
    session_id: str,
    *,
    after: int,
    wait: float,
    stopping: anyio.Event,
    gone: Callable[[], Awaitable[None]],
) -> list[Envelope]:
    """The session's events after seq `after`, waiting up to `wait` seconds for one;
    [] once `stopping` is set or the client has gone."""
    if stopping.is_set():
        return []
    # Looked for first with no wait: a page that is there already (or asked for with no
    # wait) needs no watch for the stop and the hang-up, whose task group costs the
    # event loop far more than the read.
    found = await source.events(session_id, after=after)
    if found or wait <= 0:
        return found
    waited = await unless_stopping(
        stopping, lambda: source.events(session_id, after=after, wait=wait), gone
    )
    return waited or []
