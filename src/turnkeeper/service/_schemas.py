"""The service's request and response bodies (msgspec Structs, also the OpenAPI schemas)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from turnkeeper.core import AgentSpec, GuardConfig, ToolResult
from turnkeeper.events import Envelope
from turnkeeper.sessions import SessionInfo

SessionId = Annotated[
    str,
    msgspec.Meta(
        # `(?!\n)`: Python's `$` (unlike JSON Schema's) also matches before a last newline.
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$(?!\n)",
        description="At most 200 letters, digits, '.', '_' or '-', starting with a letter "
        "or digit.",
    ),
]
"""A session id chosen by the client. It appears in URLs, so it is kept URL-safe: no
leading dot, as clients drop the path segments `.` and `..`. It is also a name any log
can store (a JsonlLog's file name)."""


class CreateSession(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Open a session on `spec` and start it on `prompt`. With `history` (a prior
    transcript, holding its own system message) the session resumes that transcript;
    without `prompt` it opens idle and waits for a message."""

    spec: AgentSpec = AgentSpec()
    prompt: str | None = None
    session_id: SessionId | None = None
    max_turns: Annotated[int, msgspec.Meta(ge=1)] = 50
    guards: GuardConfig | None = None
    history: list[dict[str, Any]] | None = None


class Created(msgspec.Struct, frozen=True):
    """The id of the session just opened."""

    session_id: str


class PostMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A user message; it starts a new request episode when the session is free."""

    text: str


class PostToolResults(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One result for each tool call the session waits on (its `pending` calls)."""

    results: list[ToolResult]


class SessionPage(msgspec.Struct, frozen=True):
    """Sessions, oldest first; pass `next_cursor` as `cursor` for the next page (null: no more)."""

    sessions: list[SessionInfo]
    next_cursor: str | None


class EventPage(msgspec.Struct, frozen=True):
    """A session's events in seq order; pass `next_after` as `after` to read on."""

    events: list[Envelope]
    next_after: int


class Health(msgspec.Struct, frozen=True):
    """Whether the service takes work: `ok`, or `stopping` while it shuts down."""

    status: Literal["ok", "stopping"]


class ErrorDetail(msgspec.Struct, frozen=True):
    """What was wrong. `field` names it: a body field as a path (`spec.tools[0].name`),
    `body` for the body as a whole, a query or path parameter by name, or a header
    (`Authorization`, `Content-Type`, `Last-Event-ID`); null when no field is at fault."""

    message: str
    field: str | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    """The body of every 4xx and 5xx response."""

    error: ErrorDetail
