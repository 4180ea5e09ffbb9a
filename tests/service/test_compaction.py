"""Compaction over HTTP (the app in-process over a real Host): a spec's `compaction` is
taken and checked as any field, the summary shows in the events and the event stream as
any event does, and the session's status and list entry count its tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from tests.service.sse import parse_sse
from tests.sessions.test_compaction import Ledger, step
from turnkeeper.events import Envelope
from turnkeeper.logs import MemoryLog
from turnkeeper.service import create_app
from turnkeeper.service._sse import PING, follow_events
from turnkeeper.sessions import Host
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

TOKEN = "compaction-token"
SPEC = {
    "system_prompt": "Take the steps asked for.",
    "tools": [
        {
            "name": "step",
            "description": "Take step n.",
            "input_schema": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            },
        }
    ],
    "compaction": {"budget_tokens": 400, "keep_recent_turns": 2, "summary_tokens": 20},
}


@asynccontextmanager
async def running() -> AsyncIterator[tuple[httpx.AsyncClient, Host]]:
    async with Host(chat=Ledger(), log=MemoryLog(), tools={"step": step}) as host:
        app = create_app(host, token=TOKEN)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://service",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            yield client, host


async def test_the_summary_is_an_event_of_the_session_like_any_other() -> None:
    async with running() as (client, host):
        created = await client.post("/v1/sessions", json={"spec": SPEC, "prompt": "take 8 steps"})
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        info = (await client.get(f"/v1/sessions/{session_id}", params={"wait": 20})).json()
        assert (info["status"], info["text"]) == ("idle", "finished 8 steps")

        page = (await client.get(f"/v1/sessions/{session_id}/events")).json()
        events = page["events"]
        compacted = [e for e in events if e["event"]["type"] == "local.compacted"]
        assert compacted
        first = compacted[0]["event"]
        assert first["budget"] == 400
        assert first["estimated"] > 400
        assert first["message"]["content"].startswith("Summary of the conversation so far: ")
        assert first["usage"] == {"prompt_tokens": 100, "completion_tokens": 9, "cost": None}
        logged = msgspec.json.decode(msgspec.json.encode(events), type=list[Envelope])
        assert logged == await host.events(session_id)
        # The status and the list count the summaries' tokens, as replay does.
        usage = replay(logged).usage
        assert info["usage"]["prompt_tokens"] == usage.prompt_tokens
        listed = (await client.get("/v1/sessions")).json()["sessions"]
        assert [s["usage"]["prompt_tokens"] for s in listed] == [usage.prompt_tokens]

        # The event stream sends it as it sends every event.
        stopping = anyio.Event()
        frames: list[bytes] = []

        async def emit(frame: bytes) -> None:
            frames.append(frame)
            if frame == PING:
                stopping.set()

        await follow_events(host, session_id, emit, after=0, ping_seconds=0.01, stopping=stopping)
        streamed = [e for e in parse_sse(b"".join(frames).decode().split("\n")) if e.id]
        kinds = [e.event for e in streamed]
        assert kinds == [e["event"]["type"] for e in events]
        at = kinds.index("local.compacted")
        assert msgspec.json.decode(streamed[at].data or "", type=Envelope) == logged[at]


async def test_bad_compaction_settings_are_a_422_naming_the_field() -> None:
    async with running() as (client, _):
        for settings, field in (
            ({"budget_tokens": 0}, "spec.compaction.budget_tokens"),
            ({"keep_recent_turns": 0}, "spec.compaction.keep_recent_turns"),
            ({"summary_tokens": -3}, "spec.compaction.summary_tokens"),
            ({"budget_tokens": "many"}, "spec.compaction.budget_tokens"),
            ({"window": 5}, "spec.compaction.window"),
        ):
            body: dict[str, Any] = {"spec": {**SPEC, "compaction": settings}, "prompt": "go"}
            response = await client.post("/v1/sessions", json=body)
            assert response.status_code == 422, response.text
            assert field in response.json()["error"]["message"], response.text
        assert (await client.get("/v1/sessions")).json()["sessions"] == []
        # Null turns it off.
        off = await client.post("/v1/sessions", json={"spec": {**SPEC, "compaction": None}})
        assert off.status_code == 201, off.text
