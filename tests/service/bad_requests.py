"""Every kind of bad request, as a table run both in-process and against the real server.

Each case names a request, the 4xx it must get and the field the JSON error must name.
`{idle}` in a path is a finished session, `{waiting}` one waiting for tool results.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from tests.service.server_main import ASK_SPEC, LIMITS, LOOKUP_SPEC
from turnkeeper.service import ErrorBody

JSON = {"Content-Type": "application/json"}
SPEC = {"tools": [{"name": "lookup"}]}
PENDING_CALL = {
    "id": "call_open",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"key": "k"}'},
}


class BadRequest(NamedTuple):
    name: str
    method: str
    path: str
    status: int
    field: str | None
    body: Any = None
    content: bytes | None = None
    headers: dict[str, str] = JSON
    chunked: bool = False
    message: str | None = None
    """Words the error message must hold, when the status and field alone do not tell."""


TOO_LARGE = b'{"prompt": "' + b"x" * (LIMITS.max_body_bytes + 10) + b'"}'

CASES = [
    BadRequest("bad JSON", "POST", "/v1/sessions", 400, "body", content=b'{"prompt": '),
    BadRequest("not UTF-8", "POST", "/v1/sessions", 400, "body", content=b'{"prompt": "\xff"}'),
    BadRequest("empty body", "POST", "/v1/sessions", 400, "body", content=b""),
    # msgspec finds the wrong type first, then the JSON unfinished.
    BadRequest("an unfinished array", "POST", "/v1/sessions", 400, "body", content=b"["),
    BadRequest(
        "a wrong type, unfinished",
        "POST",
        "/v1/sessions",
        400,
        "body",
        content=b'{"prompt": 5, ',
        message="not valid JSON",
    ),
    BadRequest(
        "a wrong type, then a lone surrogate",
        "POST",
        "/v1/sessions",
        422,
        "system_prompt",
        content=b'{"prompt": 5, "system_prompt": "\\udc00"}',
        message="system_prompt: holds a lone surrogate",
    ),
    BadRequest(
        "lone high surrogate",
        "POST",
        "/v1/sessions",
        422,
        "prompt",
        content=b'{"prompt": "\\ud800"}',
        message="prompt: holds a lone surrogate",
    ),
    BadRequest(
        "lone low surrogate deep in the body",
        "POST",
        "/v1/sessions",
        422,
        "spec.tools[1].description",
        content=b'{"spec": {"tools": [{"name": "a"}, {"name": "b", "description": "x\\udc00"}]}}',
        message="spec.tools[1].description: holds a lone surrogate",
    ),
    BadRequest(
        "lone surrogate in a key",
        "POST",
        "/v1/sessions",
        422,
        "history[0]",
        content=b'{"history": [{"role": "user", "\\ud83dx": 1}]}',
        message="history[0]: has a key that holds a lone surrogate",
    ),
    BadRequest(
        "lone surrogate and bad JSON",
        "POST",
        "/v1/sessions",
        400,
        "body",
        content=b'{"prompt": "\\ud800", ',
        message="not valid JSON",
    ),
    BadRequest(
        "deep JSON",
        "POST",
        "/v1/sessions",
        400,
        "body",
        content=b'{"history": [{"content": ' + b"[" * 20_000 + b"]" * 20_000 + b"}]}",
    ),
    BadRequest(
        "JSON deeper than the limit",
        "POST",
        "/v1/sessions",
        400,
        "body",
        # It decodes: only the depth is wrong.
        content=b'{"history": [{"role": "user", "content": "hi", "x": '
        + b"[" * 200
        + b"]" * 200
        + b"}]}",
    ),
    BadRequest("array body", "POST", "/v1/sessions", 422, "body", body=["prompt"]),
    BadRequest("wrong type", "POST", "/v1/sessions", 422, "prompt", body={"prompt": 5}),
    BadRequest("unknown field", "POST", "/v1/sessions", 422, "promt", body={"promt": "x"}),
    BadRequest(
        "wrong nested type",
        "POST",
        "/v1/sessions",
        422,
        "spec.tools",
        body={"spec": {"tools": "lookup"}},
    ),
    BadRequest(
        "bad tool name",
        "POST",
        "/v1/sessions",
        422,
        "spec.tools[0].name",
        body={"spec": {"tools": [{"name": "no spaces"}]}, "prompt": "x"},
    ),
    BadRequest(
        "terminal tool not a tool",
        "POST",
        "/v1/sessions",
        422,
        "spec.terminal_tool",
        body={"spec": {**SPEC, "terminal_tool": "done"}, "prompt": "x"},
    ),
    BadRequest("max_turns 0", "POST", "/v1/sessions", 422, "max_turns", body={"max_turns": 0}),
    BadRequest(
        "unknown field in the spec",
        "POST",
        "/v1/sessions",
        422,
        "spec.system_promt",
        body={"spec": {"system_promt": "Be terse."}},
    ),
    BadRequest(
        "unknown field in a tool",
        "POST",
        "/v1/sessions",
        422,
        "spec.tools[0].input_shema",
        body={"spec": {"tools": [{"name": "lookup", "input_shema": {"type": "object"}}]}},
    ),
    BadRequest(
        "unknown field in a guard",
        "POST",
        "/v1/sessions",
        422,
        "guards.loop.warning",
        body={"guards": {"loop": {"warning": 2}}},
    ),
    BadRequest(
        "guard setting out of range",
        "POST",
        "/v1/sessions",
        422,
        "guards.small_model.window_turns",
        body={"guards": {"small_model": {"window_turns": -1}}, "prompt": "x"},
    ),
    BadRequest(
        "budget out of range",
        "POST",
        "/v1/sessions",
        422,
        "guards.budget.max_tokens",
        body={"guards": {"budget": {"max_tokens": 0}}, "prompt": "x"},
    ),
    BadRequest(
        "sampling param out of range",
        "POST",
        "/v1/sessions",
        422,
        "spec.temperature",
        body={"spec": {"temperature": 5}, "prompt": "x"},
    ),
    BadRequest(
        "unusable tool schema",
        "POST",
        "/v1/sessions",
        422,
        "spec.tools[1].input_schema",
        body={"spec": {"tools": [{"name": "a"}, {"name": "b", "input_schema": {"type": "foo"}}]}},
    ),
    BadRequest(
        "unusable output schema",
        "POST",
        "/v1/sessions",
        422,
        "spec.output_schema",
        body={"spec": {"output_schema": {"type": "objekt"}}, "prompt": "x"},
        message="spec.output_schema: the schema cannot be used: $: the output schema is invalid",
    ),
    BadRequest(
        "output schema in a circle",
        "POST",
        "/v1/sessions",
        422,
        "spec.output_schema",
        body={"spec": {"output_schema": {"allOf": [{"$ref": "#"}]}}, "prompt": "x"},
        message="leads back to itself",
    ),
    BadRequest(
        "output schema not an object",
        "POST",
        "/v1/sessions",
        422,
        "spec.output_schema",
        body={"spec": {"output_schema": "Weather"}, "prompt": "x"},
    ),
    BadRequest(
        "output schema beside a terminal tool",
        "POST",
        "/v1/sessions",
        422,
        "spec.output_schema",
        body={
            "spec": {**SPEC, "terminal_tool": "lookup", "output_schema": {"type": "object"}},
            "prompt": "x",
        },
        message="give a spec an output_schema or a terminal_tool, not both",
    ),
    BadRequest(
        "number out of range",
        "POST",
        "/v1/sessions",
        422,
        "max_turns",
        content=b'{"max_turns": 1e400}',
    ),
    BadRequest(
        "unsafe session id", "POST", "/v1/sessions", 422, "session_id", body={"session_id": "a/b"}
    ),
    # Clients drop the path segments `.` and `..`: such a session could not be addressed.
    BadRequest("session id .", "POST", "/v1/sessions", 422, "session_id", body={"session_id": "."}),
    BadRequest(
        "session id ..", "POST", "/v1/sessions", 422, "session_id", body={"session_id": ".."}
    ),
    BadRequest(
        "session id with a leading dot",
        "POST",
        "/v1/sessions",
        422,
        "session_id",
        body={"session_id": ".hidden"},
    ),
    BadRequest(
        "session id with a leading dash",
        "POST",
        "/v1/sessions",
        422,
        "session_id",
        body={"session_id": "-x"},
    ),
    BadRequest(
        "session id too long",
        "POST",
        "/v1/sessions",
        422,
        "session_id",
        body={"session_id": "x" * 201},
    ),
    BadRequest(
        "session id ending in a newline",
        "POST",
        "/v1/sessions",
        422,
        "session_id",
        body={"session_id": "abc\n"},
    ),
    BadRequest(
        "session id taken", "POST", "/v1/sessions", 409, "session_id", body={"session_id": "{idle}"}
    ),
    BadRequest(
        "history not messages",
        "POST",
        "/v1/sessions",
        422,
        "history[0]",
        body={"history": ["hello"]},
    ),
    BadRequest(
        "history bad role",
        "POST",
        "/v1/sessions",
        422,
        "history[0].role",
        body={"history": [{"role": "wizard", "content": "hi"}]},
    ),
    BadRequest(
        "history content not text or parts",
        "POST",
        "/v1/sessions",
        422,
        "history[0].content",
        body={"history": [{"role": "user", "content": {"text": "hi"}}]},
    ),
    BadRequest(
        "a prompt after a history whose tool call has no result",
        "POST",
        "/v1/sessions",
        422,
        "prompt",
        body={
            "history": [
                {"role": "user", "content": "look it up"},
                {"role": "assistant", "content": None, "tool_calls": [PENDING_CALL]},
            ],
            "prompt": "and then?",
            "session_id": "never-made",
        },
    ),
    BadRequest(
        "history too long",
        "POST",
        "/v1/sessions",
        422,
        "history",
        body={"history": [{"role": "user", "content": "hi"}] * (LIMITS.max_history_messages + 1)},
    ),
    BadRequest(
        "guards need a terminal tool",
        "POST",
        "/v1/sessions",
        422,
        "guards.terminal.required",
        body={"guards": {"terminal": {"required": True}}, "prompt": "x"},
    ),
    BadRequest(
        "prompt too long",
        "POST",
        "/v1/sessions",
        422,
        "prompt",
        body={"prompt": "x" * (LIMITS.max_text_chars + 1)},
    ),
    BadRequest("body too large", "POST", "/v1/sessions", 413, "body", content=TOO_LARGE),
    BadRequest(
        "chunked body too large",
        "POST",
        "/v1/sessions",
        413,
        "body",
        content=TOO_LARGE,
        chunked=True,
    ),
    BadRequest(
        "wrong content type",
        "POST",
        "/v1/sessions",
        415,
        "Content-Type",
        content=b'{"prompt": "x"}',
        headers={"Content-Type": "text/plain"},
    ),
    BadRequest(
        "no content type",
        "POST",
        "/v1/sessions/{idle}/messages",
        415,
        "Content-Type",
        content=b'{"text": "x"}',
        headers={},
    ),
    BadRequest(
        "message missing text", "POST", "/v1/sessions/{idle}/messages", 422, "text", body={}
    ),
    BadRequest(
        "message text not a string",
        "POST",
        "/v1/sessions/{idle}/messages",
        422,
        "text",
        body={"text": ["hi"]},
    ),
    BadRequest(
        "message too long",
        "POST",
        "/v1/sessions/{idle}/messages",
        422,
        "text",
        body={"text": "x" * (LIMITS.max_text_chars + 1)},
    ),
    BadRequest(
        "message while tools are pending",
        "POST",
        "/v1/sessions/{waiting}/messages",
        409,
        None,
        body={"text": "hi"},
    ),
    BadRequest(
        "message to unknown session",
        "POST",
        "/v1/sessions/nope/messages",
        404,
        "session_id",
        body={"text": "hi"},
    ),
    BadRequest(
        "results missing",
        "POST",
        "/v1/sessions/{waiting}/tool_results",
        422,
        "results",
        body={},
    ),
    BadRequest(
        "result missing its id",
        "POST",
        "/v1/sessions/{waiting}/tool_results",
        422,
        "results[0].tool_use_id",
        body={"results": [{"text": "yes"}]},
    ),
    BadRequest(
        "unknown field in a result",
        "POST",
        "/v1/sessions/{waiting}/tool_results",
        422,
        "results[0].is_eror",
        body={"results": [{"tool_use_id": "x", "text": "no", "is_eror": True}]},
    ),
    BadRequest(
        "result for an unknown call",
        "POST",
        "/v1/sessions/{waiting}/tool_results",
        422,
        "results",
        body={"results": [{"tool_use_id": "call_nope", "text": "yes"}]},
    ),
    BadRequest(
        "no result for a pending call",
        "POST",
        "/v1/sessions/{waiting}/tool_results",
        422,
        "results",
        body={"results": []},
    ),
    BadRequest(
        "result too long",
        "POST",
        "/v1/sessions/{waiting}/tool_results",
        422,
        "results[0].text",
        body={"results": [{"tool_use_id": "x", "text": "x" * (LIMITS.max_tool_result_chars + 1)}]},
    ),
    BadRequest(
        "results for a session not waiting",
        "POST",
        "/v1/sessions/{idle}/tool_results",
        409,
        None,
        body={"results": [{"tool_use_id": "x", "text": "yes"}]},
    ),
    BadRequest(
        "results for an unknown session",
        "POST",
        "/v1/sessions/nope/tool_results",
        404,
        "session_id",
        body={"results": []},
    ),
    BadRequest("cancel unknown session", "POST", "/v1/sessions/nope/cancel", 404, "session_id"),
    BadRequest("get unknown session", "GET", "/v1/sessions/nope", 404, "session_id"),
    BadRequest("events of unknown session", "GET", "/v1/sessions/nope/events", 404, "session_id"),
    BadRequest(
        "stream of unknown session", "GET", "/v1/sessions/nope/events/stream", 404, "session_id"
    ),
    BadRequest("negative after", "GET", "/v1/sessions/{idle}/events?after=-1", 422, "after"),
    BadRequest("after not a number", "GET", "/v1/sessions/{idle}/events?after=x", 422, "after"),
    BadRequest(
        "after past 2**63 - 1",
        "GET",
        "/v1/sessions/{idle}/events?after=9223372036854775808",
        422,
        "after",
    ),
    BadRequest("wait not a number", "GET", "/v1/sessions/{idle}/events?wait=soon", 422, "wait"),
    BadRequest("wait not finite", "GET", "/v1/sessions/{idle}?wait=nan", 422, "wait"),
    BadRequest("negative wait", "GET", "/v1/sessions/{idle}?wait=-1", 422, "wait"),
    BadRequest("wait with a digit separator", "GET", "/v1/sessions/{idle}?wait=1_0", 422, "wait"),
    BadRequest("wait with a space", "GET", "/v1/sessions/{idle}?wait=%201", 422, "wait"),
    BadRequest("wait infinite", "GET", "/v1/sessions/{idle}?wait=infinity", 422, "wait"),
    BadRequest("limit 0", "GET", "/v1/sessions?limit=0", 422, "limit"),
    BadRequest("limit over the page size", "GET", "/v1/sessions?limit=100000", 422, "limit"),
    BadRequest("unknown cursor", "GET", "/v1/sessions?cursor=nope", 422, "cursor"),
    BadRequest(
        "bad Last-Event-ID",
        "GET",
        "/v1/sessions/{idle}/events/stream",
        422,
        "Last-Event-ID",
        headers={"Last-Event-ID": "seven"},
    ),
    BadRequest("no such route", "GET", "/v1/nothing", 404, None),
    BadRequest("method not allowed", "DELETE", "/v1/sessions", 405, None),
]


def setup_bodies() -> tuple[dict[str, Any], dict[str, Any]]:
    """Bodies creating the idle session and the one waiting for tool results."""
    idle = {"spec": msgspec.to_builtins(LOOKUP_SPEC), "prompt": "setup"}
    waiting = {"spec": msgspec.to_builtins(ASK_SPEC), "prompt": "setup"}
    return idle, waiting


def case_body(case: BadRequest, *, idle: str) -> bytes | None:
    """The bytes the case sends, `{idle}` in its JSON body filled in."""
    if case.body is None:
        return case.content
    return msgspec.json.encode(case.body).replace(b"{idle}", idle.encode())


def check_error(case: BadRequest, status: int, body: bytes) -> None:
    """The response is the case's status with a JSON error naming its field."""
    assert status == case.status, f"{case.name}: {status} {body[:300]!r}"
    error = msgspec.json.decode(body, type=ErrorBody).error
    assert error.field == case.field, f"{case.name}: field {error.field!r} ({error.message})"
    assert error.message
    if case.message is not None:
        assert case.message in error.message, f"{case.name}: {error.message}"
    assert "Traceback" not in error.message
    # No error names a session that was never made.
    assert "never-made" not in error.message
