"""SSE framing, and the event stream over a real Host: events in order, pings when
idle, resuming after any seq, and an end when the service stops."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import msgspec
import pytest

from tests.service.server_main import LOOKUP_SPEC, chat, lookup
from tests.service.sse import parse_sse
from turnkeeper.events import Envelope, MessageReceived
from turnkeeper.service._sse import PING, follow_events, sse_event
from turnkeeper.sessions import Host


def test_an_event_carries_its_seq_type_and_envelope() -> None:
    envelope = Envelope("s1", 7, 1.5, MessageReceived(text="two\nlines"))
    frame = sse_event(envelope)
    assert frame.endswith(b"\n\n")
    (event,) = parse_sse(frame.decode().split("\n"))
    assert event.id == "7"
    assert event.event == "local.user_message"
    assert msgspec.json.decode(event.data or "", type=Envelope) == envelope
    (ping,) = parse_sse(PING.decode().split("\n"))
    assert ping.comment == "ping"


@pytest.mark.anyio
@pytest.mark.parametrize("after", [0, 3, 11])
async def test_the_stream_resumes_after_a_seq_then_pings_then_ends_on_stop(after: int) -> None:
    async with Host(chat=chat, tools={"lookup": lookup}) as host:
        session_id = await host.start(LOOKUP_SPEC, "p")
        info = await host.result(session_id, wait=10)
        assert info.seq == 11
        stopping = anyio.Event()
        frames: list[bytes] = []

        async def emit(frame: bytes) -> None:
            frames.append(frame)
            if frame == PING:
                stopping.set()

        await follow_events(
            host, session_id, emit, after=after, ping_seconds=0.01, stopping=stopping
        )
        events = list(parse_sse(b"".join(frames).decode().split("\n")))
        assert [e.id for e in events[:-1]] == [str(n) for n in range(after + 1, info.seq + 1)]
        assert events[-1].comment == "ping"
        logged = await host.events(session_id, after=after)
        assert [msgspec.json.decode(e.data or "", type=Envelope) for e in events[:-1]] == logged


@pytest.mark.anyio
async def test_the_stream_sends_events_as_they_are_logged() -> None:
    async with Host(chat=chat, tools={"lookup": lookup}) as host:
        session_id = await host.start(LOOKUP_SPEC, None)
        stopping = anyio.Event()
        seqs: list[str] = []

        async def emit(frame: bytes) -> None:
            (event,) = parse_sse(frame.decode().split("\n"))
            assert event.id is not None
            seqs.append(event.id)

        async def follow() -> None:
            await follow_events(host, session_id, emit, after=0, ping_seconds=60, stopping=stopping)

        async with anyio.create_task_group() as group:
            group.start_soon(follow)
            await anyio.wait_all_tasks_blocked()
            assert seqs == ["1"]
            await host.send(session_id, "later")
            info = await host.result(session_id, wait=10)
            while seqs[-1] != str(info.seq):
                await anyio.lowlevel.checkpoint()
            stopping.set()
        assert seqs == [str(n) for n in range(1, info.seq + 1)]
