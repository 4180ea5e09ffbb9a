"""Errors as HTTP responses: a status and a JSON body naming the field at fault."""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
from starlette.responses import Response

from turnkeeper.core import TurnkeeperError
from turnkeeper.service._schemas import ErrorBody, ErrorDetail

_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]+)`")
_OWNED = re.compile(r"^[A-Z]\w*\.(?P<name>\w+): ")


class ApiError(TurnkeeperError):
    """A request the service refuses: `status` (4xx/5xx), why, and the field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = dict(headers or {})

    def response(self) -> Response:
        """The error as a JSON response."""
        return error_response(self.status, self.message, self.field, self.headers)


def error_response(
    status: int, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """`{"error": {"message", "field"}}` with `status`."""
    return Response(
        msgspec.json.encode(ErrorBody(ErrorDetail(message, field))),
        status_code=status,
        headers=dict(headers or {}),
        media_type="application/json",
    )


def validation_error(exc: msgspec.ValidationError) -> ApiError:
    """A 422 naming the body field msgspec found wrong (its message says where)."""
    message = str(exc)
    return ApiError(422, message, field_of(message))


def field_of(message: str) -> str:
    """The body field a msgspec validation message is about, as a path like
    `spec.tools[0].name`; `body` when it is about the body as a whole."""
    found = _AT.search(message)
    path = found["path"] if found else ""
    text = message[: found.start()] if found else message
    named = _NAMED.search(text) or _OWNED.match(text)
    if named:
        path = f"{path}.{named['name']}"
    return path.lstrip(".") or "body"
