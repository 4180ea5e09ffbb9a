"""The channel through which a chat backend streams its reply's fragments during one call.

Streaming is asked for per model call: the caller (a Host with a subscriber to the
session's deltas, `run(on_delta=...)`) sets a `DeltaSink` around the call, and a backend
that can stream sees it with `delta_sink()`. With none set, a backend makes its plain,
unstreamed request: nothing is paid for streaming that no one reads.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token

from turnkeeper.events import TokenDelta

_sink: ContextVar[DeltaSink | None] = ContextVar("turnkeeper_delta_sink", default=None)


class DeltaSink:
    """Where the fragments of one model call's reply go, as `TokenDelta`s for `deliver`.

    A backend calls `text` with each piece of the reply's content, `tool_call` with each
    piece of a tool call's arguments, and `restart` when what it sent so far no longer
    stands (`with_retry` does, before a retry): the next deltas are a new attempt, and
    start the text over. Call them from the event loop's thread.
    """

    __slots__ = ("_deliver", "_index", "after", "attempt", "session_id")

    def __init__(
        self, deliver: Callable[[TokenDelta], object], session_id: str, after: int
    ) -> None:
        self._deliver = deliver
        self.session_id = session_id
        self.after = after
        self.attempt = 1
        self._index = 0

    def text(self, fragment: str) -> None:
        """A piece of the reply's content (an empty one is not sent)."""
        if fragment:
            self._send(TokenDelta(self.session_id, self.after, self.attempt, self._index, fragment))

    def tool_call(self, call: int, fragment: str, name: str | None = None) -> None:
        """A piece of the arguments of the reply's tool call at position `call`, with the
        tool's `name` on the call's first piece."""
        if fragment or name:
            self._send(
                TokenDelta(
                    self.session_id, self.after, self.attempt, self._index, fragment, call, name
                )
            )

    def restart(self) -> None:
        """Begin a new attempt: what was sent so far is to be discarded."""
        self.attempt += 1
        self._index = 0

    def _send(self, delta: TokenDelta) -> None:
        self._index += 1
        self._deliver(delta)


def delta_sink() -> DeltaSink | None:
    """The sink of the model call in progress, if its caller wants the reply streamed."""
    return _sink.get()


class streaming_to:  # lower case: it is used as a function, `with streaming_to(sink)`
    """Make `sink` the one `delta_sink()` gives inside the block (in this task and the
    threads it starts)."""

    __slots__ = ("sink", "token")
    token: Token[DeltaSink | None]

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink

    def __enter__(self) -> DeltaSink:
        self.token = _sink.set(self.sink)
        return self.sink

    def __exit__(self, *exc_info: object) -> None:
        _sink.reset(self.token)
