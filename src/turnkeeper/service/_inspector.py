"""The inspector's JSON endpoints: the session list sorted by last activity, one
session's summary, and the what-if re-check; over a live Host's log (`create_app`) or a
log another process writes (`create_inspector_app`, for `turnkeeper ui`)."""

from __future__ import annotations

import re
from functools import partial

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from turnkeeper.core import InputError, ReplayError
from turnkeeper.events import SessionOpened
from turnkeeper.logs import EventLog, JsonlLog, MemoryLog, PostgresLog, SqliteLog
from turnkeeper.service._auth import BearerAuth, check_token
from turnkeeper.service._catalog import Catalog
from turnkeeper.service._errors import ApiError
from turnkeeper.service._http import http_error, int_param, json_response, read_body, route
from turnkeeper.service._limits import DEFAULT_LIMITS, Limits
from turnkeeper.service._schemas import Recheck, RecheckRequest, SessionList, SessionView
from turnkeeper.service._summary import LISTED_STATUSES, ListedStatus, Tracker
from turnkeeper.service._tail import events_response, stream_response
from turnkeeper.service._ui import UI_PREFIX, ui_mount
from turnkeeper.service._unread import CloseUnreadBodies
from turnkeeper.sessions import check_guards_of, recheck

INSPECTOR_PATH = "/v1/inspector/sessions"
_LIST_PAGE = 50
_MAX_SEARCH = 200
# How long a list request spends reading on in the log: a first look at a large log
# answers with what was read so far, and the next requests read on.
_CATCH_UP_SECONDS = 0.3
_GUARD_FIELD = re.compile(r"^(?P<field>guards[\w.]*): ")


def describe(log: EventLog) -> str:
    """What the log is, for the pages' header (a PostgreSQL URL is left out: it may hold a
    password)."""
    if isinstance(log, SqliteLog):
        return f"SQLite log {log.path}"
    if isinstance(log, JsonlLog):
        return f"JSON Lines log {log.directory}"
    if isinstance(log, PostgresLog):
        return "PostgreSQL log"
    if isinstance(log, MemoryLog):
        return "in-memory log"
    return type(log).__name__


class Inspector:
    """The endpoints, over `catalog`; `live` if a Host runs the sessions."""

    def __init__(self, catalog: Catalog, *, live: bool, source: str, limits: Limits) -> None:
        self.catalog = catalog
        self.live = live
        self.source = source
        self.limits = limits

    def routes(self) -> list[BaseRoute]:
        """The list and summary routes (the re-check goes under /v1/sessions/{id})."""
        return [
            route(INSPECTOR_PATH, GET=self.list_sessions),
            route(INSPECTOR_PATH + "/{session_id}", GET=self.session),
        ]

    async def list_sessions(self, request: Request) -> Response:
        status = _status_param(request)
        search = request.query_params.get("search") or None
        if search is not None and len(search) > _MAX_SEARCH:
            raise ApiError(
                422, f"search: {len(search)} characters, more than {_MAX_SEARCH}", "search"
            )
        limit = int_param(request, "limit", _LIST_PAGE, 1, self.limits.max_page)
        raw = request.query_params.get("cursor")
        cursor = None if raw is None else _cursor(raw)
        catalog = self.catalog
        await catalog.catch_up(_CATCH_UP_SECONDS)
        page = catalog.page(status=status, search=search, limit=limit, cursor=cursor)
        return json_response(
            SessionList(
                sessions=page.sessions,
                next_cursor=None if page.next_cursor is None else str(page.next_cursor),
                counts=catalog.counts(),
                total=catalog.total,
                matched=page.matched,
                indexing=catalog.indexing,
                live=self.live,
                source=self.source,
            )
        )

    async def session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        # From the session's own events, not the list's index: that may not have read so far.
        tracker = Tracker(session_id)
        for envelope in await self.catalog.read(session_id):
            tracker.apply(envelope)
        view = SessionView(tracker.summary(), self.live, self.source, self.limits.max_page)
        return json_response(view)

    async def recheck(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await read_body(request, RecheckRequest, self.limits)
        events = await self.catalog.read(session_id)
        opening = events[0].event if events else None
        if body.guards is not None and isinstance(opening, SessionOpened):
            try:
                check_guards_of(opening.spec, body.guards)
            except InputError as exc:
                # Settings the request may make, which this session's spec cannot meet.
                raise ApiError(409, f"session {session_id}: {exc}", "guards") from None
        try:
            # In a worker thread: a long log's re-check would hold the event loop.
            divergence = await anyio.to_thread.run_sync(
                partial(recheck, events, guards=body.guards)
            )
        except InputError as exc:
            found = _GUARD_FIELD.match(str(exc))
            raise ApiError(422, str(exc), found["field"] if found else "guards") from None
        except ReplayError as exc:
            raise ApiError(409, f"session {session_id} cannot be re-checked: {exc}") from None
        return json_response(Recheck(body.guards, len(events), divergence))


def _status_param(request: Request) -> ListedStatus | None:
    raw = request.query_params.get("status")
    if raw is None:
        return None
    for status in LISTED_STATUSES:
        if raw == status:
            return status
    raise ApiError(
        422, f"status: expected one of {', '.join(LISTED_STATUSES)}, got {raw!r}", "status"
    )


def _cursor(raw: str) -> int:
    """A list cursor: the position the next page comes before."""
    # At most 18 digits: every position is below 2**63.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise ApiError(422, f"cursor: {raw!r} is not the next_cursor of a page", "cursor")
    return int(raw)


def create_inspector_app(
    catalog: Catalog,
    *,
    token: str,
    source: str,
    limits: Limits = DEFAULT_LIMITS,
    ping_seconds: float = 15.0,
    stopping: anyio.Event | None = None,
) -> Starlette:
    """The inspector over a log no Host of this process runs: the pages, the list, each
    session's summary, events (long-poll and stream, from the log as it grows) and
    re-check; nothing that changes a session. Every route but the pages needs the
    token. Setting `stopping` ends long-polls and streams."""
    check_token(token)
    stop = stopping if stopping is not None else anyio.Event()
    inspector = Inspector(catalog, live=False, source=source, limits=limits)
    one = "/v1/sessions/{session_id}"

    async def events(request: Request) -> Response:
        return await events_response(request, catalog, limits, stop)

    async def stream(request: Request) -> Response:
        return await stream_response(
            request, catalog, catalog.check, ping_seconds=ping_seconds, stopping=stop
        )

    async def home(request: Request) -> Response:
        return RedirectResponse(UI_PREFIX + "/")

    routes: list[BaseRoute] = [
        Route("/", home),
        ui_mount(),
        *inspector.routes(),
        route(one + "/events", GET=events),
        route(one + "/events/stream", GET=stream),
        route(one + "/recheck", POST=inspector.recheck),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(CloseUnreadBodies),
            Middleware(
                BearerAuth,
                token=token,
                public=frozenset({"/", UI_PREFIX}),
                public_prefixes=(UI_PREFIX + "/",),
            ),
        ],
        exception_handlers={HTTPException: http_error},
    )
