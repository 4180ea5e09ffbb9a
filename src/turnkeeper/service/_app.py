"""The Starlette app: JSON endpoints under /v1 over a running Host, and the inspector's
pages under /ui/."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from turnkeeper.core import ApprovalDecision, InputError, ToolResult
from turnkeeper.events import MessageReceived
from turnkeeper.service._auth import BearerAuth, check_token
from turnkeeper.service._catalog import Catalog
from turnkeeper.service._errors import ApiError
from turnkeeper.service._http import (
    DEFAULT_PAGE,
    JSON,
    http_error,
    int_param,
    json_response,
    read_body,
    route,
    wait_param,
)
from turnkeeper.service._inspector import Inspector, describe
from turnkeeper.service._limits import DEFAULT_LIMITS, Limits
from turnkeeper.service._longpoll import client_gone, unless_stopping
from turnkeeper.service._metrics import CONTENT_TYPE, FleetFigures, render_metrics
from turnkeeper.service._openapi import openapi_document
from turnkeeper.service._schemas import (
    Created,
    CreateSession,
    ForkSession,
    Health,
    PostApprovals,
    PostMessage,
    PostToolResults,
    SessionPage,
)
from turnkeeper.service._tail import events_response, stream_response
from turnkeeper.service._ui import UI_PREFIX, ui_mount
from turnkeeper.service._unread import CloseUnreadBodies
from turnkeeper.sessions import (
    FleetHost,
    Host,
    SessionInfo,
    SessionUnreadable,
    UnknownSession,
    open_session,
    opened_event,
    session_id_for,
)

HEALTH_PATH = "/v1/healthz"
_FIELD_PREFIX = re.compile(r"^(?P<field>[A-Za-z_][\w.\[\]]*): ")
IDEMPOTENCY_HEADER = "idempotency-key"
_MAX_KEY_CHARS = 255


def create_app(
    host: Host,
    *,
    token: str,
    limits: Limits = DEFAULT_LIMITS,
    ping_seconds: float = 15.0,
    stopping: anyio.Event | None = None,
) -> Starlette:
    """The HTTP API over `host` (which must be running), and the inspector's pages under
    /ui/: every route but /v1/healthz and the pages needs `Authorization: Bearer <token>`
    (the pages ask for it and send it to the API). Setting `stopping` ends long-polls and event
    streams at once and turns health to 503, so a server can shut down without waiting
    on them. Call it inside the event loop that runs `host`."""
    check_token(token)
    if not isinstance(limits, Limits):
        raise InputError(f"limits: expected Limits, got {type(limits).__name__}")
    if not isinstance(ping_seconds, int | float) or not ping_seconds > 0:
        raise InputError(f"ping_seconds: expected a number > 0, got {ping_seconds!r}")
    api = _Api(host, limits, ping_seconds, stopping if stopping is not None else anyio.Event())
    inspector = Inspector(Catalog(host.log), live=True, source=describe(host.log), limits=limits)
    sessions = "/v1/sessions"
    one = sessions + "/{session_id}"
    routes = [
        route(sessions, POST=api.create, GET=api.list_sessions),
        route(one, GET=api.get),
        route(one + "/messages", POST=api.message),
        route(one + "/tool_results", POST=api.tool_results),
        route(one + "/approvals", POST=api.approvals),
        route(one + "/cancel", POST=api.cancel),
        route(one + "/retry", POST=api.retry),
        route(one + "/fork", POST=api.fork),
        route(one + "/recheck", POST=inspector.recheck),
        route(one + "/events", GET=api.events),
        route(one + "/events/stream", GET=api.stream),
        route(HEALTH_PATH, GET=api.health),
        route("/v1/metrics", GET=api.metrics),
        route("/v1/openapi.json", GET=api.openapi),
        *inspector.routes(),
        ui_mount(),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(CloseUnreadBodies),
            Middleware(
                BearerAuth,
                token=token,
                public=frozenset({HEALTH_PATH, UI_PREFIX}),
                public_prefixes=(UI_PREFIX + "/",),
            ),
        ],
        exception_handlers={HTTPException: http_error},
    )


class _Api:
    """The endpoints, over one host."""

    def __init__(
        self, host: Host, limits: Limits, ping_seconds: float, stopping: anyio.Event
    ) -> None:
        self.host = host
        self.limits = limits
        self.ping_seconds = ping_seconds
        self.stopping = stopping
        self.document = msgspec.json.encode(openapi_document(limits))

    async def create(self, request: Request) -> Response:
        body = await read_body(request, CreateSession, self.limits)
        if body.prompt is not None:
            self._check_text("prompt", body.prompt, self.limits.max_text_chars)
        if body.history is not None and len(body.history) > self.limits.max_history_messages:
            raise ApiError(
                422,
                f"history: {len(body.history)} messages, more than the limit of "
                f"{self.limits.max_history_messages}",
                "history",
            )
        key = self._key(request)
        made = None
        if key is not None and isinstance(self.host, FleetHost):
            # Made already by this create, sent before (to any worker): the same answer.
            made = body.session_id or session_id_for(key)
            if await self._exists(made) and await self._made_by(made, body):
                return json_response(Created(made), 201)
        if body.session_id is not None and await self._exists(body.session_id):
            raise ApiError(409, f"session {body.session_id} already exists", "session_id")
        try:
            if body.prompt is not None and body.history:
                _check_prompt_follows(body)
            options = {"request_id": key} if isinstance(self.host, FleetHost) else {}
            session_id = await self.host.start(
                body.spec,
                body.prompt,
                session_id=body.session_id,
                max_turns=body.max_turns,
                guards=body.guards,
                history=body.history,
                **options,
            )
        except InputError as exc:
            field = _field_named(str(exc))
            if field == "session_id" and made is not None and await self._made_by(made, body):
                # The same create, sent at once to another worker, which made it first.
                return json_response(Created(made), 201)
            raise ApiError(409 if field == "session_id" else 422, str(exc), field) from None
        return json_response(Created(session_id), 201)

    async def list_sessions(self, request: Request) -> Response:
        limit = int_param(request, "limit", DEFAULT_PAGE, 1, self.limits.max_page)
        cursor = request.query_params.get("cursor")
        ids = await self.host.sessions()
        start = 0
        if cursor is not None:
            try:
                start = ids.index(cursor) + 1
            except ValueError:
                raise ApiError(
                    422, f"cursor: {cursor!r} is not the next_cursor of a page", "cursor"
                ) from None
        page = ids[start : start + limit]
        infos = []
        for session_id in page:
            try:
                # One the log cannot rebuild is listed as "unreadable", saying why.
                infos.append(await self.host.status(session_id))
            except UnknownSession:
                continue  # gone from the log since it was listed
        more = start + limit < len(ids)
        return json_response(SessionPage(infos, page[-1] if more and page else None))

    async def get(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        wait = wait_param(request, self.limits)
        info = await self.host.status(session_id)
        if wait > 0 and info.status == "running":
            settled = await unless_stopping(
                self.stopping,
                lambda: self.host.result(session_id, wait=wait),
                partial(client_gone, request),
            )
            info = settled or await self.host.status(session_id)
        return json_response(info)

    async def message(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await read_body(request, PostMessage, self.limits)
        self._check_text("text", body.text, self.limits.max_text_chars)
        key = self._key(request)
        if isinstance(self.host, FleetHost):
            await self.host.send(session_id, body.text, request_id=key)
        else:
            await self.host.send(session_id, body.text)
        return json_response(await self.host.status(session_id), 202)

    async def tool_results(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await read_body(request, PostToolResults, self.limits)
        for index, result in enumerate(body.results):
            self._check_text(
                f"results[{index}].text", result.text, self.limits.max_tool_result_chars
            )
        key = self._key(request)
        if key is None:
            # With a key, a request sent again after the first was done must not be refused
            # for it: the inbox answers it as it answered the first.
            await self._check_waiting(session_id)
        try:
            await self._submit(session_id, body.results, key)
        except InputError as exc:
            # Another request's results may have come first: that is a conflict too.
            await self._check_waiting(session_id)
            raise ApiError(422, str(exc), "results") from None
        return json_response(await self.host.status(session_id), 202)

    async def _check_waiting(self, session_id: str) -> None:
        """A 409 unless the session waits for tool results."""
        info = await self._readable(session_id)
        if info.status != "requires_action":
            raise ApiError(
                409, f"session {session_id} is {info.status}, not waiting for tool results"
            )

    async def _submit(
        self, session_id: str, results: Sequence[ToolResult], key: str | None
    ) -> None:
        if isinstance(self.host, FleetHost):
            await self.host.submit_tool_results(session_id, results, request_id=key)
        else:
            await self.host.submit_tool_results(session_id, results)

    async def approvals(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await read_body(request, PostApprovals, self.limits)
        for index, decision in enumerate(body.decisions):
            if decision.reason is not None:
                field = f"decisions[{index}].reason"
                self._check_text(field, decision.reason, self.limits.max_text_chars)
        key = self._key(request)
        if key is None:
            await self._check_awaiting(session_id)
        try:
            await self._approve(session_id, body.decisions, key)
        except InputError as exc:
            # Another request's decisions may have come first: that is a conflict too.
            await self._check_awaiting(session_id)
            raise ApiError(422, str(exc), _field_named(str(exc)) or "decisions") from None
        return json_response(await self.host.status(session_id), 202)

    async def _check_awaiting(self, session_id: str) -> None:
        """A 409 unless the session has tool calls awaiting approval."""
        info = await self._readable(session_id)
        if info.status != "awaiting_approval":
            raise ApiError(
                409, f"session {session_id} is {info.status}, not awaiting approval of tool calls"
            )

    async def _approve(
        self, session_id: str, decisions: Sequence[ApprovalDecision], key: str | None
    ) -> None:
        if isinstance(self.host, FleetHost):
            await self.host.approve(session_id, decisions, request_id=key)
        else:
            await self.host.approve(session_id, decisions)

    async def cancel(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        key = self._key(request)
        if isinstance(self.host, FleetHost):
            await self.host.cancel(session_id, request_id=key)
        else:
            await self.host.cancel(session_id)
        return json_response(await self.host.status(session_id))

    async def retry(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        key = self._key(request)
        if isinstance(self.host, FleetHost):
            await self.host.retry(session_id, request_id=key)
        else:
            await self.host.retry(session_id)
        return json_response(await self.host.status(session_id))

    async def fork(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await read_body(request, ForkSession, self.limits)
        try:
            info = await self.host.fork(session_id, body.at_seq, body.new_id)
        except InputError as exc:
            field = _field_named(str(exc))
            raise ApiError(409 if field == "new_id" else 422, str(exc), field) from None
        return json_response(info, 201)

    async def events(self, request: Request) -> Response:
        return await events_response(request, self.host, self.limits, self.stopping)

    async def stream(self, request: Request) -> Response:
        return await stream_response(
            request,
            self.host,
            self._readable,
            ping_seconds=self.ping_seconds,
            stopping=self.stopping,
            watch=self.host.watch_deltas,
        )

    async def health(self, request: Request) -> Response:
        if self.stopping.is_set():
            return json_response(Health("stopping"), 503)
        return json_response(Health("ok"))

    async def metrics(self, request: Request) -> Response:
        # Counted without reading back the sessions the host dropped from memory.
        statuses = await self.host.statuses()
        host = self.host
        appended = (host.appends, host.append_seconds_total)
        fleet = None
        if isinstance(host, FleetHost):
            fleet = FleetFigures(
                owned_sessions=len(host.shared.held()),
                inbox_depth=await host.inbox_depth(),
                takeovers=host.shared.takeovers,
                fence_losses=host.shared.fence_losses,
            )
        text = render_metrics(
            statuses, host.counters, host.append_seconds, appended, fleet, host.cost_total
        )
        return Response(text, media_type=CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        return Response(self.document, media_type=JSON)

    # -- reading requests -------------------------------------------------------------------

    async def _made_by(self, session_id: str, body: CreateSession) -> bool:
        """Whether the session is the one `body` makes, sent before with the same
        Idempotency-Key: always for an id the key chose (a create named no `session_id`);
        for one the client named, if its log opens as the create would open it (else
        another create took that id first)."""
        if body.session_id is None:
            return True
        try:
            expected = opened_event(
                open_session(
                    body.spec,
                    session_id=session_id,
                    history=body.history,
                    max_turns=body.max_turns,
                    guards=body.guards,
                )
            )
        except InputError:
            return False
        events = await self.host.events(session_id)
        if not events or events[0].event != expected:
            return False
        asked = next((e.event for e in events if isinstance(e.event, MessageReceived)), None)
        return body.prompt is None or (asked is not None and asked.text == body.prompt)

    def _key(self, request: Request) -> str | None:
        """The client's `Idempotency-Key` (a worker of a fleet does each key once; one
        host alone takes it and ignores it)."""
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is None:
            return None
        if not key or len(key) > _MAX_KEY_CHARS or not all(" " <= c <= "~" for c in key):
            raise ApiError(
                422,
                f"Idempotency-Key: expected 1 to {_MAX_KEY_CHARS} printable ASCII characters",
                "Idempotency-Key",
            )
        return key

    def _check_text(self, field: str, text: str, limit: int) -> None:
        if len(text) > limit:
            raise ApiError(
                422, f"{field}: {len(text)} characters, more than the limit of {limit}", field
            )

    async def _readable(self, session_id: str) -> SessionInfo:
        """The session's status; SessionUnreadable (a 409 naming what is wrong) if it is
        quarantined."""
        info = await self.host.status(session_id)
        if info.status == "unreadable":
            raise SessionUnreadable(session_id, info.error or "")
        return info

    async def _exists(self, session_id: str) -> bool:
        try:
            await self.host.status(session_id)
        except UnknownSession:
            return False
        return True


def _check_prompt_follows(body: CreateSession) -> None:
    """A 422 naming the prompt if the history ends in tool calls still unanswered: the
    session must have their results before a prompt. Checked before the session starts,
    so no error names a session that was never made."""
    pending = open_session(body.spec, history=body.history).pending
    if pending:
        calls = ", ".join(use.id for use in pending)
        raise ApiError(
            422,
            f"prompt: the history ends in tool calls with no results ({calls}); open the "
            "session without a prompt, let it finish them (post the results of any it waits "
            "on), then post the prompt as a message",
            "prompt",
        )


def _field_named(message: str) -> str | None:
    """The field an InputError message starts with (`history[0].role: ...`), if any."""
    found = _FIELD_PREFIX.match(message)
    return found["field"] if found else None
