"""Server-Sent Events: a session's events as `id:` seq, `event:` type, `data:` envelope,
and the fragments of its model replies as they stream in, `event: delta` with no id."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager

import anyio
import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Send

from turnkeeper.events import Envelope, TokenDelta, encode_envelope
from turnkeeper.service._longpoll import EventSource

PING = b": ping\n\n"
DELTA_EVENT = "delta"
"""The SSE event name of a `TokenDelta`."""

Watch = Callable[[str, Callable[[TokenDelta], object]], AbstractAsyncContextManager[None]]
"""A session's deltas, each given to a function, for the duration of a block
(`Host.watch_deltas`)."""

_delta_encoder = msgspec.json.Encoder()
# Frames queued for a client before an event waits (and a delta is dropped).
_QUEUED = 1024


def sse_event(envelope: Envelope) -> bytes:
    """One envelope as an SSE event; a client resumes after it with `Last-Event-ID: seq`."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        envelope.seq,
        envelope.type.encode(),
        encode_envelope(envelope),
    )


def sse_delta(delta: TokenDelta) -> bytes:
    """One delta as an SSE event, without an `id:`: a client's Last-Event-ID stays the seq
    of the last logged event it has, and deltas are not resumed."""
    return b"event: delta\ndata: %s\n\n" % _delta_encoder.encode(delta)


Emit = Callable[[bytes], Awaitable[object]]
"""Where `follow_events` hands each frame."""


async def follow_events(
    source: EventSource,
    session_id: str,
    emit: Emit,
    *,
    after: int,
    ping_seconds: float,
    stopping: anyio.Event,
) -> None:
    """Hand `emit` the session's events after seq `after` as they are logged, each as an
    SSE event, with a ping comment after each `ping_seconds` without one (so proxies keep
    the connection open); return once `stopping` is set.

    One task watches `stopping` for the whole stream: a task group for each wait, as a
    long-poll has, cost more than the rest of an event's way to the client."""
    if stopping.is_set():
        return
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def stop() -> None:
            await stopping.wait()
            group.cancel_scope.cancel()

        group.start_soon(stop)
        try:
            while True:
                found = await source.events(session_id, after=after, wait=ping_seconds)
                if not found:
                    await emit(PING)
                    continue
                for envelope in found:
                    await emit(sse_event(envelope))
                after = found[-1].seq
        except Exception as exc:
            # Raised here, it would come out of the task group wrapped in an ExceptionGroup.
            failure.append(exc)
        group.cancel_scope.cancel()
    if failure:
        raise failure[0]


class EventStreamResponse(StreamingResponse):
    """The frames `follow` hands on (`follow_events`) as a text/event-stream, and, with
    `watch`, the session's
    deltas among them, queued for the client as the model call hands them over, so a
    reply's all come before the reply. They are not held back for the events before
    them (logged, and read back for the stream a moment later): a client places a delta
    by its `after`. The deltas are watched from before the response starts, so a call
    the client sets off once it has the response's headers is streamed. The frames
    queued while the client's last write was under way go out as one write. The stream
    ends when `follow` returns; a client more than a queue's worth behind misses deltas
    (never events)."""

    def __init__(
        self,
        follow: Callable[[Emit], Awaitable[None]],
        session_id: str,
        *,
        watch: Watch | None,
        headers: Mapping[str, str],
    ) -> None:
        self._follow = follow
        self._session_id = session_id
        self._watch = watch
        # The frames not yet written, and what the writer and the events' follower wait
        # on when there are none, or too many: a list and two events, since a delta is
        # queued for each token of a reply, and a memory object stream costs a few
        # times as much per frame.
        self._queued: list[bytes] = []
        self._ended = False
        self._queued_one: anyio.Event | None = None
        self._written: anyio.Event | None = None
        super().__init__(self._joined(), media_type="text/event-stream", headers=headers)

    async def stream_response(self, send: Send) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if self._watch is not None:
                await stack.enter_async_context(self._watch(self._session_id, self._queue_delta))
            async with anyio.create_task_group() as group:
                group.start_soon(self._follow_events)
                await super().stream_response(send)
                group.cancel_scope.cancel()

    async def _follow_events(self) -> None:
        try:
            await self._follow(self._queue_event)
        finally:
            # The response ends once what was queued is written.
            self._ended = True
            self._wake_writer()

    async def _queue_event(self, frame: bytes) -> None:
        while len(self._queued) >= _QUEUED:
            self._written = anyio.Event()
            await self._written.wait()
        self._queue(frame)

    def _queue_delta(self, delta: TokenDelta) -> None:
        if len(self._queued) < _QUEUED and not self._ended:
            self._queue(sse_delta(delta))

    def _queue(self, frame: bytes) -> None:
        self._queued.append(frame)
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._queued_one is not None:
            self._queued_one.set()
            self._queued_one = None

    async def _joined(self) -> AsyncIterator[bytes]:
        """The queued frames, those waiting joined into one write, until the events end."""
        while True:
            if not self._queued:
                if self._ended:
                    return
                self._queued_one = anyio.Event()
                await self._queued_one.wait()
                continue
            body = b"".join(self._queued)
            self._queued.clear()
            if self._written is not None:
                self._written.set()
                self._written = None
            yield body
