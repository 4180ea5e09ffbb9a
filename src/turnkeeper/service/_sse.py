"""Server-Sent Events: a session's events as `id:` seq, `event:` type, `data:` envelope."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

from turnkeeper.events import Envelope, encode_envelope
from turnkeeper.service._longpoll import EventSource, events_or_stop

PING = b": ping\n\n"


def sse_event(envelope: Envelope) -> bytes:
    """One envelope as an SSE event; a client resumes after it with `Last-Event-ID: seq`."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        envelope.seq,
        envelope.type.encode(),
        encode_envelope(envelope),
    )


async def event_stream(
    source: EventSource, session_id: str, *, after: int, ping_seconds: float, stopping: anyio.Event
) -> AsyncIterator[bytes]:
    """The session's events after seq `after` as they are logged, with a ping comment
    after each `ping_seconds` without one (so proxies keep the connection open); ends
    when `stopping` is set."""
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
                yield PING
            continue
        for envelope in found:
            yield sse_event(envelope)
        after = found[-1].seq
