"""Typed output over the HTTP API: a session's spec takes `output_schema` as a JSON Schema,
its status gives the answer's value as `output`, and a bad schema is a 422 naming
`spec.output_schema`. The app runs in-process over a real Host whose model is the
OpenAI-compatible test server on 127.0.0.1; bad requests are also sent to a served
process in tests/service/test_serve.py (tests/service/bad_requests.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest

from tests.providers.openai_server import ChatServer, Reply, serve_chat
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import OpenAIChat, text_response
from turnkeeper.providers._openai import aclose_shared_client
from turnkeeper.service import create_app
from turnkeeper.sessions import Host

pytestmark = pytest.mark.anyio

TOKEN = "typed-token"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "temperature": {"type": "number"},
        "conditions": {"enum": ["sunny", "rain"]},
    },
    "required": ["city", "temperature", "conditions"],
}
PARIS = {"city": "Paris", "temperature": 12, "conditions": "rain"}


@asynccontextmanager
async def service(*replies: str) -> AsyncIterator[tuple[httpx.AsyncClient, ChatServer]]:
    """The app over a Host whose model answers `replies` in turn, and a client."""
    async with serve_chat(*(Reply(body=text_response(text)) for text in replies)) as server:
        try:
            chat = OpenAIChat(server.base_url, "test-model")
            async with Host(chat=chat, log=MemoryLog()) as host:
                app = create_app(host, token=TOKEN)
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app),
                    base_url="http://service",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as client:
                    yield client, server
        finally:
            await aclose_shared_client()


async def settled(client: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    while True:
        response = await client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
        assert response.status_code == 200, response.text
        info: dict[str, Any] = response.json()
        if info["status"] != "running":
            return info


async def test_the_status_gives_the_answer_as_output() -> None:
    async with service(msgspec.json.encode(PARIS).decode()) as (client, server):
        body = {"spec": {"output_schema": SCHEMA}, "prompt": "Weather in Paris?"}
        created = await client.post("/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        info = await settled(client, session_id)
        events = (await client.get(f"/v1/sessions/{session_id}/events")).json()["events"]
    assert (info["status"], info["stop_reason"], info["output"]) == ("idle", "stop", PARIS)
    assert [event["event"]["type"] for event in events][-1] == "local.output"
    assert events[-1]["event"]["value"] == PARIS
    sent = server.received[0].body["response_format"]
    assert sent == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}
    # The spec logged is the one given, the schema in it.
    assert events[0]["event"]["spec"]["output_schema"] == SCHEMA


async def test_an_answer_that_does_not_match_is_repaired_then_bounded() -> None:
    async with service(
        "Paris: 12 C, rain",
        msgspec.json.encode(PARIS).decode(),
        '{"city": "Oslo"}',
        '{"city": "Oslo"}',
        '{"city": "Oslo"}',
    ) as (client, _):
        first = await client.post(
            "/v1/sessions", json={"spec": {"output_schema": SCHEMA}, "prompt": "Paris?"}
        )
        info = await settled(client, first.json()["session_id"])
        assert info["output"] == PARIS
        guards = {"output": {"max_reprompts": 2}}
        second = await client.post(
            "/v1/sessions",
            json={"spec": {"output_schema": SCHEMA}, "prompt": "Oslo?", "guards": guards},
        )
        halted = await settled(client, second.json()["session_id"])
    assert (halted["status"], halted["stop_reason"], halted["output"]) == (
        "halted",
        "invalid_output",
        None,
    )
    assert halted["polls"] == 3
    assert halted["text"].startswith(
        "I'm sorry: my answer did not match the output schema (it does not match the output "
        "schema: $: missing required property 'temperature'"
    )


@pytest.mark.parametrize(
    ("output_schema", "message"),
    [
        ({"type": "objekt"}, "spec.output_schema: the schema cannot be used: $: the output"),
        ({"$ref": "#/$defs/Weather"}, "cannot be resolved"),
        ([SCHEMA], "Expected `object | null`, got `array`"),
    ],
)
async def test_a_bad_output_schema_is_a_422_naming_it(output_schema: Any, message: str) -> None:
    async with service() as (client, server):
        body = {"spec": {"output_schema": output_schema}, "prompt": "Go"}
        response = await client.post("/v1/sessions", json=body)
        listed = (await client.get("/v1/sessions")).json()
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["field"] == "spec.output_schema"
    assert message in error["message"]
    assert listed["sessions"] == []
    assert server.received == []


async def test_the_openapi_document_describes_output_schema_and_output() -> None:
    async with service() as (client, _):
        document = (await client.get("/v1/openapi.json")).json()
    schemas = document["components"]["schemas"]
    spec = schemas["AgentSpecInput"]["properties"]["output_schema"]
    (given,) = [branch for branch in spec["anyOf"] if branch["type"] == "object"]
    assert "JSON Schema the final answer must match" in given["description"]
    assert "output" in schemas["SessionInfo"]["properties"]
    assert "TypedOutput" in str(schemas["GuardConfigInput"]["properties"]["output"])
    assert schemas["TypedOutputInput"]["properties"]["max_reprompts"]["minimum"] == 0
