"""The OpenAPI 3.1 document of the service, served at /v1/openapi.json."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import msgspec

from turnkeeper.logs import LARGEST_SEQ
from turnkeeper.service._limits import Limits
from turnkeeper.service._schemas import (
    Created,
    CreateSession,
    ErrorBody,
    EventPage,
    Health,
    PostMessage,
    PostToolResults,
    SessionPage,
)
from turnkeeper.sessions import SessionInfo

_REF = "#/components/schemas/{name}"

_SESSION_ID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The session's id.",
}


def openapi_document(limits: Limits) -> dict[str, Any]:
    """The document: every route with its parameters, bodies, responses and auth."""
    _, schemas = msgspec.json.schema_components(
        [
            CreateSession,
            Created,
            PostMessage,
            PostToolResults,
            SessionInfo,
            SessionPage,
            EventPage,
            Health,
            ErrorBody,
        ],
        ref_template=_REF,
    )
    wait = {
        "name": "wait",
        "in": "query",
        "schema": {"type": "number", "minimum": 0, "default": 0},
        "description": f"Seconds to wait; more than {limits.max_wait_seconds:g} is cut to that.",
    }
    after = {
        "name": "after",
        "in": "query",
        "schema": {"type": "integer", "minimum": 0, "maximum": LARGEST_SEQ, "default": 0},
        "description": "Return the events with seq greater than this.",
    }
    limit = {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": limits.max_page, "default": 100},
        "description": "The most items in one page.",
    }
    body_limits = (
        f"Bodies are JSON (`Content-Type: application/json`) of at most {limits.max_body_bytes} "
        f"bytes, sent in full within {limits.body_timeout_seconds:g} seconds; prompts and "
        f"messages at most {limits.max_text_chars} characters"
    )
    health = _operation(
        "health",
        "Whether the service takes work (no token needed)",
        ok=("200", "Serving", Health),
        errors=(),
        public=True,
    )
    health["responses"]["503"] = {
        "description": "The service is stopping",
        "content": _json(Health),
    }
    paths: dict[str, Any] = {
        "/v1/sessions": {
            "post": _operation(
                "createSession",
                "Open a session and start it on a prompt",
                f"{body_limits}; a history at most {limits.max_history_messages} messages.",
                body=CreateSession,
                ok=("201", "The session is open and logged", Created),
                errors=(400, 401, 408, 409, 413, 415, 422, 503),
            ),
            "get": _operation(
                "listSessions",
                "List sessions, oldest first, a page at a time",
                parameters=[
                    limit,
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "The `next_cursor` of the previous page.",
                    },
                ],
                ok=("200", "A page of sessions", SessionPage),
                errors=(401, 422),
            ),
        },
        "/v1/sessions/{session_id}": {
            "get": _operation(
                "getSession",
                "A session's status, pending tool calls, answer, result and usage",
                "With `wait`, answers once the session is no longer running (or the wait is up).",
                parameters=[_SESSION_ID, wait],
                ok=("200", "The session", SessionInfo),
                errors=(401, 404, 422),
            )
        },
        "/v1/sessions/{session_id}/messages": {
            "post": _operation(
                "postMessage",
                "Send a user message",
                f"{body_limits}. Queued; it starts a new request episode when the session "
                "is free. Refused (409) while the session waits for tool results.",
                parameters=[_SESSION_ID],
                body=PostMessage,
                ok=("202", "The message is queued", SessionInfo),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 429, 503),
            )
        },
        "/v1/sessions/{session_id}/tool_results": {
            "post": _operation(
                "postToolResults",
                "Answer the tool calls a session waits on",
                f"{body_limits}; each result text at most {limits.max_tool_result_chars} "
                "characters. One result per pending call, no more, no less.",
                parameters=[_SESSION_ID],
                body=PostToolResults,
                ok=("202", "The results are logged; the session goes on", SessionInfo),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/cancel": {
            "post": _operation(
                "cancelSession",
                "Stop a session's work now and mark it cancelled",
                parameters=[_SESSION_ID],
                ok=("200", "The session, cancelled", SessionInfo),
                errors=(401, 404, 503),
            )
        },
        "/v1/sessions/{session_id}/events": {
            "get": _operation(
                "listEvents",
                "A session's events after a seq (long-poll)",
                "When there are none yet, waits up to `wait` seconds for one.",
                parameters=[_SESSION_ID, after, wait, limit],
                ok=("200", "Events in seq order", EventPage),
                errors=(401, 404, 422),
            )
        },
        "/v1/sessions/{session_id}/events/stream": {
            "get": _operation(
                "streamEvents",
                "A session's events as Server-Sent Events",
                "Each event has `id:` its seq, `event:` its type and `data:` the envelope "
                "JSON. Reconnect with `Last-Event-ID` (or `after`) to resume with no event "
                "lost or repeated. Comment lines (`: ping`) keep an idle stream open.",
                parameters=[
                    _SESSION_ID,
                    after,
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "schema": {"type": "integer", "minimum": 0, "maximum": LARGEST_SEQ},
                        "description": "The seq of the last event received; wins over `after`.",
                    },
                ],
                ok=("200", "An endless event stream", None, "text/event-stream"),
                errors=(401, 404, 422),
            )
        },
        "/v1/healthz": {"get": health},
        "/v1/metrics": {
            "get": _operation(
                "metrics",
                "Prometheus metrics",
                "Sessions by status, model calls, retries, chat errors, guard halts, tool "
                "errors, session crashes and log append latency.",
                ok=("200", "Prometheus text exposition 0.0.4", None, "text/plain"),
                errors=(401,),
            )
        },
        "/v1/openapi.json": {
            "get": _operation(
                "openapi",
                "This document",
                ok=("200", "The OpenAPI document", None, "application/json"),
                errors=(401,),
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "turnkeeper",
            "version": version("turnkeeper"),
            "description": "Drive supervised LLM tool-calling sessions over HTTP.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


_ERRORS = {
    400: "The body is not JSON",
    401: "No token, another scheme, or a wrong token",
    404: "No such session (or route)",
    408: "The body did not arrive in full in time; the connection is closed",
    409: "The session is not in a state that allows this",
    413: "The body is too large",
    415: "The body is not `application/json`",
    422: "A field, parameter or header has the wrong type or value, is missing or unknown, "
    "or is over a limit",
    429: "The session's mailbox is full; retry after `Retry-After` seconds",
    503: "The service is stopping",
}


def _operation(
    operation_id: str,
    summary: str,
    description: str | None = None,
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: type[msgspec.Struct] | None = None,
    ok: tuple[str, str, type[msgspec.Struct] | None]
    | tuple[str, str, type[msgspec.Struct] | None, str],
    errors: tuple[int, ...],
    public: bool = False,
) -> dict[str, Any]:
    status, what, schema, *media = ok
    content = _json(schema) if schema is not None else {media[0]: {"schema": {"type": "string"}}}
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "responses": {status: {"description": what, "content": content}},
    }
    if description is not None:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {"required": True, "content": _json(body)}
    for code in errors:
        response: dict[str, Any] = {"description": _ERRORS[code], "content": _json(ErrorBody)}
        if code == 429:
            response["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
        operation["responses"][str(code)] = response
    if public:
        operation["security"] = []
    return operation


def _json(struct: type[msgspec.Struct]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(struct)}}


def _ref(struct: type[msgspec.Struct]) -> dict[str, str]:
    return {"$ref": _REF.format(name=struct.__name__)}
