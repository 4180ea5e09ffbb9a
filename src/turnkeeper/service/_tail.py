"""A session's events for a client, from a Host or another source: a page after a seq
(a long-poll with `wait`), or a stream of Server-Sent Events (with a Host's deltas)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import anyio
from starlette.requests import Request
from starlette.responses import Response

from turnkeeper.logs import LARGEST_SEQ
from turnkeeper.service._http import DEFAULT_PAGE, int_param, json_response, parse_int, wait_param
from turnkeeper.service._limits import Limits
from turnkeeper.service._longpoll import EventSource, client_gone, events_or_stop
from turnkeeper.service._schemas import EventPage
from turnkeeper.service._sse import EventStreamResponse, Watch, follow_events


async def events_response(
    request: Request, source: EventSource, limits: Limits, stopping: anyio.Event
) -> Response:
    """The page of events `GET .../events` asks for (`after`, `wait`, `limit`)."""
    session_id = request.path_params["session_id"]
    after = int_param(request, "after", 0, 0, LARGEST_SEQ)
    wait = wait_param(request, limits)
    limit = int_param(request, "limit", DEFAULT_PAGE, 1, limits.max_page)
    found = await events_or_stop(
        source,
        session_id,
        after=after,
        wait=wait,
        stopping=stopping,
        gone=partial(client_gone, request),
    )
    page = found[:limit]
    return json_response(EventPage(page, page[-1].seq if page else after))


async def stream_response(
    request: Request,
    source: EventSource,
    exists: Callable[[str], Awaitable[object]],
    *,
    ping_seconds: float,
    stopping: anyio.Event,
    watch: Watch | None = None,
) -> Response:
    """The stream `GET .../events/stream` asks for (after `after` or `Last-Event-ID`), once
    `exists` has not raised for the session (UnknownSession: a 404); with `watch`, the
    session's deltas too."""
    session_id = request.path_params["session_id"]
    after = int_param(request, "after", 0, 0, LARGEST_SEQ)
    last = request.headers.get("last-event-id")
    if last is not None:
        after = parse_int("Last-Event-ID", last.strip(), 0, LARGEST_SEQ)
    await exists(session_id)
    return EventStreamResponse(
        partial(
            follow_events,
            source,
            session_id,
            after=after,
            ping_seconds=ping_seconds,
            stopping=stopping,
        ),
        session_id,
        watch=watch,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
