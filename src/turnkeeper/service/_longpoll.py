"""Waiting on the host for a client, cut short when the service starts to stop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from turnkeeper.events import Envelope
from turnkeeper.sessions import Host

_T = TypeVar("_T")


async def unless_stopping(stopping: anyio.Event, call: Callable[[], Awaitable[_T]]) -> _T | None:
    """What `call()` returns, or None as soon as `stopping` is set (the call is cancelled),
    so a shutdown never waits on a client that waits."""
    outcome: list[_T] = []
    failure: list[Exception] = []
    if stopping.is_set():
        return None
    async with anyio.create_task_group() as group:

        async def run() -> None:
            # Raised here, an error would leave the task group wrapped in an ExceptionGroup.
            try:
                outcome.append(await call())
            except Exception as exc:
                failure.append(exc)
            group.cancel_scope.cancel()

        async def stop() -> None:
            await stopping.wait()
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(stop)
    if failure:
        raise failure[0]
    return outcome[0] if outcome else None


async def events_or_stop(
    host: Host, session_id: str, *, after: int, wait: float, stopping: anyio.Event
) -> list[Envelope]:
    """The session's events after seq `after`, waiting up to `wait` seconds for one;
    [] once `stopping` is set."""
    found = await unless_stopping(stopping, lambda: host.events(session_id, after=after, wait=wait))
    return found or []
