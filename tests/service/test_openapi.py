"""The OpenAPI document: every route of the app is in it and everything in it is a
route; its references resolve; and real responses match the schemas it documents."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from starlette.routing import Route

from tests.service.server_main import ASK_SPEC, LIMITS, LOOKUP_SPEC, chat, lookup
from turnkeeper.core import validate
from turnkeeper.service import create_app, openapi_document
from turnkeeper.sessions import Host

TOKEN = "openapi-token"
DOCUMENT = openapi_document(LIMITS)
METHODS = {"get", "post", "put", "patch", "delete"}
JSON = {"Content-Type": "application/json"}


def documented() -> set[tuple[str, str]]:
    return {
        (path, method.upper())
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in METHODS
    }


def refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                assert isinstance(value, str)
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


@pytest.mark.anyio
async def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    async with Host(chat=chat) as host:
        app = create_app(host, token=TOKEN, limits=LIMITS)
    served = {
        (route.path, method)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert len(served) == 17
    assert served == documented()


def test_path_parameters_auth_and_errors_are_documented() -> None:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"\{(\w+)\}", path)), (path, method)
            public = operation.get("security") == []
            assert public == (path == "/v1/healthz")
            assert ("401" in operation["responses"]) != public, (path, method)
            assert any(code.startswith("2") for code in operation["responses"])
            if "requestBody" in operation:
                assert {"400", "408", "413", "415", "422"} <= set(operation["responses"])
            # Everything but this document asks the host or its log, which can fail.
            assert ("503" in operation["responses"]) != (path == "/v1/openapi.json")


def test_the_document_is_an_object_and_the_stream_a_stream_of_envelopes_and_deltas() -> None:
    document = DOCUMENT["paths"]["/v1/openapi.json"]["get"]["responses"]["200"]["content"]
    assert document == {"application/json": {"schema": {"type": "object"}}}
    stream = DOCUMENT["paths"]["/v1/sessions/{session_id}/events/stream"]["get"]
    ((media, content),) = stream["responses"]["200"]["content"].items()
    assert media == "text/event-stream"
    logged, delta = content["schema"]["oneOf"]
    assert logged["required"] == ["id", "event", "data"]
    assert logged["properties"]["data"]["contentSchema"] == {
        "$ref": "#/components/schemas/Envelope"
    }
    # A delta of a reply: no id (not logged), its own event name and body.
    assert delta["required"] == ["event", "data"]
    assert delta["properties"]["event"] == {"const": "delta"}
    assert delta["properties"]["data"]["contentSchema"] == {
        "$ref": "#/components/schemas/TokenDelta"
    }
    token_delta = DOCUMENT["components"]["schemas"]["TokenDelta"]
    assert token_delta["properties"]["type"] == {"enum": ["delta"]}


def test_every_reference_resolves_to_a_component() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    found = set(refs(DOCUMENT))
    assert found
    for ref in found:
        prefix = "#/components/schemas/"
        assert ref.startswith(prefix)
        assert ref.removeprefix(prefix) in schemas, ref
    assert DOCUMENT["openapi"] == "3.1.0"
    msgspec.json.encode(DOCUMENT)


def test_the_schemas_tell_a_wrong_body_from_a_right_one() -> None:
    schema = DOCUMENT["paths"]["/v1/sessions/{session_id}"]["get"]["responses"]["200"]
    root = {**schema["content"]["application/json"]["schema"], "components": DOCUMENT["components"]}
    assert validate(root, {"session_id": "x", "status": "sleeping"}) != []


def check(response: httpx.Response, path: str, method: str) -> None:
    """The response body validates against the schema documented for its status."""
    operation = DOCUMENT["paths"][path][method]
    documented_response = operation["responses"][str(response.status_code)]
    schema = documented_response["content"]["application/json"]["schema"]
    root: dict[str, Any] = {**schema, "components": DOCUMENT["components"]}
    assert validate(root, response.json()) == [], (path, method, response.text)


@pytest.mark.anyio
async def test_responses_match_their_documented_schemas() -> None:
    async with Host(chat=chat, tools={"lookup": lookup}) as host:
        app = create_app(host, token=TOKEN, limits=LIMITS)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://service",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            served = await client.get("/v1/openapi.json")
            assert served.json() == msgspec.json.decode(msgspec.json.encode(DOCUMENT))

            spec = msgspec.to_builtins(ASK_SPEC)
            created = await client.post("/v1/sessions", json={"spec": spec, "prompt": "q"})
            assert created.status_code == 201
            check(created, "/v1/sessions", "post")
            session_id = created.json()["session_id"]
            one = "/v1/sessions/{session_id}"
            waiting = await client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
            assert waiting.json()["status"] == "requires_action"
            check(waiting, one, "get")
            call_id = waiting.json()["pending"][0]["id"]
            answered = await client.post(
                f"/v1/sessions/{session_id}/tool_results",
                json={"results": [{"tool_use_id": call_id, "text": "yes"}]},
            )
            check(answered, one + "/tool_results", "post")
            await client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
            message = await client.post(f"/v1/sessions/{session_id}/messages", json={"text": "m"})
            check(message, one + "/messages", "post")
            events = await client.get(f"/v1/sessions/{session_id}/events")
            assert len(events.json()["events"]) > 5
            check(events, one + "/events", "get")
            other = await client.post(
                "/v1/sessions", json={"spec": msgspec.to_builtins(LOOKUP_SPEC), "prompt": "p"}
            )
            cancelled = await client.post(f"/v1/sessions/{other.json()['session_id']}/cancel")
            check(cancelled, one + "/cancel", "post")
            listing = await client.get("/v1/sessions", params={"limit": 1})
            assert listing.json()["next_cursor"] is not None
            check(listing, "/v1/sessions", "get")
            check(await client.get("/v1/healthz"), "/v1/healthz", "get")
            for response, path, method in [
                (await client.get("/v1/sessions/nope"), one, "get"),
                (
                    await client.post("/v1/sessions", content=b"{", headers=JSON),
                    "/v1/sessions",
                    "post",
                ),
                (
                    await client.post("/v1/sessions", json={"max_turns": "x"}),
                    "/v1/sessions",
                    "post",
                ),
                (
                    await client.get("/v1/sessions/x/events", headers={"Authorization": ""}),
                    one + "/events",
                    "get",
                ),
            ]:
                assert response.status_code >= 400
                check(response, path, method)


@pytest.mark.anyio
async def test_the_inspectors_responses_match_their_documented_schemas() -> None:
    async with Host(chat=chat, tools={"lookup": lookup}) as host:
        app = create_app(host, token=TOKEN, limits=LIMITS)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://service",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            spec = msgspec.to_builtins(LOOKUP_SPEC)
            created = await client.post("/v1/sessions", json={"spec": spec, "prompt": "q"})
            session_id = created.json()["session_id"]
            await client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
            one = "/v1/sessions/{session_id}"
            listing = await client.get("/v1/inspector/sessions", params={"status": "idle"})
            assert [s["session_id"] for s in listing.json()["sessions"]] == [session_id]
            check(listing, "/v1/inspector/sessions", "get")
            view = await client.get(f"/v1/inspector/sessions/{session_id}")
            assert view.json()["session"]["status"] == "idle"
            check(view, "/v1/inspector/sessions/{session_id}", "get")
            rechecked = await client.post(
                f"/v1/sessions/{session_id}/recheck", json={"guards": {"max_turns": None}}
            )
            assert rechecked.json()["divergence"] is None
            check(rechecked, one + "/recheck", "post")
            diverged = await client.post(
                f"/v1/sessions/{session_id}/recheck",
                json={"guards": {"budget": {"max_seconds": 1e-6}}},
            )
            assert diverged.json()["divergence"]["poll"] >= 1
            check(diverged, one + "/recheck", "post")
            retried = await client.post(f"/v1/sessions/{session_id}/retry")
            assert retried.json()["status"] == "idle"
            check(retried, one + "/retry", "post")
            await client.post(f"/v1/sessions/{session_id}/cancel")
            for response, path, method in [
                (await client.post(f"/v1/sessions/{session_id}/retry"), one + "/retry", "post"),
                (await client.post("/v1/sessions/nope/retry"), one + "/retry", "post"),
                (
                    await client.post("/v1/sessions/nope/recheck", json={"guards": {}}),
                    one + "/recheck",
                    "post",
                ),
                (
                    await client.get("/v1/inspector/sessions/nope"),
                    "/v1/inspector/sessions/{session_id}",
                    "get",
                ),
                (
                    await client.get("/v1/inspector/sessions", params={"cursor": "x"}),
                    "/v1/inspector/sessions",
                    "get",
                ),
            ]:
                assert response.status_code in (404, 409, 422), response.text
                check(response, path, method)


LIMIT = LIMITS.max_page
TEXT = LIMITS.max_text_chars
HISTORY = LIMITS.max_history_messages
HI = {"role": "user", "content": "hi"}
CREATE = ("POST", "/v1/sessions")
RESULTS = ("POST", "/v1/sessions/nope/tool_results")
MESSAGE = ("POST", "/v1/sessions/nope/messages")

# (operation, body, refused): bodies at each bound the server checks, one side and the other.
BODIES: list[tuple[tuple[str, str], dict[str, Any], bool]] = [
    (CREATE, {"spec": {"tools": [{"name": ""}]}}, True),
    (CREATE, {"spec": {"tools": [{"name": "a" * 65}]}}, True),
    (CREATE, {"spec": {"tools": [{"name": "no spaces"}]}}, True),
    (CREATE, {"spec": {"tools": [{"name": "a" * 64}]}}, False),
    (CREATE, {"spec": {"tools": [{"name": "a-b.c_9"}]}}, False),
    (CREATE, {"spec": {"temperature": 2.5}}, True),
    (CREATE, {"spec": {"temperature": -0.1}}, True),
    (CREATE, {"spec": {"temperature": 2, "top_p": 1, "max_tokens": 1, "seed": -(2**63)}}, False),
    (CREATE, {"spec": {"top_p": 0}}, True),
    (CREATE, {"spec": {"max_tokens": 0}}, True),
    (CREATE, {"spec": {"seed": 2**63}}, True),
    (CREATE, {"spec": {"seed": 2**63 - 1}}, False),
    (CREATE, {"spec": {"mcp_servers": [{"name": "s"}]}}, True),
    (CREATE, {"spec": {"mcp_servers": [{"name": "s", "command": "x", "url": "http://x"}]}}, True),
    (CREATE, {"spec": {"mcp_servers": [{"name": "s", "command": ""}]}}, True),
    (CREATE, {"spec": {"mcp_servers": [{"name": "s", "url": "ftp://x"}]}}, True),
    (CREATE, {"spec": {"mcp_servers": [{"name": "s", "command": "x", "timeout": 0}]}}, True),
    (
        CREATE,
        {"spec": {"mcp_servers": [{"name": "s", "command": "x", "tool_prefix": "a b"}]}},
        True,
    ),
    (CREATE, {"spec": {"system_promt": "x"}}, True),
    (CREATE, {"spec": {"tools": [{"name": "a", "input_shema": {}}]}}, True),
    (CREATE, {"promt": "x"}, True),
    (CREATE, {"max_turns": 0}, True),
    (CREATE, {"max_turns": 1}, False),
    (CREATE, {"max_turns": 3.0}, False),
    (CREATE, {"max_turns": 2.5}, True),
    (CREATE, {"session_id": "a/b"}, True),
    (CREATE, {"session_id": "abc\n"}, True),
    (CREATE, {"session_id": "a" * 200}, False),
    (CREATE, {"prompt": "x" * (TEXT + 1)}, True),
    (CREATE, {"prompt": "x" * TEXT}, False),
    (CREATE, {"history": [HI] * (HISTORY + 1)}, True),
    (CREATE, {"history": [HI] * HISTORY}, False),
    (CREATE, {"history": [{"role": "wizard"}]}, True),
    (CREATE, {"history": [{"content": "hi"}]}, True),
    (CREATE, {"history": [{"role": "user", "content": {"text": "hi"}}]}, True),
    (CREATE, {"history": [{"role": "user", "content": [{"text": "hi"}]}]}, True),
    (CREATE, {"history": [{"role": "user", "content": [{"type": "text"}], "name": "x"}]}, False),
    (CREATE, {"history": [{"role": "assistant", "tool_calls": [{"id": 1}]}]}, True),
    (CREATE, {"history": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}, True),
    (CREATE, {"history": [{"role": "assistant", "tool_calls": None}]}, False),
]
GUARDS: list[tuple[str, str, object, bool]] = [
    ("consecutive_errors", "threshold", 0, True),
    ("consecutive_errors", "threshold", 1, False),
    ("loop", "warnings", -1, True),
    ("loop", "warnings", 0, False),
    ("terminal", "max_reprompts", -1, True),
    ("terminal", "max_reprompts", 0, False),
    ("budget", "max_tokens", 0, True),
    ("budget", "max_tokens", 1, False),
    ("budget", "max_seconds", 0, True),
    ("budget", "max_seconds", 0.001, False),
    ("budget", "max_seconds", 10**15, False),
    # Past the largest float, read as the largest float: refused, as the schema says.
    ("budget", "max_seconds", int(sys.float_info.max) + 1, True),
    ("cost", "max_cost", int(sys.float_info.max) + 1, True),
    ("small_model", "window_turns", 0, True),
    ("small_model", "window_turns", 1, False),
    ("small_model", "max_result_chars", 0, True),
    ("small_model", "max_result_chars", 1, False),
    ("loop", "warning", 1, True),
    ("self_feeding", "max_links", 0, True),
    ("self_feeding", "max_links", 1, False),
    ("self_feeding", "warnings", -1, True),
    ("self_feeding", "warnings", 0, False),
]
BODIES += [
    (CREATE, {"guards": {guard: {setting: value}}}, refused)
    for guard, setting, value, refused in GUARDS
]
BODIES += [
    (RESULTS, {"results": [{"tool_use_id": "c", "text": "t", "is_eror": True}]}, True),
    (
        RESULTS,
        {"results": [{"tool_use_id": "c", "text": "t" * LIMITS.max_tool_result_chars}]},
        False,
    ),
    (
        RESULTS,
        {"results": [{"tool_use_id": "c", "text": "t" * (LIMITS.max_tool_result_chars + 1)}]},
        True,
    ),
    (RESULTS, {"results": [{"tool_use_id": "c"}]}, True),
    (MESSAGE, {"text": "x" * TEXT}, False),
    (MESSAGE, {"text": "x" * (TEXT + 1)}, True),
    (MESSAGE, {"text": "x", "more": 1}, True),
]
# (path, parameter, value, refused)
PARAMETERS: list[tuple[str, str, object, bool]] = [
    ("/v1/sessions", "cursor", "", True),
    ("/v1/sessions", "limit", 0, True),
    ("/v1/sessions", "limit", 1, False),
    ("/v1/sessions", "limit", LIMIT, False),
    ("/v1/sessions", "limit", LIMIT + 1, True),
    ("/v1/sessions/{session_id}/events", "after", -1, True),
    ("/v1/sessions/{session_id}/events", "after", 0, False),
    ("/v1/sessions/{session_id}/events", "after", 2**63 - 1, False),
    ("/v1/sessions/{session_id}/events", "after", 2**63, True),
    ("/v1/sessions/{session_id}/events", "wait", -0.5, True),
    ("/v1/sessions/{session_id}/events", "wait", 0.01, False),
    ("/v1/sessions/{session_id}", "wait", -1, True),
    ("/v1/inspector/sessions", "status", "idle", False),
    ("/v1/inspector/sessions", "status", "unreadable", False),
    ("/v1/inspector/sessions", "status", "sleeping", True),
    ("/v1/inspector/sessions", "status", "", True),
    ("/v1/inspector/sessions", "search", "x" * 200, False),
    ("/v1/inspector/sessions", "search", "x" * 201, True),
    ("/v1/inspector/sessions", "cursor", "12", False),
    ("/v1/inspector/sessions", "cursor", "9" * 18, False),
    ("/v1/inspector/sessions", "cursor", "9" * 19, True),
    ("/v1/inspector/sessions", "cursor", "x", True),
    ("/v1/inspector/sessions", "limit", 0, True),
    ("/v1/inspector/sessions", "limit", LIMIT, False),
    ("/v1/inspector/sessions", "limit", LIMIT + 1, True),
]
# Re-check bodies, for a session whose log has the default guards.
RECHECK_BODIES: list[tuple[dict[str, Any], bool]] = [
    ({"guards": {guard: {setting: value}}}, refused) for guard, setting, value, refused in GUARDS
] + [
    ({"guards": {}}, False),
    ({"guards": {"loop": None, "budget": {"max_tokens": 5}}}, False),
    ({}, True),
    ({"guards": {}, "more": 1}, True),
    ({"guards": {"loop": 3}}, True),
]


def body_schema(method: str, path: str) -> dict[str, Any]:
    operation = DOCUMENT["paths"][path.replace("nope", "{session_id}")][method.lower()]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": DOCUMENT["components"]}


def parameter_schema(path: str, name: str) -> dict[str, Any]:
    (parameter,) = [p for p in DOCUMENT["paths"][path]["get"]["parameters"] if p["name"] == name]
    schema: dict[str, Any] = parameter["schema"]
    return schema


@pytest.mark.anyio
async def test_the_schemas_refuse_what_the_server_refuses_and_take_what_it_takes() -> None:
    async with Host(chat=chat, tools={"lookup": lookup}) as host:
        app = create_app(host, token=TOKEN, limits=LIMITS)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://service",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            session_id = (await client.post("/v1/sessions", json={})).json()["session_id"]
            for (method, path), body, refused in BODIES:
                response = await client.request(method, path, json=body)
                assert (response.status_code == 422) == refused, (body, response.text)
                problems = validate(body_schema(method, path), body)
                assert bool(problems) == refused, (body, problems)
            for path, name, value, refused in PARAMETERS:
                url = path.replace("{session_id}", session_id)
                response = await client.get(url, params={name: str(value)})
                assert (response.status_code == 422) == refused, (name, value, response.text)
                problems = validate(parameter_schema(path, name), value)
                assert bool(problems) == refused, (name, value, problems)
            recheck = "/v1/sessions/{session_id}/recheck"
            for body, refused in RECHECK_BODIES:
                response = await client.post(recheck.format(session_id=session_id), json=body)
                assert (response.status_code == 422) == refused, (body, response.text)
                problems = validate(body_schema("POST", recheck), body)
                assert bool(problems) == refused, (body, problems)
