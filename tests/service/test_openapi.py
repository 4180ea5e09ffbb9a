"""The OpenAPI document: every route of the app is in it and everything in it is a
route; its references resolve; and real responses match the schemas it documents."""

from __future__ import annotations

import re
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
    assert len(served) == 11
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
