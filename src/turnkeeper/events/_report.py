"""A per-poll channel through which a chat backend reports events (retries, say) to poll_turn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from turnkeeper.events._events import AnyEvent

_sink: ContextVar[list[AnyEvent] | None] = ContextVar("turnkeeper_event_sink", default=None)


def report_event(event: AnyEvent) -> None:
    """Add `event` to the current poll's events; outside a poll it is dropped."""
    sink = _sink.get()
    if sink is not None:
        sink.append(event)


@contextmanager
def collecting_events() -> Iterator[list[AnyEvent]]:
    """Collect what `report_event` is given inside the block, in this task and its threads."""
    collected: list[AnyEvent] = []
    token = _sink.set(collected)
    try:
        yield collected
    finally:
        _sink.reset(token)
