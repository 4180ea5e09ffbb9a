"""Responses sent before the request body was read to the end say `Connection: close`."""

from __future__ import annotations

import pytest
from starlette.types import Message, Receive, Scope, Send

from turnkeeper.service._unread import CloseUnreadBodies

pytestmark = pytest.mark.anyio


async def respond(scope: Scope, receive: Receive, send: Send, *, read: int) -> None:
    """Read `read` body messages, then answer 200."""
    for _ in range(read):
        await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"1")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def run(headers: list[tuple[bytes, bytes]], chunks: list[bytes], read: int) -> Message:
    """The response start message when the app reads `read` of the body's `chunks`."""
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
        for n, chunk in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await respond(scope, receive, send, read=read)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    await CloseUnreadBodies(app)(scope, receive, send)
    return sent[0]


def closes(start: Message) -> bool:
    assert (b"x", b"1") in start["headers"]
    return (b"connection", b"close") in start["headers"]


async def test_an_unread_body_closes_the_connection() -> None:
    sized = [(b"content-length", b"4")]
    chunked = [(b"transfer-encoding", b"chunked")]
    assert closes(await run(sized, [b"ab", b"cd"], read=0))
    assert closes(await run(sized, [b"ab", b"cd"], read=1))
    assert closes(await run(chunked, [b"ab", b""], read=0))


async def test_a_body_read_to_the_end_or_no_body_keeps_it_open() -> None:
    assert not closes(await run([(b"content-length", b"4")], [b"ab", b"cd"], read=2))
    assert not closes(await run([(b"content-length", b"0")], [b""], read=0))
    assert not closes(await run([], [b""], read=0))
