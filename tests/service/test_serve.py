"""The service as a real subprocess on a free 127.0.0.1 port, driven with httpx: the
flows an orchestrator uses, SSE with reconnects, every bad request, auth, 200
concurrent sessions, `kill -9` and a restart on the same log, and a graceful stop."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from tests.service.bad_requests import CASES, case_body, check_error, setup_bodies
from tests.service.process import TOKEN, ServerProcess
from tests.service.prometheus import parse_exposition
from tests.service.server_main import ASK_SPEC, LOOKUP_SPEC, answer_for
from tests.service.sse import SseEvent, parse_sse
from tests.sessions.test_host_quarantine import KINDS, sqlite_damage
from turnkeeper.core import InputError, LogError
from turnkeeper.events import Envelope, ToolReturned
from turnkeeper.logs import SqliteLog
from turnkeeper.service import ErrorBody, EventPage, SessionPage, serve
from turnkeeper.sessions import SessionInfo

LOOKUP = msgspec.to_builtins(LOOKUP_SPEC)
ASK = msgspec.to_builtins(ASK_SPEC)


def create(client: httpx.Client, body: dict[str, Any]) -> str:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def settled(client: httpx.Client, session_id: str) -> SessionInfo:
    """The session once it is no longer running (long-polling its status)."""
    while True:
        response = client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
        assert response.status_code == 200, response.text
        info = msgspec.json.decode(response.content, type=SessionInfo)
        if info.status != "running":
            return info


def all_events(client: httpx.Client, session_id: str) -> list[Envelope]:
    page = client.get(f"/v1/sessions/{session_id}/events", params={"limit": 1000})
    assert page.status_code == 200
    return msgspec.json.decode(page.content, type=EventPage).events


def test_create_then_long_poll_to_completion(server: ServerProcess) -> None:
    with server.client() as client:
        session_id = create(client, {"spec": LOOKUP, "prompt": "slow-p1"})
        seen: list[Envelope] = []
        after = 0
        while True:
            response = client.get(
                f"/v1/sessions/{session_id}/events", params={"after": after, "wait": 10}
            )
            assert response.status_code == 200
            page = msgspec.json.decode(response.content, type=EventPage)
            seen += page.events
            after = page.next_after
            info = msgspec.json.decode(
                client.get(f"/v1/sessions/{session_id}").content, type=SessionInfo
            )
            if info.status != "running" and after == info.seq:
                break
        assert [envelope.seq for envelope in seen] == list(range(1, info.seq + 1))
        assert seen[0].type == "local.session_opened"
        assert seen[-1].type == "local.model_response"
        assert [e.type for e in seen].count("local.tool_call") == 2
        assert info.status == "idle"
        assert info.text == answer_for("slow-p1")
        assert info.usage.prompt_tokens == 10


def read_stream(
    client: httpx.Client, session_id: str, *, last_event_id: int | None, until_seq: int | None
) -> tuple[list[SseEvent], list[SseEvent]]:
    """(events, comments) from one connection to the stream, closed after the event with
    seq `until_seq` (or after the first ping comment following the events, when None)."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    events: list[SseEvent] = []
    comments: list[SseEvent] = []
    with client.stream(
        "GET", f"/v1/sessions/{session_id}/events/stream", headers=headers
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for item in parse_sse(response.iter_lines()):
            if item.comment is not None:
                comments.append(item)
                if until_seq is None:
                    break
                continue
            events.append(item)
            if until_seq is not None and item.id == str(until_seq):
                break
    return events, comments


def test_sse_stream_resumes_from_last_event_id_with_nothing_lost_or_repeated(
    server: ServerProcess,
) -> None:
    with server.client() as client:
        session_id = create(client, {"spec": LOOKUP, "prompt": "slow-sse"})
        first, _ = read_stream(client, session_id, last_event_id=None, until_seq=3)
        info = settled(client, session_id)
        assert info.text == answer_for("slow-sse")
        rest, _ = read_stream(client, session_id, last_event_id=3, until_seq=info.seq)
        # Caught up: an idle stream sends keep-alive pings.
        tail, pings = read_stream(client, session_id, last_event_id=info.seq, until_seq=None)
        assert tail == []
        assert pings[0].comment == "ping"
        streamed = first + rest
        assert [event.id for event in streamed] == [str(n) for n in range(1, info.seq + 1)]
        logged = all_events(client, session_id)
        assert [event.event for event in streamed] == [envelope.type for envelope in logged]
        assert [
            msgspec.json.decode(event.data or "", type=Envelope) for event in streamed
        ] == logged


def test_a_head_of_the_event_stream_ends_with_its_head_and_the_connection_goes_on(
    server: ServerProcess,
) -> None:
    with server.client() as client:
        session_id = create(client, {"spec": LOOKUP, "prompt": "head"})
        settled(client, session_id)
    # One connection for every request: a response left open would hold up the next.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
        limits=limits,
    ) as client:
        for path in (f"/v1/sessions/{session_id}/events/stream", "/v1/sessions/nope/events/stream"):
            head = client.head(path)
            get = client.get(f"/v1/sessions/{session_id}")
            assert get.status_code == 200
            assert head.content == b""
        stream = client.head(f"/v1/sessions/{session_id}/events/stream")
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert client.head("/v1/sessions/nope/events/stream").status_code == 404
        assert client.get("/v1/healthz").status_code == 200


def test_tool_results_return_control_to_the_orchestrator(server: ServerProcess) -> None:
    with server.client() as client:
        session_id = create(client, {"spec": ASK, "prompt": "q1"})
        info = settled(client, session_id)
        assert info.status == "requires_action"
        (pending,) = info.pending
        assert pending.name == "ask_human"
        refused = client.post(f"/v1/sessions/{session_id}/messages", json={"text": "hurry"})
        assert refused.status_code == 409
        assert pending.id in refused.json()["error"]["message"]
        accepted = client.post(
            f"/v1/sessions/{session_id}/tool_results",
            json={"results": [{"tool_use_id": pending.id, "text": "yes"}]},
        )
        assert accepted.status_code == 202, accepted.text
        done = settled(client, session_id)
        assert done.status == "idle"
        assert done.text == answer_for("q1", "yes")
        answered = [
            e.event
            for e in all_events(client, session_id)
            if isinstance(e.event, ToolReturned) and e.event.tool_call_id == pending.id
        ]
        assert [(event.text, event.is_error) for event in answered] == [("yes", False)]


def test_cancel_a_running_session(server: ServerProcess) -> None:
    with server.client() as client:
        session_id = create(client, {"spec": LOOKUP, "prompt": "slow-cancel"})
        response = client.post(f"/v1/sessions/{session_id}/cancel")
        assert response.status_code == 200
        info = msgspec.json.decode(response.content, type=SessionInfo)
        assert info.status == "cancelled"
        assert all_events(client, session_id)[-1].type == "local.cancelled"
        assert settled(client, session_id).status == "cancelled"
        again = client.post(f"/v1/sessions/{session_id}/cancel")
        assert again.status_code == 200
        assert [e.type for e in all_events(client, session_id)].count("local.cancelled") == 1


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({}, "missing Authorization"),
        ({"Authorization": "Bearer not-the-token"}, "wrong token"),
        ({"Authorization": f"Basic {TOKEN}"}, "Bearer scheme"),
        ({"Authorization": "Bearer"}, "wrong token"),
    ],
)
def test_auth_failures_are_401_everywhere_but_health(
    server: ServerProcess, headers: dict[str, str], problem: str
) -> None:
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as bare:
        for method, path in [
            ("POST", "/v1/sessions"),
            ("GET", "/v1/sessions"),
            ("GET", "/v1/sessions/x"),
            ("GET", "/v1/sessions/x/events"),
            ("GET", "/v1/sessions/x/events/stream"),
            ("POST", "/v1/sessions/x/cancel"),
            ("GET", "/v1/metrics"),
            ("GET", "/v1/openapi.json"),
        ]:
            response = bare.request(method, path, json={"prompt": "x"})
            assert response.status_code == 401, (method, path)
            error = msgspec.json.decode(response.content, type=ErrorBody).error
            assert problem in error.message
            assert error.field == "Authorization"
            # The body was never read: the client is told not to reuse the connection.
            assert response.headers["connection"] == "close"
        assert bare.get("/v1/healthz").json() == {"status": "ok"}


def snapshot(client: httpx.Client, session_ids: list[str]) -> object:
    listing = client.get("/v1/sessions", params={"limit": 1000})
    assert listing.status_code == 200
    return listing.json(), [all_events(client, session_id) for session_id in session_ids]


def test_every_bad_request_is_a_4xx_naming_the_field_and_changes_nothing(
    server: ServerProcess,
) -> None:
    with server.client() as client:
        idle_body, waiting_body = setup_bodies()
        idle = create(client, idle_body)
        waiting = create(client, waiting_body)
        assert settled(client, idle).status == "idle"
        assert settled(client, waiting).status == "requires_action"
        before = snapshot(client, [idle, waiting])
        for case in CASES:
            body = case_body(case, idle=idle)
            content: bytes | Iterator[bytes] | None = body
            if case.chunked and body is not None:
                content = iter([body[i : i + 4096] for i in range(0, len(body), 4096)])
            response = client.request(
                case.method,
                case.path.format(idle=idle, waiting=waiting),
                content=content,
                headers=case.headers,
            )
            check_error(case, response.status_code, response.content)
            assert snapshot(client, [idle, waiting]) == before, case.name


def test_a_client_that_stalls_mid_body_gets_a_408_and_is_disconnected(
    server: ServerProcess,
) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with server.client() as client:
        before = client.get("/v1/sessions", params={"limit": 1000}).json()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {server.token}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            + b'{"prompt": "never fini'
        )
        received = b""
        while chunk := sock.recv(65536):  # to the end: the server closes the connection
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode().lower().split("\r\n")
    assert lines[0].startswith("http/1.1 408"), received
    assert "connection: close" in lines
    error = msgspec.json.decode(body, type=ErrorBody).error
    assert error.field == "body"
    assert "not received in full within 2 seconds" in error.message
    with server.client() as client:
        assert client.get("/v1/sessions", params={"limit": 1000}).json() == before


@pytest.mark.anyio
async def test_200_concurrent_sessions_all_finish_with_the_right_answer(
    server: ServerProcess,
) -> None:
    prompts = [f"c{n}" for n in range(200)]
    answers: dict[str, tuple[str, SessionInfo]] = {}
    async with server.async_client() as client:

        async def one(prompt: str) -> None:
            response = await client.post("/v1/sessions", json={"spec": LOOKUP, "prompt": prompt})
            assert response.status_code == 201, response.text
            session_id = response.json()["session_id"]
            while True:
                polled = await client.get(f"/v1/sessions/{session_id}", params={"wait": 30})
                assert polled.status_code == 200, polled.text
                info = msgspec.json.decode(polled.content, type=SessionInfo)
                if info.status != "running":
                    answers[prompt] = (session_id, info)
                    return

        async with anyio.create_task_group() as group:
            for prompt in prompts:
                group.start_soon(one, prompt)

        assert sorted(answers) == sorted(prompts)
        for prompt, (_, info) in answers.items():
            assert info.status == "idle"
            assert info.text == answer_for(prompt)
        listed: set[str] = set()
        cursor: str | None = None
        while True:
            params = {"limit": 64} | ({"cursor": cursor} if cursor else {})
            page = msgspec.json.decode(
                (await client.get("/v1/sessions", params=params)).content, type=SessionPage
            )
            listed |= {info.session_id for info in page.sessions}
            cursor = page.next_cursor
            if cursor is None:
                break
        assert {session_id for session_id, _ in answers.values()} <= listed


def test_metrics_parse_and_the_counters_move(server: ServerProcess) -> None:
    with server.client() as client:
        samples, types = metrics(client)
        assert types["turnkeeper_sessions"] == "gauge"
        assert types["turnkeeper_model_calls_total"] == "counter"
        assert types["turnkeeper_log_append_seconds"] == "summary"
        # A tool whose arguments never validate: a tool error, then the repair guard's halt
        # at the second bad reply.
        strict = {"name": "lookup", "input_schema": {"type": "object", "required": ["id"]}}
        session_id = create(client, {"spec": {"tools": [strict]}, "prompt": "m", "max_turns": 3})
        info = settled(client, session_id)
        assert info.status == "halted"
        after, _ = metrics(client)

        def moved(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
            return after[(name, labels)] - samples.get((name, labels), 0)

        assert moved("turnkeeper_model_calls_total") == 2
        assert moved("turnkeeper_tool_errors_total") >= 1
        assert moved("turnkeeper_sessions", (("status", "halted"),)) == 1
        assert after[("turnkeeper_log_append_seconds", (("quantile", "0.99"),))] > 0
        # The session's appends are among those counted; their latencies add up.
        assert after[("turnkeeper_log_append_seconds_count", ())] >= 2
        assert after[("turnkeeper_log_append_seconds_sum", ())] > 0


def metrics(client: httpx.Client) -> tuple[dict[Any, float], dict[str, str]]:
    response = client.get("/v1/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_exposition(response.text)


def test_kill_9_then_restart_on_the_same_log_loses_nothing(tmp_path: Path) -> None:
    log_path = tmp_path / "log.sqlite"
    stderr = tmp_path / "stderr.log"
    first = ServerProcess(log_path, stderr_path=stderr)
    with first, first.client() as client:
        done = [create(client, {"spec": LOOKUP, "prompt": f"fast{n}"}) for n in range(3)]
        for session_id in done:
            assert settled(client, session_id).status == "idle"
        waiting = create(client, {"spec": ASK, "prompt": "ask"})
        assert settled(client, waiting).status == "requires_action"
        slow = [create(client, {"spec": LOOKUP, "prompt": f"slow{n}"}) for n in range(20)]
        # Wait until work is in flight: the last session has made its first tool call.
        while not any(e.type == "local.tool_call" for e in all_events(client, slow[-1])):
            client.get(f"/v1/sessions/{slow[-1]}/events", params={"after": 0, "wait": 1})
        first.kill()
    prompts = {session_id: f"fast{n}" for n, session_id in enumerate(done)}
    prompts |= {session_id: f"slow{n}" for n, session_id in enumerate(slow)}
    with ServerProcess(log_path, stderr_path=stderr) as second, second.client() as client:
        for session_id, prompt in prompts.items():
            info = settled(client, session_id)
            assert info.status == "idle", (prompt, info)
            assert info.text == answer_for(prompt)
            events = all_events(client, session_id)
            assert [e.seq for e in events] == list(range(1, info.seq + 1))
        info = settled(client, waiting)
        assert info.status == "requires_action"
        response = client.post(
            f"/v1/sessions/{waiting}/tool_results",
            json={"results": [{"tool_use_id": info.pending[0].id, "text": "later"}]},
        )
        assert response.status_code == 202
        assert settled(client, waiting).text == answer_for("ask", "later")
        listed = msgspec.json.decode(
            client.get("/v1/sessions", params={"limit": 100}).content, type=SessionPage
        )
        assert {info.session_id for info in listed.sessions} == {*prompts, waiting}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_gracefully_ending_streams_and_the_log_reopens(
    tmp_path: Path, signum: int
) -> None:
    log_path = tmp_path / "log.sqlite"
    stderr = tmp_path / "stderr.log"
    running = ServerProcess(log_path, stderr_path=stderr, ping=3600, token=None)
    with running, running.client() as client:
        assert len(running.token) >= 32  # generated, as no TURNKEEPER_TOKEN was set
        session_id = create(client, {"spec": LOOKUP, "prompt": "before"})
        info = settled(client, session_id)
        streamed: list[SseEvent] = []
        caught_up = threading.Event()

        def listen() -> None:
            with client.stream("GET", f"/v1/sessions/{session_id}/events/stream") as response:
                for event in parse_sse(response.iter_lines()):
                    streamed.append(event)
                    if len(streamed) == info.seq:
                        caught_up.set()

        listener = threading.Thread(target=listen)
        listener.start()
        # Stopped once the stream is open and idle: a stop ends a stream at once, so one
        # sent before the logged events went out could end without them (a client resumes).
        assert caught_up.wait(60)
        assert running.stop(signum) == 0
        listener.join(60)
        assert not listener.is_alive()  # the server ended the stream
        assert [event.id for event in streamed] == [str(n) for n in range(1, info.seq + 1)]
    with ServerProcess(log_path, stderr_path=stderr) as again, again.client() as client:
        assert settled(client, session_id) == info
    assert "Traceback" not in stderr.read_text()


def test_openapi_is_served_and_json(server: ServerProcess) -> None:
    with server.client() as client:
        response = client.get("/v1/openapi.json")
        assert response.status_code == 200
        document = json.loads(response.content)
        assert document["openapi"].startswith("3.1")
        assert "/v1/sessions/{session_id}/events/stream" in document["paths"]


@pytest.mark.anyio
async def test_serve_refuses_what_it_cannot_do_with_clear_errors(
    tmp_path: Path, anyio_backend: str
) -> None:
    async def quiet(request: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no model call expected")

    if anyio_backend != "trio":
        with pytest.raises(InputError, match="trio"):
            await serve(chat=quiet, port=0, log_path=tmp_path / "log.sqlite")
        return
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError, match=f"cannot listen on 127.0.0.1 port {port}"):
            await serve(chat=quiet, port=port, log_path=tmp_path / "log.sqlite")
    with pytest.raises(InputError, match="port"):
        await serve(chat=quiet, port=70_000, log_path=tmp_path / "log.sqlite")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LogError):
        await serve(chat=quiet, port=0, log_path=garbage)
    assert not (tmp_path / "log.sqlite").exists()
    # Raised by the Host inside serve's task groups, and still the LogError itself.
    broken = tmp_path / "broken.sqlite"
    async with SqliteLog(broken):
        pass
    with sqlite3.connect(broken) as db:
        db.execute("DROP TABLE sessions")
    with pytest.raises(LogError, match="no such table: sessions"):
        await serve(chat=quiet, port=0, log_path=broken)


def test_a_session_the_log_cannot_rebuild_is_listed_unreadable_and_the_others_run(
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "log.sqlite"
    stderr = tmp_path / "stderr.log"
    damaged = {f"damaged-{kind}": kind for kind in KINDS}
    with ServerProcess(log_path, stderr_path=stderr) as first, first.client() as client:
        for session_id in ["good", *damaged]:
            create(client, {"spec": LOOKUP, "prompt": session_id, "session_id": session_id})
            assert settled(client, session_id).status == "idle"
    for session_id, kind in damaged.items():
        sqlite_damage(kind, session_id)(log_path)

    with ServerProcess(log_path, stderr_path=stderr) as second, second.client() as client:
        listed = msgspec.json.decode(client.get("/v1/sessions").content, type=SessionPage)
        statuses = {info.session_id: (info.status, info.error) for info in listed.sessions}
        assert statuses["good"] == ("idle", None)
        for session_id in damaged:
            status, error = statuses[session_id]
            assert status == "unreadable"
            assert error is not None
            assert session_id in error
            one = client.get(f"/v1/sessions/{session_id}")
            assert one.status_code == 200
            assert one.json()["status"] == "unreadable"
            for refused in (
                client.post(f"/v1/sessions/{session_id}/messages", json={"text": "hi"}),
                client.post(f"/v1/sessions/{session_id}/cancel"),
                client.get(f"/v1/sessions/{session_id}/events"),
                client.get(f"/v1/sessions/{session_id}/events/stream"),
            ):
                assert refused.status_code == 409, refused.text
                assert "cannot be rebuilt from the log" in refused.json()["error"]["message"]
        metrics = client.get("/v1/metrics").text
        assert f'turnkeeper_sessions{{status="unreadable"}} {len(damaged)}' in metrics
        assert 'turnkeeper_sessions{status="idle"} 1' in metrics
        # The other session runs on.
        accepted = client.post("/v1/sessions/good/messages", json={"text": "again"})
        assert accepted.status_code == 202, accepted.text
        assert settled(client, "good").text == answer_for("again")
    said = [line for line in stderr.read_text().splitlines() if "session.unreadable" in line]
    assert sorted(json.loads(line)["session_id"] for line in said) == sorted(damaged)
