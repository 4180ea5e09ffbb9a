"""The inspector's endpoints in-process (httpx.ASGITransport), on both anyio backends: the
read-only app over a log (list, summary, events, stream and re-check; no route that
changes a session), its pages and their headers, the token on everything but the pages,
and bad requests answered with the field at fault."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from tests.service.test_catalog import LOOKUP, append_session, follow_up
from turnkeeper.core import AgentSpec, ToolResult
from turnkeeper.events import Envelope, MessageReceived, SessionOpened
from turnkeeper.logs import EventLog, JsonlLog, MemoryLog, SqliteLog
from turnkeeper.providers import ScriptedChat, tool_response
from turnkeeper.service import SessionList, SessionView, create_app
from turnkeeper.service._catalog import Catalog
from turnkeeper.service._inspector import create_inspector_app
from turnkeeper.sessions import Host, Resume, UserMessage, begin_poll, end_poll, open_session
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

TOKEN = "inspector-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def inspecting(
    log: EventLog, stopping: anyio.Event | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The read-only app over `log`, and a client with the token."""
    app = create_inspector_app(
        Catalog(log), token=TOKEN, source="a test log", ping_seconds=0.2, stopping=stopping
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inspector", headers=AUTH
    ) as client:
        yield client


async def looping(log: MemoryLog, session_id: str) -> None:
    """A session whose model repeats one call until the loop guard halts it (its
    duplicates self-answered, so that the Host resumes it with no results)."""
    state = open_session(AgentSpec(tools=(LOOKUP,)), session_id=session_id)
    events, state, request = begin_poll(state, UserMessage("go"), now=1.0)
    n = 0
    while request is not None:
        n += 1
        after, state = end_poll(state, tool_response(("lookup", {"k": 1}, f"c{n}")), now=2.0)
        events += after
        if state.status not in ("requires_action", "running"):
            break
        results = tuple(ToolResult(use.id, "same") for use in state.pending)
        begun, state, request = begin_poll(state, Resume(state.pending, results), now=3.0)
        events += begun
    assert state.status == "halted"
    await log.append(events, expected_seq=0)


async def test_the_list_and_a_summary_read_the_log() -> None:
    log = MemoryLog()
    for name in ("one", "two", "three"):
        await append_session(log, name, prompt=f"about {name}")
    await follow_up(log, "one", at=9.0)
    async with inspecting(log) as client:
        response = await client.get("/v1/inspector/sessions", params={"limit": 2})
        assert response.status_code == 200, response.text
        listed = msgspec.json.decode(response.content, type=SessionList)
        assert [s.session_id for s in listed.sessions] == ["one", "three"]
        assert (listed.total, listed.matched, listed.live) == (3, 3, False)
        assert listed.source == "a test log"
        assert listed.counts == {"idle": 3}
        assert listed.next_cursor is not None
        rest = await client.get(
            "/v1/inspector/sessions", params={"limit": 2, "cursor": listed.next_cursor}
        )
        assert [s["session_id"] for s in rest.json()["sessions"]] == ["two"]
        viewed = await client.get("/v1/inspector/sessions/one")
        view = msgspec.json.decode(viewed.content, type=SessionView)
        assert (view.session.events, view.session.polls, view.session.prompt) == (5, 2, "about one")
        assert view.max_page == 1_000
        missing = await client.get("/v1/inspector/sessions/nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["field"] == "session_id"


async def test_events_and_the_stream_follow_the_log_as_it_grows() -> None:
    log = MemoryLog()
    await append_session(log, "s")
    stopping = anyio.Event()
    async with inspecting(log, stopping) as client:
        page = (await client.get("/v1/sessions/s/events", params={"after": 1})).json()
        assert [e["seq"] for e in page["events"]] == [2, 3]
        assert (await client.get("/v1/sessions/nope/events")).status_code == 404
        assert (await client.get("/v1/sessions/nope/events/stream")).status_code == 404

        async def later() -> None:
            await anyio.sleep(0.3)
            await follow_up(log, "s", at=5.0)

        async with anyio.create_task_group() as group:
            group.start_soon(later)
            waited = await client.get("/v1/sessions/s/events", params={"after": 3, "wait": 10})
        assert [e["seq"] for e in waited.json()["events"]] == [4, 5]

        streamed: list[httpx.Response] = []

        async def stream() -> None:
            # The in-process transport hands the body over once the stream ends (on stop).
            headers = {"Last-Event-ID": "2"}
            streamed.append(await client.get("/v1/sessions/s/events/stream", headers=headers))

        async with anyio.create_task_group() as group:
            group.start_soon(stream)
            await anyio.sleep(0.2)
            await follow_up(log, "s", at=6.0)
            await anyio.sleep(1.0)
            stopping.set()
        (response,) = streamed
        assert response.headers["content-type"].startswith("text/event-stream")
        ids = [line[4:] for line in response.text.splitlines() if line.startswith("id: ")]
        assert ids == ["3", "4", "5", "6", "7"]


async def test_recheck_answers_where_other_guards_diverge_and_names_bad_settings() -> None:
    log = MemoryLog()
    await looping(log, "loop")
    async with inspecting(log) as client:
        same = await client.post("/v1/sessions/loop/recheck", json={"guards": {}})
        assert same.status_code == 200, same.text
        assert same.json()["divergence"] is None
        assert same.json()["events"] == len(await log.read("loop"))
        other = await client.post("/v1/sessions/loop/recheck", json={"guards": {"loop": None}})
        divergence = other.json()["divergence"]
        assert divergence["poll"] >= 2
        assert "would" in divergence["summary"]
        bad = await client.post(
            "/v1/sessions/loop/recheck", json={"guards": {"loop": {"warnings": -1}}}
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["field"] == "guards.loop.warnings"
        # A terminal tool required of this session, whose spec names none: a conflict with
        # the session, not a bad request.
        required = await client.post(
            "/v1/sessions/loop/recheck", json={"guards": {"terminal": {"required": True}}}
        )
        assert required.status_code == 409
        assert required.json()["error"]["field"] == "guards"
        assert "the spec names no terminal_tool" in required.json()["error"]["message"]
        unknown = await client.post("/v1/sessions/loop/recheck", json={"guards": {"lop": None}})
        assert unknown.status_code == 422
        assert unknown.json()["error"]["field"] == "guards.lop"
        missing = await client.post("/v1/sessions/nope/recheck", json={"guards": {}})
        assert missing.status_code == 404


async def test_a_log_that_is_no_session_is_listed_unreadable_and_cannot_be_rechecked() -> None:
    log = MemoryLog()
    await log.append([Envelope("odd", 1, 1.0, MessageReceived(text="hi"))], expected_seq=0)
    async with inspecting(log) as client:
        listed = (
            await client.get("/v1/inspector/sessions", params={"status": "unreadable"})
        ).json()
        assert [s["session_id"] for s in listed["sessions"]] == ["odd"]
        assert "local.session_opened" in listed["sessions"][0]["error"]
        refused = await client.post("/v1/sessions/odd/recheck", json={"guards": {}})
        assert refused.status_code == 409
        assert "cannot be re-checked" in refused.json()["error"]["message"]


async def damaged_sqlite_log(path: Path) -> None:
    """A SQLite log of three sessions: "sound", "torn" (one body overwritten with bytes
    that are no envelope) and "gap" (its second event's row deleted)."""
    async with SqliteLog(path) as log:
        for session_id in ("sound", "torn", "gap"):
            await append_session(log, session_id)
            await follow_up(log, session_id, at=2.0)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE events SET body = x'deadbeef' WHERE session_id = 'torn' AND seq = 2")
        db.execute("DELETE FROM events WHERE session_id = 'gap' AND seq = 2")


@pytest.mark.parametrize("live", [False, True], ids=["turnkeeper ui", "serve"])
async def test_a_damaged_session_is_a_409_naming_the_damage_in_every_read(
    tmp_path: Path, live: bool
) -> None:
    path = tmp_path / "log.sqlite"
    await damaged_sqlite_log(path)
    async with SqliteLog(path) as log:
        if live:
            async with Host(chat=ScriptedChat([]), log=log) as host:
                app = create_app(host, token=TOKEN)
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://t", headers=AUTH
                ) as client:
                    await _refused_with_why(client)
        else:
            catalog = Catalog(log)
            app = create_inspector_app(catalog, token=TOKEN, source="a damaged log")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t", headers=AUTH
            ) as client:
                await _refused_with_why(client)
                for session_id in ("torn", "gap"):
                    events = await client.get(f"/v1/sessions/{session_id}/events")
                    assert events.status_code == 409


async def test_a_damaged_session_is_listed_unreadable_and_the_rest_read_on(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    await damaged_sqlite_log(path)
    async with SqliteLog(path) as log, inspecting(log) as client:
        first = await client.get("/v1/inspector/sessions")
        assert first.status_code == 200, first.text
        listed = {s["session_id"]: s for s in first.json()["sessions"]}
        assert set(listed) == {"sound", "torn", "gap"}
        assert listed["sound"]["status"] == "idle"
        assert listed["torn"]["status"] == listed["gap"]["status"] == "unreadable"
        assert "not an event envelope" in listed["torn"]["error"]
        assert "leaves a gap" in listed["gap"]["error"]
        assert first.json()["counts"] == {"idle": 1, "unreadable": 2}
        # Read on past the damage: a session's new events, and a new session.
        await follow_up(log, "sound", at=9.0)
        await append_session(log, "later", at=10.0)
        again = (await client.get("/v1/inspector/sessions")).json()
        assert [s["session_id"] for s in again["sessions"]][:2] == ["later", "sound"]
        assert again["total"] == 4
        sound = next(s for s in again["sessions"] if s["session_id"] == "sound")
        assert sound["events"] == (await log.last_seq("sound"))


async def test_a_json_lines_session_with_a_bad_line_is_listed_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "log"
    async with JsonlLog(path) as log:
        for session_id in ("sound", "torn"):
            await append_session(log, session_id)
            await follow_up(log, session_id, at=2.0)
    torn = path / "torn.jsonl"
    lines = torn.read_bytes().splitlines(keepends=True)
    torn.write_bytes(b"".join([lines[0], lines[1][:20] + b"\n", *lines[2:]]))
    async with JsonlLog(path) as log, inspecting(log) as client:
        response = await client.get("/v1/inspector/sessions")
        assert response.status_code == 200, response.text
        listed = {s["session_id"]: s for s in response.json()["sessions"]}
        assert listed["sound"]["status"] == "idle"
        assert listed["torn"]["status"] == "unreadable"
        assert "torn.jsonl" in listed["torn"]["error"]


async def _refused_with_why(client: httpx.AsyncClient) -> None:
    for session_id, why in (("torn", "not an event envelope"), ("gap", "seq")):
        for response in (
            await client.get(f"/v1/inspector/sessions/{session_id}"),
            await client.post(f"/v1/sessions/{session_id}/recheck", json={"guards": {}}),
        ):
            assert response.status_code == 409, response.text
            error = response.json()["error"]
            assert session_id in error["message"]
            assert why in error["message"]
    sound = await client.get("/v1/inspector/sessions/sound")
    assert sound.status_code == 200


async def test_the_read_only_app_has_no_route_that_changes_a_session() -> None:
    log = MemoryLog()
    await append_session(log, "s")
    async with inspecting(log) as client:
        for path in ("/v1/sessions", "/v1/sessions/s/messages", "/v1/sessions/s/cancel"):
            response = await client.post(path, json={"text": "x"})
            assert response.status_code in (404, 405), path
        assert await log.last_seq("s") == 3


async def test_pages_need_no_token_and_carry_a_strict_policy_and_the_rest_needs_it() -> None:
    log = MemoryLog()
    await append_session(log, "s")
    async with inspecting(log) as client:
        bare = httpx.AsyncClient(transport=client._transport, base_url="http://inspector")
        async with bare:
            home = await bare.get("/")
            assert home.status_code in (302, 307)
            assert home.headers["location"] == "/ui/"
            for path, media in [
                ("/ui/", "text/html"),
                ("/ui/sessions/s", "text/html"),
                ("/ui/static/api.js", "text/javascript"),
                ("/ui/static/inspector.css", "text/css"),
            ]:
                page = await bare.get(path)
                assert page.status_code == 200, path
                assert page.headers["content-type"].startswith(media)
                policy = page.headers["content-security-policy"]
                assert policy.split(";")[0] == "default-src 'self'"
                assert "unsafe" not in policy
                assert page.headers["x-content-type-options"] == "nosniff"
                assert "set-cookie" not in page.headers
            html = (await bare.get("/ui/")).text
            assert "<script>" not in html
            assert " style=" not in html
            assert (await bare.get("/ui/static/nothing.js")).status_code == 404
            assert (await bare.get("/ui/static/index.html")).status_code == 404
            for path in (
                "/v1/inspector/sessions",
                "/v1/inspector/sessions/s",
                "/v1/sessions/s/events",
                "/ui/../v1/inspector/sessions",
                "/uix",
            ):
                response = await bare.get(path)
                assert response.status_code in (401, 404), path
                assert b'"sessions"' not in response.content
            refused = await bare.get("/v1/inspector/sessions")
            assert refused.status_code == 401
            assert refused.json()["error"]["field"] == "Authorization"


async def test_serve_has_the_pages_and_the_inspector_over_its_host() -> None:
    async def chat(request: dict[str, object]) -> dict[str, object]:
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}

    async with Host(chat=chat) as host:
        app = create_app(host, token=TOKEN)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://service", headers=AUTH
        ) as client:
            created = await client.post("/v1/sessions", json={"prompt": "hi"})
            session_id = created.json()["session_id"]
            await client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
            listed = (await client.get("/v1/inspector/sessions")).json()
            assert [s["session_id"] for s in listed["sessions"]] == [session_id]
            assert listed["live"] is True
            assert listed["source"] == "in-memory log"
            page = await client.get("/ui/", headers={"Authorization": ""})
            assert page.status_code == 200
            assert page.headers["content-security-policy"].startswith("default-src 'self'")
            redirected = await client.get("/ui", headers={"Authorization": ""})
            assert redirected.status_code in (307, 308)


async def test_bad_list_parameters_name_the_parameter() -> None:
    async with inspecting(MemoryLog()) as client:
        for params, field in [
            ({"status": "asleep"}, "status"),
            ({"limit": "0"}, "limit"),
            ({"cursor": "-1"}, "cursor"),
            ({"search": "x" * 201}, "search"),
        ]:
            response = await client.get("/v1/inspector/sessions", params=params)
            assert response.status_code == 422, params
            assert response.json()["error"]["field"] == field


async def test_the_summary_of_a_resumed_transcript_waiting_on_a_call() -> None:
    log = MemoryLog()
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        },
    ]
    state = open_session(AgentSpec(), session_id="resumed", history=history)
    opened = SessionOpened(state.spec, state.history, state.max_turns, state.guards, state.resume)
    await log.append([Envelope("resumed", 1, 1.0, opened)], expected_seq=0)
    assert replay(await log.read("resumed")).status == "requires_action"
    async with inspecting(log) as client:
        view = (await client.get("/v1/inspector/sessions/resumed")).json()
        assert view["session"]["status"] == "requires_action"
