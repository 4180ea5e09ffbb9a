"""Streamed replies through the HTTP service as a real subprocess: the model is the
streaming OpenAI-compatible test server, in this test's event loop, and the client reads
the session's Server-Sent Events with httpx, deltas (`event: delta`) among them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import msgspec
import pytest

from tests.providers.openai_server import ChatServer, Streamed, completion, serve_chat
from tests.service.process import ServerProcess
from tests.service.sse import SseEvent, parse_sse
from turnkeeper.events import Envelope, ModelResponded, TokenDelta
from turnkeeper.service import EventPage

pytestmark = pytest.mark.anyio

ANSWER = "Streaming, one piece at a time, from the model to the client."


def until_reply(response: httpx.Response) -> tuple[list[SseEvent], Envelope]:
    """The stream's events up to the next `local.model_response`, and that event."""
    seen: list[SseEvent] = []
    for event in parse_sse(response.iter_lines()):
        if event.comment is not None:
            continue
        if event.event == "local.model_response":
            return seen, msgspec.json.decode(event.data or "", type=Envelope)
        seen.append(event)
    raise AssertionError(f"the stream ended before a reply: {seen}")


def first_of(client: httpx.Client, session_id: str, after: int) -> SseEvent:
    """The first event or comment of the stream after seq `after`."""
    path = f"/v1/sessions/{session_id}/events/stream"
    with client.stream("GET", path, headers={"Last-Event-ID": str(after)}) as response:
        return next(parse_sse(response.iter_lines()))


def deltas_in(events: list[SseEvent]) -> list[TokenDelta]:
    found = [e for e in events if e.event == "delta"]
    assert all(e.id is None for e in found)  # a delta moves no client's Last-Event-ID
    return [msgspec.json.decode(e.data or "", type=TokenDelta) for e in found]


def watch_a_reply(
    server: ServerProcess, text: str, last_event_id: int = 1
) -> tuple[str, list[SseEvent], Envelope]:
    """Make a session, open its stream after `last_event_id`, post `text`, and read up to
    the reply: (the session's id, the events before the reply, the reply). Synchronous: a
    test runs it in a thread, its event loop serving the model meanwhile."""
    with server.client() as client:
        created = client.post("/v1/sessions", json={"spec": {"system_prompt": "Be brief."}})
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        path = f"/v1/sessions/{session_id}/events/stream"
        headers = {"Last-Event-ID": str(last_event_id)}
        with client.stream("GET", path, headers=headers) as response:
            assert response.status_code == 200
            posted = client.post(f"/v1/sessions/{session_id}/messages", json={"text": text})
            assert posted.status_code == 202, posted.text
            return session_id, *until_reply(response)


def served(model: ChatServer, tmp_path: Path) -> ServerProcess:
    """The service on `model` (started by `with`)."""
    return ServerProcess(
        tmp_path / "log.sqlite",
        stderr_path=tmp_path / "stderr.log",
        options=["--model-url", model.base_url],
    )


@pytest.mark.parametrize("last_event_id", [1, 0])
async def test_an_sse_client_gets_the_reply_as_it_streams_then_the_reply(
    tmp_path: Path, last_event_id: int
) -> None:
    reply = completion(ANSWER, id="chatcmpl-s", created=3)
    async with serve_chat(Streamed(reply, size=5, delay=0.01)) as model:
        with served(model, tmp_path) as server:
            session_id, before, response = await anyio.to_thread.run_sync(
                watch_a_reply, server, "Hi", last_event_id
            )
            with server.client() as client:
                page = client.get(f"/v1/sessions/{session_id}/events")
                logged = msgspec.json.decode(page.content, type=EventPage).events
                # Caught up after the reply: the deltas are not sent again.
                first = first_of(client, session_id, response.seq)
        assert "Traceback" not in (tmp_path / "stderr.log").read_text()
    deltas = deltas_in(before)
    # Before the reply: the events before the call (the opening too, when the client
    # began before it) and all of the reply's deltas, sent as they came.
    opening = ["local.session_opened"] if last_event_id == 0 else []
    assert [e.event for e in before if e.event != "delta"] == [*opening, "local.user_message"]
    assert len(deltas) == -(-len(ANSWER) // 5)
    assert "".join(d.text for d in deltas) == ANSWER
    assert {(d.session_id, d.after, d.attempt) for d in deltas} == {(session_id, 2, 1)}
    assert [d.index for d in deltas] == list(range(len(deltas)))
    assert response == logged[-1]
    assert isinstance(response.event, ModelResponded)
    assert response.event.message == {"role": "assistant", "content": ANSWER}
    # Logged as the server would have sent it unstreamed.
    assert msgspec.json.decode(msgspec.json.encode(response.event.response)) == reply
    assert first.comment == "ping"
    assert model.received[0].body["stream"] is True


async def test_a_cut_stream_is_retried_and_the_client_sees_the_text_start_over(
    tmp_path: Path,
) -> None:
    reply = completion(ANSWER, id="chatcmpl-c", created=4)
    script: list[Any] = [Streamed(reply, size=5, cut_after=4), Streamed(reply, size=5)]
    async with serve_chat(*script) as model:
        with served(model, tmp_path) as server:
            _, before, response = await anyio.to_thread.run_sync(watch_a_reply, server, "Hi")
    deltas = deltas_in(before)
    attempts = [d.attempt for d in deltas]
    assert attempts == sorted(attempts)
    assert set(attempts) == {1, 2}
    assert "".join(d.text for d in deltas if d.attempt == 1) == ANSWER[: 5 * (4 - 1)]
    assert "".join(d.text for d in deltas if d.attempt == 2) == ANSWER
    assert [e.event for e in before if e.event != "delta"] == [
        "local.user_message",
        "local.chat_retry",
    ]
    assert before[-1].event == "local.chat_retry"  # logged with the reply, after its deltas
    assert isinstance(response.event, ModelResponded)
    assert response.event.message["content"] == ANSWER


async def test_deltas_that_come_at_once_reach_the_client_whole_and_in_order(
    tmp_path: Path,
) -> None:
    # A character a chunk, sent back to back: the stream's frames queue faster than they
    # are written, and those waiting go out joined into one write.
    reply = completion(ANSWER * 4, id="chatcmpl-m", created=5)
    async with serve_chat(Streamed(reply, size=1)) as model:
        with served(model, tmp_path) as server:
            session_id, before, response = await anyio.to_thread.run_sync(
                watch_a_reply, server, "Hi"
            )
            with server.client() as client:
                # Resumed after the user's message: the reply again, and no delta.
                first = first_of(client, session_id, response.seq - 1)
    deltas = deltas_in(before)
    assert [d.index for d in deltas] == list(range(len(ANSWER * 4)))
    assert "".join(d.text for d in deltas) == ANSWER * 4
    assert isinstance(response.event, ModelResponded)
    assert response.event.message["content"] == ANSWER * 4
    assert (first.event, first.id) == ("local.model_response", str(response.seq))
