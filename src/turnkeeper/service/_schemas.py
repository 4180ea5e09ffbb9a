"""The service's request and response bodies (msgspec Structs, also the OpenAPI schemas)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from turnkeeper.core import AgentSpec, ApprovalDecision, GuardConfig, ToolResult
from turnkeeper.events import Envelope
from turnkeeper.service._summary import ListedStatus, SessionSummary
from turnkeeper.sessions import Divergence, SessionInfo

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


class ForkSession(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fork the session at seq `at_seq`: a new session (`new_id`, or a new id) whose log
    begins as the first `at_seq` events of this one's, and then runs on its own."""

    at_seq: Annotated[int, msgspec.Meta(ge=1)]
    new_id: SessionId | None = None


class PostToolResults(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One result for each tool call the session waits on (its `pending` calls)."""

    results: list[ToolResult]


class PostApprovals(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Decisions on tool calls the session has awaiting approval (its `awaiting` calls),
    by call id: some or all of them."""

    decisions: list[ApprovalDecision]


class SessionPage(msgspec.Struct, frozen=True):
    """Sessions, oldest first; pass `next_cursor` as `cursor` for the next page (null: no more)."""

    sessions: list[SessionInfo]
    next_cursor: str | None


class EventPage(msgspec.Struct, frozen=True):
    """A session's events in seq order; pass `next_after` as `after` to read on."""

    events: list[Envelope]
    next_after: int


class RecheckRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A guard configuration to re-check a session's log under: every guard, as a new
    session's `guards` (a guard left out takes its default; `null` turns it off)."""

    guards: GuardConfig


class Recheck(msgspec.Struct, frozen=True):
    """What the guards of `guards` would have done over the session's logged inputs and
    responses, with no model call: `divergence` is the first poll where they would have
    done otherwise than the log shows (null: the same at every poll). `events` is how
    many logged events were re-checked (the session's log as it stood)."""

    guards: GuardConfig
    events: int
    divergence: Divergence | None


class SessionList(msgspec.Struct, frozen=True):
    """A page of the log's sessions, the most recently active first. `counts` (by status)
    and `total` count every session read so far, `matched` those the filter takes; pass
    `next_cursor` as `cursor` for the next page (null: no more). `indexing`: the service
    has not read the whole log yet, and reads on at each request. `live`: the service
    runs the sessions, which take messages, tool results, cancels and retries; otherwise
    it only reads the log `source` describes."""

    sessions: list[SessionSummary]
    next_cursor: str | None
    counts: dict[ListedStatus, int]
    total: int
    matched: int
    indexing: bool
    live: bool
    source: str


class SessionView(msgspec.Struct, frozen=True):
    """One session's summary, read from the log now; `live` and `source` as in a
    `SessionList`; `max_page` the most events a request for them may ask for."""

    session: SessionSummary
    live: bool
    source: str
    max_page: int


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
