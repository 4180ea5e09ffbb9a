"""The OpenAPI 3.1 document of the service, served at /v1/openapi.json.

Its schemas are generated (`msgspec.json.schema_components`) from the types the handlers
decode and encode. A request body's types are also the event log's, which must read what
older versions wrote, so the checks the service makes of new input beyond their types
(`check_spec`, `check_guards`, the core types' own checks, the transcript check, and the
service's limits) are added to the request side's copies (`<Type>Input`) by
`_request_rules`; the response side is as the types give it. tests/service/
test_schemathesis.py drives the running server from this document and fails where the
two disagree.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import msgspec

from turnkeeper.core import MAX_AMOUNT, MAX_SETTING
from turnkeeper.events import TokenDelta
from turnkeeper.logs import LARGEST_SEQ
from turnkeeper.service._limits import Limits
from turnkeeper.service._schemas import (
    Created,
    CreateSession,
    ErrorBody,
    EventPage,
    ForkSession,
    Health,
    PostApprovals,
    PostMessage,
    PostToolResults,
    Recheck,
    RecheckRequest,
    SessionList,
    SessionPage,
    SessionView,
)
from turnkeeper.service._sse import DELTA_EVENT
from turnkeeper.service._summary import LISTED_STATUSES
from turnkeeper.sessions import SessionInfo

_REF = "#/components/schemas/{name}"
_BODIES = (
    CreateSession,
    PostMessage,
    PostToolResults,
    PostApprovals,
    RecheckRequest,
    ForkSession,
)
_RESPONSES = (
    Created,
    SessionInfo,
    SessionPage,
    EventPage,
    Health,
    ErrorBody,
    Recheck,
    SessionList,
    SessionView,
    TokenDelta,
)
_INPUT = "Input"

# Tool and MCP server names. `(?!\n)`: read by Python (jsonschema), `$` also matches
# before a last newline, where JSON Schema's does not.
_NAME = r"^[A-Za-z0-9_.\-]{1,64}$(?!\n)"
_INT64 = {"minimum": -(2**63), "maximum": 2**63 - 1}
_SECONDS = {"exclusiveMinimum": 0, "maximum": MAX_SETTING}
# Prices: at most MAX_DECIMALS decimal places too, which a schema cannot say.
_PRICE = {"minimum": 0, "maximum": MAX_AMOUNT}

_HISTORY_MESSAGE: dict[str, Any] = {
    "title": "HistoryMessage",
    "description": "A chat-completions message of a prior transcript, kept verbatim. A `tool` "
    "message's `tool_call_id` must answer a call of an earlier assistant message, and the "
    "calls of one message have ids of their own.",
    "type": "object",
    "properties": {
        "role": {"enum": ["system", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"type": {"type": "string"}},
                        "required": ["type"],
                    },
                },
                {"type": "null"},
            ]
        },
        "tool_calls": {
            "anyOf": [
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "function": {
                                "type": "object",
                                "properties": {"name": {"type": "string"}},
                                "required": ["name"],
                            },
                        },
                        "required": ["id", "function"],
                    },
                },
                {"type": "null"},
            ]
        },
    },
    "required": ["role"],
}


_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
    "description": "On a fleet of workers (a PostgreSQL log), the request is done once per "
    "key, on whichever worker it is sent to, and sent again it is answered as the first "
    "was; a single service on SQLite ignores it.",
}


def openapi_document(limits: Limits) -> dict[str, Any]:
    """The document: every route with its parameters, bodies, responses and auth."""
    _, schemas = msgspec.json.schema_components(_RESPONSES, ref_template=_REF)
    _, requests = msgspec.json.schema_components(_BODIES, ref_template=_REF + _INPUT)
    for name, schema in requests.items():
        schemas[_request_name(name)] = _request_schema(name, schema, limits)
    schemas["HistoryMessage"] = _HISTORY_MESSAGE
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
        f"bytes, sent in full within {limits.body_timeout_seconds:g} seconds"
    )
    health = _operation(
        "health",
        "Whether the service takes work (no token needed)",
        ok=("200", "Serving", _json(Health)),
        errors=(),
        public=True,
    )
    stopping = {"description": "The service is stopping", "content": _json(Health)}
    health["responses"]["503"] = stopping
    created = _operation(
        "createSession",
        "Open a session and start it on a prompt",
        f"{body_limits}. A spec's `terminal_tool` must be one of its tools, which have names "
        "of their own and an `input_schema` that can check arguments; a tool's `mcp_server` "
        "must be one of the spec's `mcp_servers`; `guards.terminal.required` needs a "
        "`terminal_tool`; and a `prompt` cannot follow a `history` that ends in tool calls "
        "with no results. A request that breaks one of these is refused (422) naming the field.",
        parameters=[_IDEMPOTENCY_KEY],
        body=CreateSession,
        ok=("201", "The session is open and logged", _json(Created)),
        errors=(400, 401, 408, 409, 413, 415, 422, 503),
    )
    created["responses"]["201"]["links"] = {
        name: {"operationId": operation, "parameters": {"session_id": "$response.body#/session_id"}}
        for name, operation in [
            ("GetSession", "getSession"),
            ("PostMessage", "postMessage"),
            ("PostToolResults", "postToolResults"),
            ("PostApprovals", "postApprovals"),
            ("CancelSession", "cancelSession"),
            ("RetrySession", "retrySession"),
            ("ForkSession", "forkSession"),
            ("RecheckSession", "recheckSession"),
            ("InspectSession", "inspectSession"),
            ("ListEvents", "listEvents"),
            ("StreamEvents", "streamEvents"),
        ]
    }
    paths: dict[str, Any] = {
        "/v1/sessions": {
            "post": created,
            "get": _operation(
                "listSessions",
                "List sessions, oldest first, a page at a time",
                "Sessions the log holds but cannot rebuild are listed with status "
                "`unreadable` and `error` saying why.",
                parameters=[
                    limit,
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string", "minLength": 1},
                        "description": "The `next_cursor` of the previous page; any other "
                        "value is refused (422).",
                    },
                ],
                ok=("200", "A page of sessions", _json(SessionPage)),
                errors=(401, 422, 503),
            ),
        },
        "/v1/sessions/{session_id}": {
            "get": _operation(
                "getSession",
                "A session's status, pending tool calls, answer, result and usage",
                "With `wait`, answers once the session is no longer running (or the wait is "
                "up). A session whose events in the log cannot be rebuilt (none, a gap in "
                "their seqs, a damaged row) is quarantined: its status is `unreadable`, "
                "`error` says what is wrong, and every action on it is refused (409).",
                parameters=[_SESSION_ID, wait],
                ok=("200", "The session", _json(SessionInfo)),
                errors=(401, 404, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/messages": {
            "post": _operation(
                "postMessage",
                "Send a user message",
                f"{body_limits}. Queued; it starts a new request episode when the session "
                "is free. Refused (409) while the session waits for tool results or approval.",
                parameters=[_SESSION_ID, _IDEMPOTENCY_KEY],
                body=PostMessage,
                ok=("202", "The message is queued", _json(SessionInfo)),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 429, 503),
            )
        },
        "/v1/sessions/{session_id}/tool_results": {
            "post": _operation(
                "postToolResults",
                "Answer the tool calls a session waits on",
                f"{body_limits}. One result per pending call, no more, no less: other "
                "results are refused (422, naming `results`), and so are results for a "
                "session that waits on none (409).",
                parameters=[_SESSION_ID, _IDEMPOTENCY_KEY],
                body=PostToolResults,
                ok=("202", "The results are logged; the session goes on", _json(SessionInfo)),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/approvals": {
            "post": _operation(
                "postApprovals",
                "Approve or deny tool calls awaiting approval",
                f"{body_limits}. A session is `awaiting_approval` when calls of the model's "
                "reply need approval (their tool's `approval` policy says so for their "
                "arguments): no call of that reply runs until each is decided. Decide some or "
                "all of its `awaiting` calls, by id; an approved call then runs (or waits for "
                "its result from outside), a denied one is answered with a tool error saying "
                "so (and `reason`, if given). Decisions on calls not awaiting approval, or two "
                "on one call, are refused (422, naming `decisions`), and so are decisions for a "
                "session awaiting none (409).",
                parameters=[_SESSION_ID, _IDEMPOTENCY_KEY],
                body=PostApprovals,
                ok=("202", "The decisions are logged; the session goes on", _json(SessionInfo)),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/cancel": {
            "post": _operation(
                "cancelSession",
                "Stop a session's work now and mark it cancelled",
                parameters=[_SESSION_ID, _IDEMPOTENCY_KEY],
                ok=("200", "The session, cancelled", _json(SessionInfo)),
                errors=(401, 404, 409, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/retry": {
            "post": _operation(
                "retrySession",
                "Make an errored session's failed model call again",
                "A session is `errored` when its model stayed unreachable after the retries; "
                "this makes the call again now (so does a new message). Of a session that is "
                "not errored it does nothing; a failed or cancelled one is refused (409).",
                parameters=[_SESSION_ID, _IDEMPOTENCY_KEY],
                ok=("200", "The session", _json(SessionInfo)),
                errors=(401, 404, 409, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/fork": {
            "post": _operation(
                "forkSession",
                "Start a new session as a fork of this one at a seq",
                f"{body_limits}. The new session's log begins as the first `at_seq` events "
                "of this session's (under the new id), then `local.forked`; it goes on from "
                "there on its own, and this session is not touched. `at_seq` must be one of "
                "the session's seqs that does not cut a step short (the guard events logged "
                "with a step follow it) and at which it is not cancelled or failed, else a "
                "422 names it; a `new_id` that exists is a 409.",
                parameters=[_SESSION_ID],
                body=ForkSession,
                ok=("201", "The new session", _json(SessionInfo)),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/recheck": {
            "post": _operation(
                "recheckSession",
                "What other guards would have done over the session's log (what-if)",
                f"{body_limits}. Re-derives the guards' events from the logged inputs and "
                "model responses under `guards`, without calling any model, and answers "
                "the first poll where they differ from the log's. With the session's own "
                "configuration this is a determinism check. A guard setting out of range is "
                "refused (422) naming it; a log that is not one session's is a 409.",
                parameters=[_SESSION_ID],
                body=RecheckRequest,
                ok=("200", "The re-check's answer", _json(Recheck)),
                errors=(400, 401, 404, 408, 409, 413, 415, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/events": {
            "get": _operation(
                "listEvents",
                "A session's events after a seq (long-poll)",
                "When there are none yet, waits up to `wait` seconds for one.",
                parameters=[_SESSION_ID, after, wait, limit],
                ok=("200", "Events in seq order", _json(EventPage)),
                errors=(401, 404, 409, 422, 503),
            )
        },
        "/v1/sessions/{session_id}/events/stream": {
            "get": _operation(
                "streamEvents",
                "A session's events as Server-Sent Events",
                "Each event has `id:` its seq, `event:` its type and `data:` the envelope "
                "(an `Envelope`) as JSON. Reconnect with `Last-Event-ID` (or `after`) to "
                "resume with no event lost or repeated. Comment lines (`: ping`) keep an idle "
                "stream open. The stream does not end until the client hangs up or the "
                "service stops. While it is open, each model call of the session that "
                "starts is streamed: the fragments of its reply come as `event: delta` "
                "with a `TokenDelta` as `data:` and no `id:` (they are not logged, and not "
                "sent again on a reconnect), all before the reply's `local.model_response`. "
                "A delta with a higher `attempt` (a retry) starts the reply's text over.",
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
                ok=("200", "The event stream", {"text/event-stream": {"schema": _SSE_EVENT}}),
                errors=(401, 404, 409, 422, 503),
            )
        },
        "/v1/inspector/sessions": {
            "get": _operation(
                "listInspectedSessions",
                "The log's sessions, the most recently active first, a page at a time",
                "What the inspector's list shows: each session's summary from its log, with "
                "counts by status. Filtered by `status` and by `search` (part of the id, any "
                "case). Each request reads on in the log for a moment; while `indexing` is "
                "true it has not read all of it.",
                parameters=[
                    {
                        "name": "status",
                        "in": "query",
                        "schema": {"enum": list(LISTED_STATUSES)},
                        "description": "Only the sessions with this status.",
                    },
                    {
                        "name": "search",
                        "in": "query",
                        "schema": {"type": "string", "maxLength": 200},
                        "description": "Only the sessions whose id holds this (any case).",
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": limits.max_page,
                            "default": 50,
                        },
                        "description": "The most sessions in one page.",
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                        "description": "The `next_cursor` of the previous page.",
                    },
                ],
                ok=("200", "A page of sessions", _json(SessionList)),
                errors=(401, 422, 503),
            )
        },
        "/v1/inspector/sessions/{session_id}": {
            "get": _operation(
                "inspectSession",
                "One session's summary, from its log",
                parameters=[_SESSION_ID],
                ok=("200", "The session's summary", _json(SessionView)),
                errors=(401, 404, 503),
            )
        },
        "/v1/healthz": {"get": health},
        "/v1/metrics": {
            "get": _operation(
                "metrics",
                "Prometheus metrics",
                "Sessions by status, model calls, retries, chat errors, guard halts, tool "
                "errors, session crashes and log append latency.",
                ok=(
                    "200",
                    "Prometheus text exposition 0.0.4",
                    {"text/plain": {"schema": {"type": "string"}}},
                ),
                errors=(401, 503),
            )
        },
        "/v1/openapi.json": {
            "get": _operation(
                "openapi",
                "This document",
                ok=(
                    "200",
                    "The OpenAPI 3.1 document",
                    {"application/json": {"schema": {"type": "object"}}},
                ),
                errors=(401,),
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "turnkeeper",
            "version": version("turnkeeper"),
            "description": "Drive supervised LLM tool-calling sessions over HTTP. A "
            "connection that takes more than "
            f"{limits.header_timeout_seconds:g} seconds to send a request's headers, or "
            "stays idle that long between requests, is closed.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


# Each event of the stream, as Open API 3.2's `itemSchema` gives a text/event-stream (and
# tools read `schema` there before 3.2): a logged event, or a delta of a reply.
_SSE_LOGGED = {
    "type": "object",
    "description": "A logged event: its seq, its type and its envelope.",
    "properties": {
        "id": {"type": "string", "pattern": "^[1-9][0-9]*$", "description": "Its seq."},
        "event": {"type": "string", "description": "Its type."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": _REF.format(name="Envelope")},
            "description": "The envelope, as JSON.",
        },
    },
    "required": ["id", "event", "data"],
}
_SSE_DELTA = {
    "type": "object",
    "description": "A fragment of a model reply as it streams in (never logged, so no id).",
    "properties": {
        "event": {"const": DELTA_EVENT},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": _REF.format(name="TokenDelta")},
            "description": "The delta, as JSON.",
        },
    },
    "required": ["event", "data"],
}
_SSE_EVENT = {
    "description": "One event of the stream (its fields as an object; comments are not events).",
    "oneOf": [_SSE_LOGGED, _SSE_DELTA],
}

_SESSION_ID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
    "description": "The session's id.",
}


def _request_name(name: str) -> str:
    """The component name of a request body's type: a nested one gets `Input` after it,
    apart from the type of the same name that responses use."""
    return name if name in {body.__name__ for body in _BODIES} else name + _INPUT


def _request_schema(name: str, schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """`schema`, a request body's type or one inside it, with what the service checks
    beyond the type: no unknown fields anywhere, and the rules of `_request_rules`."""
    schema = {**schema, "title": _request_name(name), "additionalProperties": False}
    properties = schema["properties"] = dict(schema["properties"])
    rules = _request_rules(limits).get(name, {})
    for field, rule in rules.items():
        if field == "":
            schema.update(rule)
        else:
            properties[field] = _narrowed(properties[field], rule)
    return schema


def _narrowed(schema: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    """`schema` with `rule` added to it, or to each of its `anyOf` branches but `null`."""
    if "anyOf" not in schema:
        return {**schema, **rule}
    branches = [
        branch if branch.get("type") == "null" else {**branch, **rule} for branch in schema["anyOf"]
    ]
    return {**schema, "anyOf": branches}


def _request_rules(limits: Limits) -> dict[str, dict[str, dict[str, Any]]]:
    """By type and field (`""` for the object), the checks of new input its schema does not
    state on its own."""
    return {
        "CreateSession": {
            "prompt": {"maxLength": limits.max_text_chars},
            "history": {
                "maxItems": limits.max_history_messages,
                "items": {"$ref": _REF.format(name="HistoryMessage")},
            },
        },
        "PostMessage": {"text": {"maxLength": limits.max_text_chars}},
        "ForkSession": {"at_seq": {"maximum": LARGEST_SEQ}},
        "ToolResult": {"text": {"maxLength": limits.max_tool_result_chars}},
        "ToolSpec": {
            "name": {"pattern": _NAME},
            "approval": {
                "description": "Whether a call must be approved before it runs: `never`, "
                "`always`, or a JSON Schema of the arguments (a call whose arguments match it "
                "needs approval; one that cannot be used is refused, 422). A schema rather "
                "than code: the spec is logged, and replay must reach the same answer."
            },
            "timeout": {
                **_SECONDS,
                "description": "Seconds a call of this tool may take when the service runs "
                "it; null: the service's tool timeout.",
            },
        },
        "PostApprovals": {"decisions": {"minItems": 1}},
        "ApprovalDecision": {"reason": {"maxLength": limits.max_text_chars}},
        "AgentSpec": {
            "output_schema": {
                "description": "A JSON Schema the final answer must match: the answer is then "
                "JSON, and the session's `output` holds its value. An answer that does not "
                "match is sent back to the model to fix (`guards.output`), then ends the "
                "episode (`invalid_output`). One that cannot be used, or one beside a "
                "`terminal_tool`, is refused (422)."
            },
            "temperature": {"minimum": 0, "maximum": 2},
            "top_p": {"exclusiveMinimum": 0, "maximum": 1},
            "max_tokens": {"minimum": 1},
            "seed": _INT64,
        },
        "McpServer": {
            "": {
                "oneOf": [
                    {"properties": {"command": {"type": "string"}}, "required": ["command"]},
                    {"properties": {"url": {"type": "string"}}, "required": ["url"]},
                ]
            },
            "name": {"pattern": _NAME},
            "command": {"minLength": 1},
            "url": {"pattern": "^https?://"},
            "tool_prefix": {"pattern": r"^[A-Za-z0-9_.\-]{0,64}$(?!\n)"},
            "timeout": {"exclusiveMinimum": 0},
        },
        "ConsecutiveErrors": {"threshold": {"minimum": 1}},
        "LoopDetection": {"warnings": {"minimum": 0}},
        "SelfFeeding": {"max_links": {"minimum": 1}, "warnings": {"minimum": 0}},
        "TerminalTool": {"max_reprompts": {"minimum": 0}},
        "TypedOutput": {"max_reprompts": {"minimum": 0}},
        "Budget": {"max_tokens": {"minimum": 1}, "max_seconds": _SECONDS},
        "Pricing": {"input_per_million": _PRICE, "output_per_million": _PRICE},
        "CostBudget": {"max_cost": _SECONDS, "max_session_cost": _SECONDS},
        "SmallModel": {"window_turns": {"minimum": 1}, "max_result_chars": {"minimum": 1}},
        "Compaction": {
            "budget_tokens": {"minimum": 1},
            "keep_recent_turns": {"minimum": 1},
            "summary_tokens": {"minimum": 1},
        },
    }


_ERRORS = {
    400: "The body is not JSON",
    401: "No token, another scheme, or a wrong token",
    404: "No such session (or route)",
    408: "The body did not arrive in full in time; the connection is closed",
    409: "The session is not in a state that allows this (one that is `unreadable` allows "
    "nothing: the message says what is wrong with its log)",
    413: "The body is too large",
    415: "The body is not `application/json`",
    422: "A field, parameter or header has the wrong type or value, is missing or unknown, "
    "or is over a limit",
    429: "The session's mailbox is full; retry after `Retry-After` seconds",
    503: "The service is stopping, or its event log failed",
}


def _operation(
    operation_id: str,
    summary: str,
    description: str | None = None,
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: type[msgspec.Struct] | None = None,
    ok: tuple[str, str, dict[str, Any]],
    errors: tuple[int, ...],
    public: bool = False,
) -> dict[str, Any]:
    status, what, content = ok
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
    return {"application/json": {"schema": {"$ref": _REF.format(name=struct.__name__)}}}
