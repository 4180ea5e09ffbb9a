"""The Starlette app: JSON endpoints under /v1 over a running Host."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from functools import partial
from typing import TypeVar

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from turnkeeper.core import MAX_JSON_DEPTH, InputError, LogError, nests_deeper
from turnkeeper.logs import LARGEST_SEQ
from turnkeeper.service._auth import BearerAuth, check_token
from turnkeeper.service._errors import ApiError, error_response, validation_error
from turnkeeper.service._limits import DEFAULT_LIMITS, Limits
from turnkeeper.service._logging import log as _log
from turnkeeper.service._longpoll import client_gone, events_or_stop, unless_stopping
from turnkeeper.service._metrics import CONTENT_TYPE, render_metrics
from turnkeeper.service._openapi import openapi_document
from turnkeeper.service._schemas import (
    Created,
    CreateSession,
    EventPage,
    Health,
    PostMessage,
    PostToolResults,
    SessionPage,
)
from turnkeeper.service._sse import event_stream
from turnkeeper.service._strict import integral_floats_as_ints, unknown_field
from turnkeeper.service._surrogates import lone_surrogate
from turnkeeper.service._unread import CloseUnreadBodies
from turnkeeper.sessions import Busy, Host, HostStopped, UnknownSession, open_session

_S = TypeVar("_S", bound=msgspec.Struct)
Endpoint = Callable[[Request], Awaitable[Response]]

HEALTH_PATH = "/v1/healthz"
_JSON = "application/json"
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_FIELD_PREFIX = re.compile(r"^(?P<field>[A-Za-z_][\w.\[\]]*): ")
_DEFAULT_PAGE = 100
_BUSY_RETRY_SECONDS = 1
_TOO_DEEP = f"body: the JSON nests more than {MAX_JSON_DEPTH} levels"


def create_app(
    host: Host,
    *,
    token: str,
    limits: Limits = DEFAULT_LIMITS,
    ping_seconds: float = 15.0,
    stopping: anyio.Event | None = None,
) -> Starlette:
    """The HTTP API over `host` (which must be running): every route but /v1/healthz
    needs `Authorization: Bearer <token>`. Setting `stopping` ends long-polls and event
    streams at once and turns health to 503, so a server can shut down without waiting
    on them. Call it inside the event loop that runs `host`."""
    check_token(token)
    if not isinstance(limits, Limits):
        raise InputError(f"limits: expected Limits, got {type(limits).__name__}")
    if not isinstance(ping_seconds, int | float) or not ping_seconds > 0:
        raise InputError(f"ping_seconds: expected a number > 0, got {ping_seconds!r}")
    api = _Api(host, limits, ping_seconds, stopping if stopping is not None else anyio.Event())
    sessions = "/v1/sessions"
    one = sessions + "/{session_id}"
    routes = [
        _route(sessions, POST=api.create, GET=api.list_sessions),
        _route(one, GET=api.get),
        _route(one + "/messages", POST=api.message),
        _route(one + "/tool_results", POST=api.tool_results),
        _route(one + "/cancel", POST=api.cancel),
        _route(one + "/events", GET=api.events),
        _route(one + "/events/stream", GET=api.stream),
        _route(HEALTH_PATH, GET=api.health),
        _route("/v1/metrics", GET=api.metrics),
        _route("/v1/openapi.json", GET=api.openapi),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(CloseUnreadBodies),
            Middleware(BearerAuth, token=token, public=frozenset({HEALTH_PATH})),
        ],
        exception_handlers={HTTPException: _http_error},
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
        body = await self._read(request, CreateSession)
        if body.prompt is not None:
            self._check_text("prompt", body.prompt, self.limits.max_text_chars)
        if body.history is not None and len(body.history) > self.limits.max_history_messages:
            raise ApiError(
                422,
                f"history: {len(body.history)} messages, more than the limit of "
                f"{self.limits.max_history_messages}",
                "history",
            )
        if body.session_id is not None and await self._exists(body.session_id):
            raise ApiError(409, f"session {body.session_id} already exists", "session_id")
        try:
            if body.prompt is not None and body.history:
                _check_prompt_follows(body)
            session_id = await self.host.start(
                body.spec,
                body.prompt,
                session_id=body.session_id,
                max_turns=body.max_turns,
                guards=body.guards,
                history=body.history,
            )
        except InputError as exc:
            field = _field_named(str(exc))
            raise ApiError(409 if field == "session_id" else 422, str(exc), field) from None
        return _json(Created(session_id), 201)

    async def list_sessions(self, request: Request) -> Response:
        limit = _int_param(request, "limit", _DEFAULT_PAGE, 1, self.limits.max_page)
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
                infos.append(await self.host.status(session_id))
            except UnknownSession:
                continue  # in the log, but it cannot be rebuilt; the host has logged why
        more = start + limit < len(ids)
        return _json(SessionPage(infos, page[-1] if more and page else None))

    async def get(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        wait = self._wait(request)
        info = await self.host.status(session_id)
        if wait > 0 and info.status == "running":
            settled = await unless_stopping(
                self.stopping,
                lambda: self.host.result(session_id, wait=wait),
                partial(client_gone, request),
            )
            info = settled or await self.host.status(session_id)
        return _json(info)

    async def message(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await self._read(request, PostMessage)
        self._check_text("text", body.text, self.limits.max_text_chars)
        await self.host.send(session_id, body.text)
        return _json(await self.host.status(session_id), 202)

    async def tool_results(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await self._read(request, PostToolResults)
        for index, result in enumerate(body.results):
            self._check_text(
                f"results[{index}].text", result.text, self.limits.max_tool_result_chars
            )
        await self._check_waiting(session_id)
        try:
            await self.host.submit_tool_results(session_id, body.results)
        except InputError as exc:
            # Another request's results may have come first: that is a conflict too.
            await self._check_waiting(session_id)
            raise ApiError(422, str(exc), "results") from None
        return _json(await self.host.status(session_id), 202)

    async def _check_waiting(self, session_id: str) -> None:
        """A 409 unless the session waits for tool results."""
        info = await self.host.status(session_id)
        if info.status != "requires_action":
            raise ApiError(
                409, f"session {session_id} is {info.status}, not waiting for tool results"
            )

    async def cancel(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        await self.host.cancel(session_id)
        return _json(await self.host.status(session_id))

    async def events(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        after = _int_param(request, "after", 0, 0, LARGEST_SEQ)
        wait = self._wait(request)
        limit = _int_param(request, "limit", _DEFAULT_PAGE, 1, self.limits.max_page)
        found = await events_or_stop(
            self.host,
            session_id,
            after=after,
            wait=wait,
            stopping=self.stopping,
            gone=partial(client_gone, request),
        )
        page = found[:limit]
        return _json(EventPage(page, page[-1].seq if page else after))

    async def stream(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        after = _int_param(request, "after", 0, 0, LARGEST_SEQ)
        last = request.headers.get("last-event-id")
        if last is not None:
            after = _parse_int("Last-Event-ID", last.strip(), 0, LARGEST_SEQ)
        await self.host.status(session_id)
        return StreamingResponse(
            event_stream(
                self.host,
                session_id,
                after=after,
                ping_seconds=self.ping_seconds,
                stopping=self.stopping,
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def health(self, request: Request) -> Response:
        if self.stopping.is_set():
            return _json(Health("stopping"), 503)
        return _json(Health("ok"))

    async def metrics(self, request: Request) -> Response:
        # Counted without reading back the sessions the host dropped from memory.
        statuses = await self.host.statuses()
        host = self.host
        appended = (host.appends, host.append_seconds_total)
        text = render_metrics(statuses, host.counters, host.append_seconds, appended)
        return Response(text, media_type=CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        return Response(self.document, media_type=_JSON)

    # -- reading requests -------------------------------------------------------------------

    async def _read(self, request: Request, kind: type[_S]) -> _S:
        """The body decoded as `kind`: JSON, within the size limit, read no further than it."""
        content_type = request.headers.get("content-type")
        media = (content_type or "").partition(";")[0].strip().lower()
        if media != _JSON:
            raise ApiError(
                415, f"Content-Type: expected {_JSON}, got {content_type!r}", "Content-Type"
            )
        limit = self.limits.max_body_bytes
        too_large = ApiError(413, f"body: larger than the limit of {limit} bytes", "body")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        seconds = self.limits.body_timeout_seconds
        try:
            # A client that stalls mid-body would otherwise hold its connection forever: the
            # server's keep-alive timeout only covers the wait for a request's headers.
            with anyio.move_on_after(seconds) as reading:
                # Closed explicitly: a stream left mid-body would be finalized by the GC.
                async with aclosing(request.stream()) as stream:
                    async for chunk in stream:
                        size += len(chunk)
                        if size > limit:
                            raise too_large
                        chunks.append(chunk)
        except ClientDisconnect:
            raise ApiError(400, "body: the client went away while sending it", "body") from None
        if reading.cancelled_caught:
            # Unread to its end, so the response says `Connection: close` (CloseUnreadBodies).
            raise ApiError(408, f"body: not received in full within {seconds:g} seconds", "body")
        body = b"".join(chunks)
        try:
            decoded = msgspec.json.decode(body, type=kind)
        except msgspec.ValidationError as exc:
            decoded = _with_integral_floats(body, kind, exc)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _not_json(body, exc) from None
        # It decoded as `kind`, so it decodes as plain JSON too.
        plain = msgspec.json.decode(body)
        # Decoded here, it may still nest too deep for the log to encode, deeper in the stack.
        if nests_deeper(plain, MAX_JSON_DEPTH):
            raise ApiError(400, _TOO_DEEP, "body")
        unknown = unknown_field(plain, kind)
        if unknown is not None:
            raise ApiError(422, f"{unknown}: unknown field", unknown)
        return decoded

    def _check_text(self, field: str, text: str, limit: int) -> None:
        if len(text) > limit:
            raise ApiError(
                422, f"{field}: {len(text)} characters, more than the limit of {limit}", field
            )

    def _wait(self, request: Request) -> float:
        raw = request.query_params.get("wait")
        if raw is None:
            return 0.0
        # A JSON number, as the document says: float() also takes "1_0", " 1" and "inf".
        wait = float(raw) if _NUMBER.fullmatch(raw) else math.nan
        if not math.isfinite(wait) or wait < 0:
            raise ApiError(422, f"wait: expected a number of seconds >= 0, got {raw!r}", "wait")
        return min(wait, self.limits.max_wait_seconds)

    async def _exists(self, session_id: str) -> bool:
        try:
            await self.host.status(session_id)
        except UnknownSession:
            return False
        return True


def _route(path: str, **endpoints: Endpoint) -> Route:
    """One route for `path`, each method to its endpoint (HEAD as GET): one route, so a
    405 lists in `Allow` every method the path takes."""
    guarded = {method: _guarded(endpoint) for method, endpoint in endpoints.items()}

    async def by_method(request: Request) -> Response:
        return await guarded["GET" if request.method == "HEAD" else request.method](request)

    return Route(path, by_method, methods=list(endpoints))


def _guarded(endpoint: Endpoint) -> Endpoint:
    """`endpoint` with every failure turned into a JSON error response (never a traceback)."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return exc.response()
        except UnknownSession as exc:
            return error_response(404, str(exc), "session_id")
        except Busy as exc:
            return error_response(429, str(exc), None, {"Retry-After": str(_BUSY_RETRY_SECONDS)})
        except HostStopped as exc:
            return error_response(503, str(exc))
        except InputError as exc:
            return error_response(409, str(exc))
        except LogError as exc:
            _log.error("request.log_error", path=request.url.path, error=str(exc))
            return error_response(503, f"the event log failed: {exc}")
        except Exception:
            _log.error("request.failed", path=request.url.path, exc_info=True)
            return error_response(500, "internal error; the server log has the details")

    return guarded


async def _http_error(request: Request, exc: Exception) -> Response:
    """Routing errors (no such route, method not allowed) as JSON errors."""
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail, None, exc.headers)


def _json(body: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type=_JSON)


def _int_param(
    request: Request, name: str, default: int, minimum: int, maximum: int | None = None
) -> int:
    raw = request.query_params.get(name)
    return default if raw is None else _parse_int(name, raw, minimum, maximum)


def _parse_int(name: str, raw: str, minimum: int, maximum: int | None = None) -> int:
    """`raw` as an int in [minimum, maximum], or a 422 naming `name`."""
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    problem = ApiError(422, f"{name}: expected an integer {bounds}, got {raw!r}", name)
    # Digits past the 19 of the largest bound are refused before int() spends time on them.
    if not raw.isascii() or not raw.isdigit() or len(raw.lstrip("0")) > 19:
        raise problem
    value = int(raw)
    if value < minimum or (maximum is not None and value > maximum):
        raise problem
    return value


def _with_integral_floats(body: bytes, kind: type[_S], refused: msgspec.ValidationError) -> _S:
    """`body` decoded as `kind` once its floats with no fraction are made ints where it
    takes ints (`{"max_turns": 3.0}`); a 422 for `refused` if it holds none of them."""
    try:
        plain = msgspec.json.decode(body)
    except msgspec.ValidationError:  # a number out of range
        raise validation_error(refused) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        # Typed, msgspec stops at the first value of a wrong type, before the JSON's end.
        raise _not_json(body, exc) from None
    fixed = integral_floats_as_ints(plain, kind)
    if fixed is plain:
        raise validation_error(refused) from None
    try:
        return msgspec.convert(fixed, kind)
    except msgspec.ValidationError as exc:
        raise validation_error(exc) from None


def _not_json(body: bytes, exc: msgspec.DecodeError | RecursionError) -> ApiError:
    """The 4xx for a body msgspec cannot read as JSON: one that nests too deep, one with a
    lone surrogate (which msgspec misnames), or one that is not JSON."""
    if isinstance(exc, RecursionError):
        return ApiError(400, _TOO_DEEP, "body")
    surrogate = lone_surrogate(body)
    if surrogate is not None:
        return ApiError(422, surrogate[1], surrogate[0])
    return ApiError(400, f"body: not valid JSON ({exc})", "body")


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
