"""A per-poll channel through which a chat backend reports events (retries, say) to poll_turn."""

from __future__ import annotations

from contextvars import ContextVar, Token

from turnkeeper.events import AnyEvent

_sink: ContextVar[list[AnyEvent] | None] = ContextVar("turnkeeper_event_sink", default=None)


def report_event(event: AnyEvent) -> None:
    """Add `event` to the current poll's events; outside a poll it is dropped."""
    sink = _sink.get()
    if sink is not None:
        sink.append(event)


class collecting_events:  # lower case: it is used as a function, `with collecting_events()`
    """Collect what `report_event` is given inside the block, in this task and its threads."""

    # A class, not @contextmanager: it runs once per model call, and this is several
    # times cheaper.
    __slots__ = ("collected", "token")
    collected: list[AnyEvent]
    token: Token[list[AnyEvent] | None]

    def __init__(self, into: list[AnyEvent] | None = None) -> None:
        """Collect into `into` (a new list by default)."""
        self.collected = [] if into is None else into

    def __enter__(self) -> list[AnyEvent]:
        self.token = _sink.set(self.collected)
        return self.collected

    def __exit__(self, *exc_info: object) -> None:
        _sink.reset(self.token)
