"""Server-Sent Events: a session's events as `id:` seq, `event:` type, `data:` envelope,
and the fragments of its model replies as they stream in, `event: delta` with no id."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream
from starlette.responses import StreamingResponse
from starlette.types import Send

from turnkeeper.events import Envelope, TokenDelta, encode_envelope
from turnkeeper.service._longpoll import EventSource, events_or_stop

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


async def event_stream(
    source: EventSource, session_id: str, *, after: int, ping_seconds: float, stopping: anyio.Event
) -> AsyncIterator[bytes]:
    """The session's events after seq `after` as they are logged, with a ping comment
    after each `ping_seconds` without one (so proxies keep the connection open); ends
    when `stopping` is set."""
    async for envelope in logged_events(
        source, session_id, after=after, ping_seconds=ping_seconds, stopping=stopping
    ):
        yield PING if envelope is None else sse_event(envelope)


async def logged_events(
    source: EventSource, session_id: str, *, after: int, ping_seconds: float, stopping: anyio.Event
) -> AsyncIterator[Envelope | None]:
    """`event_stream`'s events, each as its envelope, a ping as None."""
    while not stopping.is_set():
        # StreamingResponse itself ends the stream when the client goes away.
        found = await events_or_stop(
            source,
            session_id,
            after=after,
            wait=ping_seconds,
            stopping=stopping,
            gone=anyio.sleep_forever,
        )
        if not found:
            if not stopping.is_set():
                yield None
            continue
        for envelope in found:
            yield envelope
        after = found[-1].seq


class EventStreamResponse(StreamingResponse):
    """`events` (`logged_events`) as a text/event-stream, and, with `watch`, the session's
    deltas among them, queued for the client as the model call hands them over, so a
    reply's all come before the reply. They are not held back for the events before
    them (logged, and read back for the stream a moment later): a client places a delta
    by its `after`. The deltas are watched from before the response starts, so a call
    the client sets off once it has the response's headers is streamed. The stream ends
    when `events` do; a client more than a queue's worth behind misses deltas (never
    events)."""

    def __init__(
        self,
        events: AsyncIterator[Envelope | None],
        session_id: str,
        *,
        watch: Watch | None,
        headers: Mapping[str, str],
    ) -> None:
        self._events = events
        self._session_id = session_id
        self._watch = watch
        self._queue, queued = anyio.create_memory_object_stream[bytes](_QUEUED)
        super().__init__(_batched(queued), media_type="text/event-stream", headers=headers)

    async def stream_response(self, send: Send) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if self._watch is not None:
                await stack.enter_async_context(self._watch(self._session_id, self._queue_delta))
            async with anyio.create_task_group() as group:
                group.start_soon(self._follow_events)
                await super().stream_response(send)
                group.cancel_scope.cancel()

    async def _follow_events(self) -> None:
        # Closing the queue when the events end ends the response.
        async with self._queue:
            async for envelope in self._events:
                await self._queue.send(PING if envelope is None else sse_event(envelope))

    def _queue_delta(self, delta: TokenDelta) -> None:
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self._queue.send_nowait(sse_delta(delta))


async def _batched(queue: MemoryObjectReceiveStream[bytes]) -> AsyncIterator[bytes]:
    """The frames of `queue`, those already waiting joined into one write."""
    async with queue:
        async for frame in queue:
            frames = [frame]
            while True:
                try:
                    frames.append(queue.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            yield b"".join(frames)
