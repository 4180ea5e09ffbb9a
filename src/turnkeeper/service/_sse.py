"""Server-Sent Events: a session's events as `id:` seq, `event:` type, `data:` envelope,
and the fragments of its model replies as they stream in, `event: delta` with no id."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream
from starlette.responses import StreamingResponse
from starlette.types import Send

from turnkeeper.events import Envelope, TokenDelta, encode_envelope
from turnkeeper.service._longpoll import EventSource, events_or_stop

PING = b": ping\n\n"
DELTA_EVENT = "delta"
"""The SSE event name of a `TokenDelta`."""

Watch = Callable[[str], AbstractAsyncContextManager[MemoryObjectReceiveStream[TokenDelta]]]
"""A session's deltas for the duration of a block (`Host.deltas`)."""

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
    """`events` (`logged_events` after seq `after`) as a text/event-stream, and, with
    `watch`, the session's deltas among them as they come, in order: the deltas of a
    model call after the event logged before it (their `after`), and before the events
    after it (its reply). The deltas are watched from before the response starts, so a
    call the client sets off once it has the response's headers is streamed. The stream
    ends when `events` do; a client more than a queue's worth behind misses deltas (never
    events)."""

    def __init__(
        self,
        events: AsyncIterator[Envelope | None],
        session_id: str,
        *,
        after: int,
        watch: Watch | None,
        headers: Mapping[str, str],
    ) -> None:
        self._events = events
        self._session_id = session_id
        self._watch = watch
        # The seq of the last event queued for the client, and the deltas not yet queued.
        self._sent = after
        self._held: list[TokenDelta] = []
        self._deltas: MemoryObjectReceiveStream[TokenDelta] | None = None
        self._queue, queued = anyio.create_memory_object_stream[bytes](_QUEUED)
        super().__init__(_batched(queued), media_type="text/event-stream", headers=headers)

    async def stream_response(self, send: Send) -> None:
        async with anyio.create_task_group() as group:
            if self._watch is not None:
                await group.start(self._follow_deltas, self._watch)
            group.start_soon(self._follow_events)
            await super().stream_response(send)
            group.cancel_scope.cancel()

    async def _follow_events(self) -> None:
        # Closing the queue when the events end ends the response (and the deltas with it).
        async with self._queue:
            async for envelope in self._events:
                if envelope is None:
                    await self._queue.send(PING)
                    continue
                self._release(before=envelope.seq)
                await self._queue.send(sse_event(envelope))
                self._sent = envelope.seq
                self._release(before=envelope.seq + 1)

    async def _follow_deltas(
        self, watch: Watch, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        async with watch(self._session_id) as deltas:
            self._deltas = deltas
            task_status.started()
            async for delta in deltas:
                self._hold(delta)
                self._release(before=self._sent + 1)

    def _hold(self, delta: TokenDelta) -> None:
        if len(self._held) < _QUEUED:
            self._held.append(delta)

    def _release(self, *, before: int) -> None:
        """Queue the deltas of calls made after an event before seq `before`, with no
        checkpoint: those the deltas' task has not taken yet too."""
        deltas = self._deltas
        while deltas is not None:
            try:
                self._hold(deltas.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        held = self._held
        ready = 0
        while ready < len(held) and held[ready].after < before:
            ready += 1
        for delta in held[:ready]:
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                self._queue.send_nowait(sse_delta(delta))
        del held[:ready]


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
