"""What every endpoint shares: routes whose failures are JSON errors, query parameters,
JSON bodies read within the limits, and JSON responses."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

import anyio
import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from turnkeeper.core import MAX_JSON_DEPTH, InputError, LogError, nests_deeper
from turnkeeper.service._errors import ApiError, error_response, validation_error
from turnkeeper.service._limits import Limits
from turnkeeper.service._logging import log as _log
from turnkeeper.service._strict import integral_floats_as_ints, unknown_field
from turnkeeper.service._surrogates import lone_surrogate
from turnkeeper.sessions import Busy, HostStopped, SessionUnreadable, UnknownSession

_S = TypeVar("_S", bound=msgspec.Struct)
Endpoint = Callable[[Request], Awaitable[Response]]

JSON = "application/json"
DEFAULT_PAGE = 100
"""Items in a page when a request names no `limit`."""
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_BUSY_RETRY_SECONDS = 1
_TOO_DEEP = f"body: the JSON nests more than {MAX_JSON_DEPTH} levels"


def route(path: str, **endpoints: Endpoint) -> Route:
    """One route for `path`, each method to its endpoint (HEAD as GET): one route, so a
    405 lists in `Allow` every method the path takes."""
    safe = {method: guarded(endpoint) for method, endpoint in endpoints.items()}

    async def by_method(request: Request) -> Response:
        if request.method == "HEAD":
            return await _head(safe["GET"], request)
        return await safe[request.method](request)

    return Route(path, by_method, methods=list(endpoints))


async def _head(get: Endpoint, request: Request) -> Response:
    """The response to a HEAD: the GET's head alone. A stream's body is not begun (an
    event stream never ends, and its response would hold the connection open)."""
    response = await get(request)
    if not isinstance(response, StreamingResponse):
        return response
    body = response.body_iterator
    if isinstance(body, AsyncGenerator):
        await body.aclose()
    head = Response(status_code=response.status_code, headers=dict(response.headers))
    # Its length is not known: a GET's stream is sent in chunks.
    del head.headers["content-length"]
    return head


def guarded(endpoint: Endpoint) -> Endpoint:
    """`endpoint` with every failure turned into a JSON error response (never a traceback)."""

    async def safely(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return exc.response()
        except SessionUnreadable as exc:
            # Listed (status "unreadable"), so not a 404: it is there, and nothing can be done.
            return error_response(409, str(exc), "session_id")
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

    return safely


async def http_error(request: Request, exc: Exception) -> Response:
    """Routing errors (no such route, method not allowed) as JSON errors."""
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail, None, exc.headers)


def json_response(body: msgspec.Struct, status: int = 200) -> Response:
    """`body` as a JSON response with `status`."""
    return Response(msgspec.json.encode(body), status_code=status, media_type=JSON)


def int_param(
    request: Request, name: str, default: int, minimum: int, maximum: int | None = None
) -> int:
    """The query parameter `name` as an int in [minimum, maximum], `default` if absent."""
    raw = request.query_params.get(name)
    return default if raw is None else parse_int(name, raw, minimum, maximum)


def parse_int(name: str, raw: str, minimum: int, maximum: int | None = None) -> int:
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


async def read_body(request: Request, kind: type[_S], limits: Limits) -> _S:
    """The body decoded as `kind`: JSON, within the size limit of `limits`, read no further
    than it."""
    content_type = request.headers.get("content-type")
    media = (content_type or "").partition(";")[0].strip().lower()
    if media != JSON:
        raise ApiError(415, f"Content-Type: expected {JSON}, got {content_type!r}", "Content-Type")
    limit = limits.max_body_bytes
    too_large = ApiError(413, f"body: larger than the limit of {limit} bytes", "body")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    seconds = limits.body_timeout_seconds
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


def wait_param(request: Request, limits: Limits) -> float:
    """The `wait` query parameter in seconds (0 if absent), cut to the longest wait."""
    raw = request.query_params.get("wait")
    if raw is None:
        return 0.0
    # A JSON number, as the document says: float() also takes "1_0", " 1" and "inf".
    wait = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not math.isfinite(wait) or wait < 0:
        raise ApiError(422, f"wait: expected a number of seconds >= 0, got {raw!r}", "wait")
    return min(wait, limits.max_wait_seconds)
