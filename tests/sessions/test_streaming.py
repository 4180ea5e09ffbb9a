"""Streamed model calls through the public API, on OpenAIChat and the real streaming test
server: `run(on_delta=...)`, `poll_turn(on_delta=...)` and `Host.deltas`. Deltas are never
logged, and the log of a streamed session is the log the same session makes unstreamed,
so replay and recheck are unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from tests.providers.openai_server import (
    ChatServer,
    Gate,
    Reply,
    Streamed,
    completion,
    serve_chat,
)
from turnkeeper.core import AgentSpec, InputError, ToolSpec
from turnkeeper.events import ChatRetried, Envelope, ModelResponded, TokenDelta
from turnkeeper.providers import OpenAIChat, aclose_shared_client, with_retry
from turnkeeper.sessions import Host, Kickoff, UnknownSession, open_session, poll_turn, recheck, run
from turnkeeper.sessions._host_deltas import DELTA_BUFFER
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

LOOKUP = ToolSpec(
    "lookup",
    "Look a key up.",
    {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)
SPEC = AgentSpec(system_prompt="Look things up.", tools=(LOOKUP,))
ANSWER = "The key holds VALUE-OF-K, which is what you asked for."


def call_body(key: str) -> dict[str, Any]:
    body = completion(None, id=f"chatcmpl-{key}", created=7)
    body["choices"][0]["message"]["tool_calls"] = [
        {
            "id": f"call_{key}",
            "type": "function",
            "function": {"name": "lookup", "arguments": f'{{"key": "{key}"}}'},
        }
    ]
    body["choices"][0]["finish_reason"] = "tool_calls"
    return body


async def lookup(key: str) -> str:
    return f"VALUE-OF-{key.upper()}"


def script() -> list[Reply]:
    """A lookup, then the answer."""
    return [Reply(body=call_body("k")), Reply(body=completion(ANSWER, id="chatcmpl-a"))]


@asynccontextmanager
async def serving(*behaviours: Any) -> AsyncIterator[ChatServer]:
    async with serve_chat(*behaviours) as server:
        try:
            yield server
        finally:
            await aclose_shared_client()


def tick() -> float:
    return 1_700_000_000.0


async def run_once(
    server: ChatServer, deltas: list[TokenDelta] | None, *, chat: Any = None
) -> tuple[Any, list[Envelope]]:
    seen: list[Envelope] = []
    result = await run(
        SPEC,
        "What is in k?",
        chat or OpenAIChat(server.base_url),
        tools={"lookup": lookup},
        session_id="s1",
        clock=tick,
        on_event=seen.append,
        on_delta=None if deltas is None else deltas.append,
    )
    return result, seen


def text_of(deltas: list[TokenDelta]) -> str:
    return "".join(d.text for d in deltas if d.tool_call is None)


async def test_run_streams_each_reply_and_logs_what_it_logs_unstreamed() -> None:
    async with serving(*script(), *script()) as server:
        plain, plain_seen = await run_once(server, None)
        deltas: list[TokenDelta] = []
        streamed, seen = await run_once(server, deltas)
    assert streamed.events == plain.events
    assert seen == plain_seen == list(streamed.events)
    assert streamed.text == ANSWER
    assert replay(streamed.events) == streamed.state
    assert recheck(streamed.events) is None
    responses = [e for e in streamed.events if isinstance(e.event, ModelResponded)]
    # Each call's deltas come after the events logged before it, and only those.
    assert sorted({d.after for d in deltas}) == [e.seq - 1 for e in responses]
    first, second = ([d for d in deltas if d.after == e.seq - 1] for e in responses)
    assert next((d.tool_call, d.name) for d in first) == (0, "lookup")
    assert "".join(d.text for d in first) == '{"key": "k"}'
    assert text_of(second) == ANSWER
    assert {(d.session_id, d.attempt) for d in deltas} == {("s1", 1)}
    assert [d.index for d in second] == list(range(len(second)))
    assert not any(isinstance(e, TokenDelta) for e in seen)
    assert [r.body.get("stream") for r in server.received] == [None, None, True, True]


async def test_a_cut_stream_is_retried_and_the_log_holds_the_whole_reply() -> None:
    cut = Streamed(completion(ANSWER, id="chatcmpl-a"), cut_after=4)
    async with serving(*script(), Reply(body=call_body("k")), cut, script()[1]) as server:
        plain, _ = await run_once(server, None)
        deltas: list[TokenDelta] = []
        chat = with_retry(OpenAIChat(server.base_url), base_delay=0)
        streamed, _ = await run_once(server, deltas, chat=chat)
    retried = [e for e in streamed.events if isinstance(e.event, ChatRetried)]
    assert len(retried) == 1
    assert [e for e in streamed.events if not isinstance(e.event, ChatRetried)] == [
        Envelope(e.session_id, e.seq + (e.seq >= retried[0].seq), e.at, e.event)
        for e in plain.events
    ]
    last = [d for d in deltas if d.after == retried[0].seq - 1]
    attempts = [d.attempt for d in last]
    assert attempts == sorted(attempts)
    assert attempts[0] == 1
    assert attempts[-1] == 2
    assert 0 < len([a for a in attempts if a == 1]) < len(ANSWER)
    assert text_of([d for d in last if d.attempt == 2]) == ANSWER
    assert replay(streamed.events) == streamed.state
    assert recheck(streamed.events) is None


async def test_poll_turn_streams_its_one_model_call() -> None:
    async with serving(Reply(body=completion(ANSWER))) as server:
        state = open_session(SPEC, session_id="p1")
        deltas: list[TokenDelta] = []
        events, after = await poll_turn(
            state, Kickoff("Hi"), OpenAIChat(server.base_url), on_delta=deltas.append
        )
    assert text_of(deltas) == ANSWER
    assert {d.after for d in deltas} == {events[-1].seq - 1}
    assert after.history[-1]["content"] == ANSWER


async def test_a_host_streams_the_calls_of_a_watched_session_only() -> None:
    async with (
        serving(*script(), *script()) as server,
        Host(chat=OpenAIChat(server.base_url), tools={"lookup": lookup}) as host,
    ):
        watched = await host.start(SPEC, None, session_id="watched")
        other = await host.start(SPEC, None, session_id="other")
        await anyio.wait_all_tasks_blocked()  # both at rest: a message starts a poll
        got: list[TokenDelta] = []
        async with host.deltas(watched) as deltas:
            await host.send(watched, "What is in k?")
            info = await host.result(watched, wait=10)
            await host.send(other, "What is in k?")
            await host.result(other, wait=10)
            while True:
                try:
                    got.append(deltas.receive_nowait())
                except anyio.WouldBlock:
                    break
        assert info.text == ANSWER
        events = await host.events(watched)
        unwatched = await host.events(other)
    assert [r.body.get("stream") for r in server.received] == [True, True, None, None]
    assert {d.session_id for d in got} == {"watched"}
    assert text_of([d for d in got if d.after == events[-1].seq - 1]) == ANSWER
    # The same session, watched or not, logs the same events (but for their time).
    assert [(e.seq, e.event) for e in events] == [(e.seq, e.event) for e in unwatched]
    assert replay(events).history == replay(unwatched).history
    assert recheck(events) is None


async def test_deltas_reach_every_subscriber_as_they_come_and_end_when_the_host_stops() -> None:
    slow = Streamed(completion(ANSWER, id="chatcmpl-a"), delay=0.01, size=8)
    async with serving(slow) as server:
        host = Host(chat=OpenAIChat(server.base_url))
        async with host:
            session_id = await host.start(AgentSpec(), None)
            got: dict[int, list[TokenDelta]] = {0: [], 1: []}
            ended = []

            first = anyio.Event()

            async def watch(n: int, ready: anyio.Event) -> None:
                async with host.deltas(session_id) as deltas:
                    ready.set()
                    async for delta in deltas:
                        got[n].append(delta)
                        first.set()
                    ended.append(n)

            async with anyio.create_task_group() as group:
                for n in (0, 1):
                    ready = anyio.Event()
                    group.start_soon(watch, n, ready)
                    await ready.wait()
                await host.send(session_id, "Hi")
                # The reply is not logged yet while its first fragments arrive.
                await first.wait()
                assert not [e for e in await host.events(session_id) if e.type.endswith("response")]
                await host.result(session_id, wait=10)
                await host.stop()
    assert sorted(ended) == [0, 1]
    assert got[0] == got[1]
    assert text_of(got[0]) == ANSWER


async def test_a_subscriber_that_falls_behind_misses_the_newest_deltas() -> None:
    # Long and never repeating itself (a reply repeating one phrase gets a repair guard).
    long = " ".join(hashlib.sha256(b"%d" % n).hexdigest() for n in range(DELTA_BUFFER // 50))
    async with (
        serving(Streamed(completion(long), size=1)) as server,
        Host(chat=OpenAIChat(server.base_url)) as host,
    ):
        session_id = await host.start(AgentSpec(), None)
        async with host.deltas(session_id) as deltas:
            await host.send(session_id, "Hi")
            info = await host.result(session_id, wait=10)
            got = []
            while True:
                try:
                    got.append(deltas.receive_nowait())
                except anyio.WouldBlock:
                    break
    assert info.text == long
    assert [d.index for d in got] == list(range(DELTA_BUFFER))


async def test_watching_an_unknown_session_is_refused() -> None:
    async with Host(chat=OpenAIChat("http://127.0.0.1:9/v1")) as host:
        with pytest.raises(UnknownSession):
            async with host.deltas("nobody"):
                pass


async def test_a_call_in_flight_when_the_watch_begins_is_not_streamed() -> None:
    gate = Gate(2, Reply(body=completion(ANSWER)))
    async with serving(gate, gate) as server:
        chat = OpenAIChat(server.base_url)
        async with Host(chat=chat) as host:
            session_id = await host.start(AgentSpec(), "Hi")
            await anyio.wait_all_tasks_blocked()  # its request is at the gate
            assert len(server.received) == 1
            async with host.deltas(session_id) as deltas:
                await chat({"model": "m", "messages": [{"role": "user", "content": "open"}]})
                info = await host.result(session_id, wait=10)
                with pytest.raises(anyio.WouldBlock):
                    deltas.receive_nowait()
    assert info.text == ANSWER
    assert "stream" not in server.received[0].body


class Broke(BaseException):
    """Raised by a callback: not an Exception, and not one that stops the process."""


@pytest.mark.parametrize("kind", [RuntimeError, Broke])
async def test_a_watcher_that_raises_is_logged_and_the_reply_goes_on(
    caplog: pytest.LogCaptureFixture, kind: type[BaseException]
) -> None:
    got: list[TokenDelta] = []

    def broken(delta: TokenDelta) -> None:
        got.append(delta)
        raise kind("the watcher broke")

    async with (
        serving(Reply(body=completion(ANSWER))) as server,
        Host(chat=OpenAIChat(server.base_url)) as host,
    ):
        session_id = await host.start(AgentSpec(), None)
        await anyio.wait_all_tasks_blocked()
        async with host.watch_deltas(session_id, broken):
            await host.send(session_id, "Hi")
            info = await host.result(session_id, wait=10)
    assert info.status == "idle"
    assert info.text == ANSWER
    assert text_of(got) == ANSWER  # called for every delta, though it raised each time
    assert "deltas.watcher_failed" in caplog.text
    assert "the watcher broke" in caplog.text


@pytest.mark.parametrize("kind", [RuntimeError, Broke])
async def test_an_on_delta_that_raises_is_logged_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture, kind: type[BaseException]
) -> None:
    got: list[TokenDelta] = []

    def broken(delta: TokenDelta) -> None:
        got.append(delta)
        raise kind("the printer broke")

    async with serving(*script(), *script()) as server:
        plain, _ = await run_once(server, None)
        result = await run(
            SPEC,
            "What is in k?",
            OpenAIChat(server.base_url),
            tools={"lookup": lookup},
            session_id="s1",
            clock=tick,
            on_delta=broken,
        )
    assert result.events == plain.events
    assert text_of(got).endswith(ANSWER)  # called for every delta, though it raised each time
    assert "run.on_delta_failed" in caplog.text
    assert "the printer broke" in caplog.text


async def test_an_async_on_delta_is_refused_before_any_call() -> None:
    async def printer(delta: TokenDelta) -> None:
        pass

    async with serving(*script()) as server:
        with pytest.raises(InputError, match="on_delta: expected a plain function"):
            await run(SPEC, "What is in k?", OpenAIChat(server.base_url), on_delta=printer)
        assert server.received == []
