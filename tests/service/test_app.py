"""The app in-process (httpx.ASGITransport) over a real Host, on both anyio backends:
a full flow, every bad request changing nothing, auth, busy, stopping, and failures
as JSON errors without tracebacks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.types import Message

from tests.service.bad_requests import (
    CASES,
    JSON,
    BadRequest,
    case_body,
    check_error,
    setup_bodies,
)
from tests.service.server_main import ASK_SPEC, LIMITS, LOOKUP_SPEC, answer_for, chat, lookup
from tests.sessions.test_fleet import worker
from turnkeeper.core import MAX_JSON_DEPTH, LogError
from turnkeeper.logs import MemoryLog
from turnkeeper.logs._log import Batch
from turnkeeper.service import ErrorBody, EventPage, Limits, create_app
from turnkeeper.sessions import Chat, Host, SessionInfo

pytestmark = pytest.mark.anyio

TOKEN = "in-process-token"
ASK_CALL = {
    "id": "call_ask",
    "type": "function",
    "function": {"name": "ask_human", "arguments": '{"question": "q"}'},
}


@asynccontextmanager
async def running(
    chat: Chat = chat,
    *,
    log: MemoryLog | None = None,
    stopping: anyio.Event | None = None,
    **options: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, Host]]:
    """A Host on `chat` with the lookup tool, the app over it, and a client with the token."""
    async with Host(chat=chat, log=log or MemoryLog(), tools={"lookup": lookup}, **options) as host:
        app = create_app(host, token=TOKEN, limits=LIMITS, ping_seconds=0.2, stopping=stopping)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://service",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            yield client, host


async def settled(client: httpx.AsyncClient, session_id: str) -> SessionInfo:
    """The session once it is no longer running."""
    while True:
        response = await client.get(f"/v1/sessions/{session_id}", params={"wait": 10})
        assert response.status_code == 200, response.text
        info = msgspec.json.decode(response.content, type=SessionInfo)
        if info.status != "running":
            return info


async def create(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


async def snapshot(client: httpx.AsyncClient, session_ids: list[str]) -> object:
    """Everything a bad request could have changed: every session and its events."""
    listing = await client.get("/v1/sessions", params={"limit": LIMITS.max_page})
    assert listing.status_code == 200
    events = [
        (await client.get(f"/v1/sessions/{session_id}/events")).json() for session_id in session_ids
    ]
    return listing.json(), events


async def test_create_runs_to_the_answer_and_events_page_through() -> None:
    async with running() as (client, _):
        spec = msgspec.to_builtins(LOOKUP_SPEC)
        session_id = await create(client, {"spec": spec, "prompt": "p1"})
        info = await settled(client, session_id)
        assert info.status == "idle"
        assert info.text == answer_for("p1")
        assert info.usage.total_tokens == 15
        seqs: list[int] = []
        after = 0
        while True:
            page = msgspec.json.decode(
                (
                    await client.get(
                        f"/v1/sessions/{session_id}/events", params={"after": after, "limit": 4}
                    )
                ).content,
                type=EventPage,
            )
            if not page.events:
                break
            assert len(page.events) <= 4
            seqs += [envelope.seq for envelope in page.events]
            after = page.next_after
        assert seqs == list(range(1, info.seq + 1))


async def test_after_takes_any_seq_up_to_2_63_minus_1() -> None:
    async with running() as (client, _):
        session_id = await create(client, {"spec": msgspec.to_builtins(LOOKUP_SPEC), "prompt": "p"})
        last = (await settled(client, session_id)).seq
        for after in ("999999999999999999", "1000000000000000000", str(2**63 - 1), "0" * 30 + "7"):
            response = await client.get(
                f"/v1/sessions/{session_id}/events", params={"after": after}
            )
            assert response.status_code == 200, (after, response.text)
            page = msgspec.json.decode(response.content, type=EventPage)
            assert [e.seq for e in page.events] == list(range(int(after) + 1, last + 1))


async def test_racing_result_posts_accept_one_and_refuse_the_rest_as_conflicts() -> None:
    async with running() as (client, _):
        _, waiting_body = setup_bodies()
        for _ in range(5):
            session_id = await create(client, waiting_body)
            info = await settled(client, session_id)
            body = {"results": [{"tool_use_id": use.id, "text": "yes"} for use in info.pending]}
            codes: list[int] = []

            async def post(path: str, body: dict[str, Any], codes: list[int]) -> None:
                codes.append((await client.post(path, json=body)).status_code)

            async with anyio.create_task_group() as group:
                for _ in range(10):
                    group.start_soon(post, f"/v1/sessions/{session_id}/tool_results", body, codes)
            assert sorted(codes) == [202] + [409] * 9


async def test_a_long_poll_ends_when_its_client_hangs_up() -> None:
    async with Host(chat=chat, log=MemoryLog(), tools={"lookup": lookup}) as host:
        app = create_app(host, token=TOKEN, limits=LIMITS, ping_seconds=0.2)
        session_id = await host.start(LOOKUP_SPEC, "p")
        seq = (await host.result(session_id, wait=10)).seq
        hang_up = anyio.Event()
        asked: list[str] = []
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            asked.append("receive")
            if len(asked) == 1:
                return {"type": "http.request", "body": b"", "more_body": False}
            await hang_up.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        path = f"/v1/sessions/{session_id}/events"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": f"after={seq}&wait=60".encode(),
            "root_path": "",
            "headers": [(b"host", b"service"), (b"authorization", f"Bearer {TOKEN}".encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("service", 80),
        }
        # Ended by the hang-up, not by its 60 s: nothing else happens to the session.
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(app, scope, receive, send)  # type: ignore[arg-type]
                await anyio.wait_all_tasks_blocked()
                assert sent == []
                hang_up.set()
        assert sent[0]["status"] == 200
        assert msgspec.json.decode(sent[1]["body"], type=EventPage).events == []


async def test_every_bad_request_is_a_4xx_naming_the_field_and_changes_nothing() -> None:
    async with running() as (client, _):
        idle_body, waiting_body = setup_bodies()
        idle = await create(client, idle_body)
        waiting = await create(client, waiting_body)
        assert (await settled(client, idle)).status == "idle"
        assert (await settled(client, waiting)).status == "requires_action"
        before = await snapshot(client, [idle, waiting])
        for case in CASES:
            response = await send_case(client, case, idle=idle, waiting=waiting)
            check_error(case, response.status_code, response.content)
            assert await snapshot(client, [idle, waiting]) == before, case.name


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/sessions", {"GET", "HEAD", "POST"}),
        ("/v1/sessions/x", {"GET", "HEAD"}),
        ("/v1/sessions/x/messages", {"POST"}),
        ("/v1/openapi.json", {"GET", "HEAD"}),
    ],
)
async def test_a_method_a_path_does_not_take_is_405_listing_every_one_it_does(
    path: str, methods: set[str]
) -> None:
    async with running() as (client, _):
        for method in ("PUT", "DELETE", "OPTIONS", "PATCH"):
            response = await client.request(method, path)
            assert response.status_code == 405
            allowed = {name.strip() for name in response.headers["allow"].split(",")}
            assert allowed == methods
            assert response.json()["error"]["message"] == "Method Not Allowed"
        if "HEAD" in methods:
            assert (await client.head(path)).status_code != 405


async def test_a_body_nested_to_the_limit_is_taken_and_one_level_deeper_is_refused() -> None:
    def body(levels: int) -> dict[str, Any]:
        """A create body nesting `levels` levels deep: a history message's extra field
        (itself at level 4) holds the lists that make up the rest."""
        value: list[Any] = []
        for _ in range(levels - 4):
            value = [value]
        message = {"role": "user", "content": "hi", "x": value}
        return {"history": [{"role": "system", "content": "s"}, message], "prompt": "p1"}

    async with running() as (client, _):
        session_id = await create(client, body(MAX_JSON_DEPTH))
        info = await settled(client, session_id)
        assert (info.status, info.text) == ("idle", "echo: p1")
        refused = await client.post("/v1/sessions", json=body(MAX_JSON_DEPTH + 1))
        assert refused.status_code == 400
        error = {
            "message": f"body: the JSON nests more than {MAX_JSON_DEPTH} levels",
            "field": "body",
        }
        assert refused.json() == {"error": error}


async def send_case(
    client: httpx.AsyncClient, case: BadRequest, *, idle: str, waiting: str
) -> httpx.Response:
    path = case.path.format(idle=idle, waiting=waiting)
    body = case_body(case, idle=idle)
    if case.chunked and body is not None:
        request = client.build_request(case.method, path, headers=case.headers)
        request.stream = Chunks(body)
        return await client.send(request)
    return await client.request(case.method, path, content=body, headers=case.headers)


class Chunks(httpx.AsyncByteStream):
    """A body sent in pieces with no Content-Length. Not an async generator: the app
    stops reading it early, and a half-read generator would be left to the GC."""

    def __init__(self, body: bytes) -> None:
        self.pieces = [body[start : start + 4096] for start in range(0, len(body), 4096)]

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> bytes:
        if not self.pieces:
            raise StopAsyncIteration
        return self.pieces.pop(0)


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer", f"bearer{TOKEN}", f"Token {TOKEN}"],
)
async def test_every_route_but_health_needs_the_token(authorization: str | None) -> None:
    async with running() as (client, _):
        headers = {} if authorization is None else {"Authorization": authorization}
        bare = httpx.AsyncClient(transport=client._transport, base_url="http://service")
        async with bare:
            for method, path in [
                ("GET", "/v1/sessions"),
                ("POST", "/v1/sessions"),
                ("GET", "/v1/sessions/x"),
                ("POST", "/v1/sessions/x/messages"),
                ("GET", "/v1/metrics"),
                ("GET", "/v1/openapi.json"),
                ("GET", "/v1/nothing"),
            ]:
                response = await bare.request(method, path, headers=headers, json={"prompt": "x"})
                assert response.status_code == 401, (method, path)
                error = msgspec.json.decode(response.content, type=ErrorBody).error
                assert error.field == "Authorization"
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
            health = await bare.get("/v1/healthz", headers=headers)
            assert health.status_code == 200
            assert health.json() == {"status": "ok"}
        assert (await client.get("/v1/sessions")).json()["sessions"] == []


async def test_tool_results_resume_a_session_waiting_on_the_orchestrator() -> None:
    async with running() as (client, _):
        session_id = await create(client, {"spec": msgspec.to_builtins(ASK_SPEC), "prompt": "q"})
        info = await settled(client, session_id)
        assert info.status == "requires_action"
        assert [use.name for use in info.pending] == ["ask_human"]
        assert info.pending[0].input == {"question": "q"}
        response = await client.post(
            f"/v1/sessions/{session_id}/tool_results",
            json={"results": [{"tool_use_id": info.pending[0].id, "text": "yes"}]},
        )
        assert response.status_code == 202, response.text
        done = await settled(client, session_id)
        assert done.status == "idle"
        assert done.text == answer_for("q", "yes")


async def test_a_history_ending_in_a_call_opens_without_a_prompt_and_takes_it_after() -> None:
    history = [
        {"role": "system", "content": "Ask, then look things up."},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [ASK_CALL]},
    ]
    spec = msgspec.to_builtins(ASK_SPEC)
    async with running() as (client, host):
        refused = await client.post(
            "/v1/sessions", json={"spec": spec, "history": history, "prompt": "r"}
        )
        assert refused.status_code == 422
        error = msgspec.json.decode(refused.content, type=ErrorBody).error
        assert error.field == "prompt"
        assert "(call_ask)" in error.message
        assert "local_" not in error.message
        assert await host.sessions() == []
        # What the error says to do instead works.
        session_id = await create(client, {"spec": spec, "history": history})
        waiting = await settled(client, session_id)
        assert [use.id for use in waiting.pending] == ["call_ask"]
        posted = await client.post(
            f"/v1/sessions/{session_id}/tool_results",
            json={"results": [{"tool_use_id": "call_ask", "text": "yes"}]},
        )
        assert posted.status_code == 202, posted.text
        assert (await settled(client, session_id)).text == answer_for("q", "yes")
        message = await client.post(f"/v1/sessions/{session_id}/messages", json={"text": "r"})
        assert message.status_code == 202, message.text
        assert (await settled(client, session_id)).status == "requires_action"


async def test_a_session_id_up_to_200_url_safe_characters_is_taken_and_addressable() -> None:
    session_id = "0a.b_c-" + "x" * 193
    async with running() as (client, _):
        assert await create(client, {"session_id": session_id, "prompt": "hi"}) == session_id
        assert (await settled(client, session_id)).text == "echo: hi"
        cancelled = await client.post(f"/v1/sessions/{session_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text


async def test_a_follow_up_message_starts_a_new_episode() -> None:
    async with running() as (client, _):
        spec = msgspec.to_builtins(LOOKUP_SPEC)
        session_id = await create(client, {"spec": spec, "prompt": "one"})
        await settled(client, session_id)
        response = await client.post(f"/v1/sessions/{session_id}/messages", json={"text": "two"})
        assert response.status_code == 202, response.text
        info = await settled(client, session_id)
        assert info.text == answer_for("two")
        assert info.polls == 3


class Gate:
    """A model that blocks every call until the test opens it."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.opened = anyio.Event()

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        await self.opened.wait()
        return await chat(request)


async def test_a_full_mailbox_is_429_with_retry_after_and_queues_nothing() -> None:
    gate = Gate()
    async with running(gate, mailbox_size=1) as (client, _):
        session_id = await create(client, {"prompt": "busy"})
        await gate.entered.wait()
        first = await client.post(f"/v1/sessions/{session_id}/messages", json={"text": "a"})
        assert first.status_code == 202
        assert first.json()["queued"] == 1
        second = await client.post(f"/v1/sessions/{session_id}/messages", json={"text": "b"})
        assert second.status_code == 429
        assert int(second.headers["Retry-After"]) >= 1
        assert msgspec.json.decode(second.content, type=ErrorBody).error.message
        assert (await client.get(f"/v1/sessions/{session_id}")).json()["queued"] == 1
        gate.opened.set()
        info = await settled(client, session_id)
        assert info.text == "echo: a"


async def test_cancel_stops_a_running_session() -> None:
    gate = Gate()
    async with running(gate) as (client, _):
        session_id = await create(client, {"prompt": "stop me"})
        await gate.entered.wait()
        response = await client.post(f"/v1/sessions/{session_id}/cancel")
        assert response.status_code == 200
        assert response.json()["status"] == "cancelled"
        events = (await client.get(f"/v1/sessions/{session_id}/events")).json()["events"]
        assert events[-1]["event"]["type"] == "local.cancelled"
        again = await client.post(f"/v1/sessions/{session_id}/messages", json={"text": "x"})
        assert again.status_code == 409


async def test_a_stopped_host_answers_503() -> None:
    async with running() as (client, host):
        await host.stop(grace=0)
        response = await client.post("/v1/sessions", json={"prompt": "late"})
        assert response.status_code == 503
        assert msgspec.json.decode(response.content, type=ErrorBody).error.message


async def test_stopping_ends_long_polls_at_once_and_turns_health_to_503() -> None:
    stopping = anyio.Event()
    async with running(stopping=stopping) as (client, _):
        session_id = await create(client, {"prompt": "hi"})
        await settled(client, session_id)
        seq = (await client.get(f"/v1/sessions/{session_id}")).json()["seq"]
        polled: list[httpx.Response] = []

        async def poll() -> None:
            polled.append(
                await client.get(
                    f"/v1/sessions/{session_id}/events", params={"after": seq, "wait": 3600}
                )
            )

        async with anyio.create_task_group() as group:
            group.start_soon(poll)
            await anyio.wait_all_tasks_blocked()
            stopping.set()
        assert polled[0].status_code == 200
        assert polled[0].json() == {"events": [], "next_after": seq}
        health = await client.get("/v1/healthz")
        assert health.status_code == 503
        assert health.json() == {"status": "stopping"}


def post_scope(path: str, length: int) -> dict[str, Any]:
    """The ASGI scope of an authorized JSON POST to `path` saying `Content-Length: length`."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"service"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("service", 80),
    }


async def call_app(
    host: Host, limits: Limits, path: str, parts: list[bytes], *, then_stall: bool, pause: float
) -> tuple[int, dict[bytes, bytes], bytes]:
    """POST `parts` (the body, `pause` seconds apart) straight to the ASGI app, and then,
    with `then_stall`, never the rest; the response's status, headers and body."""
    app = create_app(host, token=TOKEN, limits=limits)
    length = sum(map(len, parts)) + (1 if then_stall else 0)
    queue = list(parts)
    sent: list[Message] = []

    async def receive() -> Message:
        if queue:
            await anyio.sleep(pause)
            part = queue.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(queue) or then_stall}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    with anyio.fail_after(20):
        await app(post_scope(path, length), receive, send)
    start, *rest = sent
    assert start["type"] == "http.response.start"
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in rest)


async def test_a_body_that_stalls_is_a_408_that_closes_the_connection() -> None:
    limits = msgspec.structs.replace(LIMITS, body_timeout_seconds=0.3)
    async with Host(chat=chat, log=MemoryLog()) as host:
        started = anyio.current_time()
        status, headers, body = await call_app(
            host, limits, "/v1/sessions", [b'{"prompt": '], then_stall=True, pause=0
        )
        waited = anyio.current_time() - started
        assert status == 408
        assert headers[b"connection"] == b"close"
        error = msgspec.json.decode(body, type=ErrorBody).error
        assert error.field == "body"
        assert "0.3 seconds" in error.message
        assert 0.3 <= waited < 5
        assert await host.sessions() == []


async def test_a_slow_body_that_arrives_in_time_is_taken() -> None:
    limits = msgspec.structs.replace(LIMITS, body_timeout_seconds=2.0)
    parts = [b'{"prompt"', b': "sl', b'ow"}']
    async with Host(chat=chat, log=MemoryLog()) as host:
        status, headers, body = await call_app(
            host, limits, "/v1/sessions", parts, then_stall=False, pause=0.1
        )
        assert status == 201, body
        assert b"connection" not in headers
        assert await host.sessions() == [msgspec.json.decode(body)["session_id"]]


class FailingLog(MemoryLog):
    """A log whose storage fails on every append."""

    async def _append(self, batch: Batch) -> None:
        raise LogError("disk full")


async def test_a_failing_log_is_503_with_its_reason() -> None:
    async with running(log=FailingLog()) as (client, _):
        response = await client.post("/v1/sessions", json={"prompt": "x"})
        assert response.status_code == 503
        assert "disk full" in response.json()["error"]["message"]
        assert (await client.get("/v1/sessions")).json()["sessions"] == []


class BrokenHost(Host):
    """A host with a bug in `status`."""

    async def status(self, session_id: str) -> SessionInfo:
        raise RuntimeError("secret internal detail")


async def test_an_unexpected_error_is_a_json_500_without_details() -> None:
    async with BrokenHost(chat=chat) as host:
        app = create_app(host, token=TOKEN)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://service",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            response = await client.get("/v1/sessions/x")
    assert response.status_code == 500
    error = msgspec.json.decode(response.content, type=ErrorBody).error
    assert "secret" not in error.message
    assert "Traceback" not in response.text


async def test_create_app_refuses_bad_settings() -> None:
    async with Host(chat=chat) as host:
        with pytest.raises(ValueError, match="ping_seconds"):
            create_app(host, token=TOKEN, ping_seconds=0)
        with pytest.raises(ValueError, match="token"):
            create_app(host, token="two words")
        with pytest.raises(ValueError, match="limits"):
            create_app(host, token=TOKEN, limits={"max_body_bytes": 1})  # type: ignore[arg-type]
        assert create_app(host, token=TOKEN, limits=Limits(max_page=5)).routes


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
FIELDS = st.sampled_from(["prompt", "spec", "max_turns", "history", "text", "results", "x"])


def json_body(fields: dict[str, Any], cut: int | None, surrogate: bool) -> bytes:
    """`fields` as JSON text, perhaps with a lone surrogate put in and perhaps cut short."""
    text = json.dumps(fields)
    if surrogate:
        text = text.replace('"', '"\\ud800', 1) if '"' in text else text
    data = text.encode()
    return data if cut is None else data[:cut]


BODIES = st.one_of(
    st.binary(max_size=64),
    st.builds(
        json_body,
        st.dictionaries(FIELDS, JSON_VALUES, max_size=3),
        st.none() | st.integers(0, 64),
        st.booleans(),
    ),
)


@settings(max_examples=60)
@given(bodies=st.lists(BODIES, min_size=1, max_size=4))
async def test_no_body_gets_anything_but_a_json_answer_below_500(bodies: list[bytes]) -> None:
    async with running() as (client, _):
        waiting = await create(client, setup_bodies()[1])
        await settled(client, waiting)
        for body in bodies:
            for path in ("/v1/sessions", f"/v1/sessions/{waiting}/messages"):
                response = await client.post(path, content=body, headers=JSON)
                assert response.status_code < 500, (body, response.text)
                if response.status_code >= 400:
                    assert msgspec.json.decode(response.content, type=ErrorBody).error.message
            response = await client.post(
                f"/v1/sessions/{waiting}/tool_results", content=body, headers=JSON
            )
            assert response.status_code < 500, (body, response.text)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_create_naming_its_id_sent_again_with_its_key_to_any_worker_is_done_once(
    postgres_url: str,
) -> None:
    async with worker(postgres_url, "a") as a, worker(postgres_url, "b") as b:
        clients = [
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(host, token="t")),
                base_url="http://w",
                headers={"Authorization": "Bearer t", "Idempotency-Key": "create-42"},
            )
            for host in (a, b)
        ]
        body = {
            "spec": msgspec.to_builtins(LOOKUP_SPEC),
            "prompt": "hello",
            "session_id": "explicit-1",
        }
        first = await clients[0].post("/v1/sessions", json=body)
        assert (first.status_code, first.json()) == (201, {"session_id": "explicit-1"})
        for client in clients:
            again = await client.post("/v1/sessions", json=body)
            assert (again.status_code, again.json()) == (201, {"session_id": "explicit-1"})
        # Another create that names the id is refused: another body with the key, or the
        # same body with none.
        other = {**body, "prompt": "something else"}
        refused = await clients[1].post("/v1/sessions", json=other)
        assert refused.status_code == 409
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(b, token="t")),
            base_url="http://w",
            headers={"Authorization": "Bearer t"},
        ) as unkeyed:
            assert (await unkeyed.post("/v1/sessions", json=body)).status_code == 409
        events = await a.events("explicit-1")
        assert [e.type for e in events].count("local.session_opened") == 1
        for client in clients:
            await client.aclose()
